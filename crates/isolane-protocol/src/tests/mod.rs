mod alloc;
mod examples;
mod fuzz;
