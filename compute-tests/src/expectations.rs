//! Tests a backend is known not to pass, each with its reason, in the style of wgpu's test
//! expectations. A declared test still runs: it must fail, and passing is reported so the entry
//! gets removed. Do not weaken or delete a test instead of declaring it here.

/// One declared expectation.
#[derive(Debug, Clone, Copy)]
pub struct Expectation {
    /// Backend name (`Runtime::name`).
    pub backend: &'static str,
    /// Test name.
    pub test: &'static str,
    /// Why the backend cannot pass it.
    pub reason: &'static str,
}

/// The table.
pub const EXPECTATIONS: &[Expectation] = &[];

/// The expectation for `test` on `backend`, if any.
pub fn lookup(backend: &str, test: &str) -> Option<&'static Expectation> {
    EXPECTATIONS
        .iter()
        .find(|e| e.backend == backend && e.test == test)
}
