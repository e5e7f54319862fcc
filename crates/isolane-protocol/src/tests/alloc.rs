//! This crate's test binary counts each thread's allocations (isolane_core::fuzz::alloc), so
//! that the fuzz targets can check that decoding allocates in proportion to the body and the
//! tensor limit, never to the sizes a body claims.

pub use isolane_core::fuzz::alloc::peak_during;

#[global_allocator]
static COUNTING: isolane_core::fuzz::alloc::ThreadCounting =
    isolane_core::fuzz::alloc::ThreadCounting;

#[test]
fn the_counter_sees_a_large_allocation() {
    let (v, peak) = peak_during(|| vec![1u8; 1 << 20]);
    assert_eq!(v.len(), 1 << 20);
    assert!(peak >= 1 << 20, "{peak}");
    let ((), peak) = peak_during(|| {});
    assert!(peak < 1024, "{peak}");
}
