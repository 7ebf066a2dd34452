//! # compute-tests
//!
//! The conformance suite: every test is written once, generic over `R: Runtime`, and
//! [`conformance_suite!`] instantiates the whole list as `#[test]`s in one module per backend.
//! A backend whose driver is absent makes its tests fail with the reason (they never pass
//! silently); `cargo xtask test-all` probes first and reports such a backend as skipped.
//! Tests a backend cannot pass are declared, with a reason, in [`expectations`].

pub mod backends;
pub mod bench;
pub mod example;
pub mod expectations;
pub mod kernels;
pub mod suite;
pub mod util;
pub mod world;

use compute_core::{ComputeClient, Runtime};

/// Run one conformance test on the default device of `R`, honouring the expectations table.
///
/// # Panics
/// Panics (fails the test) when the backend is unavailable, when the test fails without an
/// expectation, or when a test expected to fail passes.
pub fn run_conformance<R: Runtime>(name: &str, test: fn(ComputeClient<R>)) {
    if let Err(reason) = R::availability() {
        panic!(
            "backend {} is unavailable here ({reason}); `cargo xtask test-all` reports it as skipped",
            R::name()
        );
    }
    let client = ComputeClient::<R>::load(&R::Device::default());
    run_expected(name, test, client);
    backends::after_test(R::name(), name);
}

fn run_expected<R: Runtime>(name: &str, test: fn(ComputeClient<R>), client: ComputeClient<R>) {
    match expectations::lookup(R::name(), name) {
        None => test(client),
        Some(expectation) => {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(client)));
            assert!(
                outcome.is_err(),
                "{}::{name} is declared to fail ({}) but passed: remove its expectation",
                R::name(),
                expectation.reason
            );
            // It failed as declared: what it checks does not hold here, so it is no pass.
            compute_core::env::report_reduced(&format!(
                "declared to fail on {} (compute-tests expectations): {}",
                R::name(),
                expectation.reason
            ));
        }
    }
}

/// Instantiate the whole suite for one backend: `conformance_suite!(cpu, compute::cpu::CpuRuntime);`
/// makes a module `cpu` with one `#[test]` per conformance test.
#[macro_export]
macro_rules! conformance_suite {
    ($module:ident, $runtime:ty) => {
        $crate::for_each_test!($crate::__instantiate_tests, $module, $runtime);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __instantiate_tests {
    ($module:ident, $runtime:ty, $($group:ident :: $test:ident),* $(,)?) => {
        mod $module {
            $(
                #[test]
                fn $test() {
                    $crate::run_conformance::<$runtime>(
                        stringify!($test),
                        $crate::suite::$group::$test::<$runtime>,
                    );
                }
            )*
        }
    };
}
