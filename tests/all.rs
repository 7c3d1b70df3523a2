//! troupe's integration tests, in one binary so they link once.
#![forbid(unsafe_code)]
// Test code: a failed step should stop the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Counts live heap bytes, so leak tests measure allocations rather than RSS.
#[global_allocator]
static ALLOC: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

/// Live heap bytes of this test process.
pub fn allocated() -> usize {
    ALLOC.allocated()
}

mod suite;
