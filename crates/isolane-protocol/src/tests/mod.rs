mod alloc;
mod examples;
// Its strategies and checks serve the gRPC targets too (grpc/tests.rs).
pub(crate) mod fuzz;
