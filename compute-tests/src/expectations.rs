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
pub const EXPECTATIONS: &[Expectation] = &[
    Expectation {
        backend: "wgpu",
        test: "ir_types_bool_logic",
        reason: "WGSL storage buffers cannot hold bool and compute-wgpu does not yet emulate byte-sized elements",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_types_scalar_every_elem",
        reason: "bool, 8/16-bit integer and bf16 buffers are not emulated in WGSL yet",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_arith_i32",
        reason: "the test writes comparison results to a bool buffer, which WGSL storage cannot hold",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_arith_u32",
        reason: "the test writes comparison results to a bool buffer, which WGSL storage cannot hold",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_arith_i64",
        reason: "the test writes comparison results to a bool buffer, which WGSL storage cannot hold",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_arith_u64",
        reason: "the test writes comparison results to a bool buffer, which WGSL storage cannot hold",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_types_f16_arith",
        reason: "the test writes comparison results to a bool buffer, which WGSL storage cannot hold",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_types_f32_arith",
        reason: "the test writes comparison results to a bool buffer, which WGSL storage cannot hold",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_types_f64_arith",
        reason: "the test writes comparison results to a bool buffer, which WGSL storage cannot hold",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_arith_cast_float_to_int",
        reason: "casts to i8/i16/u8/u16 need byte-sized elements, not emulated in WGSL yet",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_control_range_steps",
        reason: "the test covers u8 counters, not emulated in WGSL yet",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_types_vector_widths",
        reason: "WGSL vectors have 2 to 4 components; widths 8 and 16 are not lowered to arrays yet",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_math_f64",
        reason: "f64 `round` on lavapipe does not round half to even (round(1.5) == 1)",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_math_f16",
        reason: "lavapipe's f16 exp is outside the test's 2e-3 relative tolerance (exp(10): 2.1952e4 vs 2.2032e4)",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_memory_atomic_wide_and_float",
        reason: "WGSL has 32-bit integer atomics only; 64-bit and float atomics are not emulated",
    },
    Expectation {
        backend: "wgpu",
        test: "ir_metadata_buffer_len",
        reason: "the test queries the length of a u8 buffer, a type WGSL storage cannot hold yet",
    },
];

/// The expectation for `test` on `backend`, if any.
pub fn lookup(backend: &str, test: &str) -> Option<&'static Expectation> {
    EXPECTATIONS
        .iter()
        .find(|e| e.backend == backend && e.test == test)
}
