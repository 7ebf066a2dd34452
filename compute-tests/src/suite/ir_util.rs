//! Helpers shared by the kernel-IR conformance tests (the `ir_*` groups): uploads, launches,
//! read-backs, comparisons with a stated tolerance, feature gating and host references that `std`
//! lacks (`erf`).

use core::fmt::Debug;

use compute_core::kernel::KernelDefinition;
use compute_core::{
    Bytes, ComputeClient, CubeCount, Elem, ElemType, Handle, KernelArguments, Runtime, ServerError,
};

/// A buffer holding `data`.
pub fn upload<R: Runtime, T: Elem>(client: &ComputeClient<R>, data: &[T]) -> Handle {
    client.create(Bytes::from_elem_slice(data))
}

/// A zero-filled buffer of `n` elements of `T`.
pub fn zeros<R: Runtime, T: Elem>(client: &ComputeClient<R>, n: usize) -> Handle {
    client.create(Bytes::zeroed(n * core::mem::size_of::<T>()))
}

/// Read a buffer back as elements of `T`, panicking with the server's error.
pub fn download<R: Runtime, T: Elem>(client: &ComputeClient<R>, handle: &Handle) -> Vec<T> {
    client
        .read_one(handle.clone())
        .unwrap_or_else(|e| panic!("reading the result failed: {e}"))
        .to_elems::<T>()
}

/// Launch `def` (checked) over `cubes` cubes.
pub fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    def: &KernelDefinition,
    cubes: [u32; 3],
    args: KernelArguments,
) {
    client.launch(
        def.clone().into(),
        CubeCount::Static(cubes[0], cubes[1], cubes[2]),
        args,
    );
}

/// Build a kernel, panicking with the build error (a test kernel that does not build is a bug in
/// the builder or in the test).
pub fn build(k: compute_core::kernel::KernelBuilder) -> KernelDefinition {
    k.build()
        .unwrap_or_else(|e| panic!("test kernel does not build: {e}"))
}

/// Whether a backend error is the clear "not supported here" report a test expects when a
/// feature is missing.
pub fn is_unsupported_error(e: &ServerError) -> bool {
    matches!(e, ServerError::Unsupported(_) | ServerError::Compilation(_))
}

/// Gate a test on a feature, after its kernel was launched.
///
/// Returns `true` when `supported`: the test goes on to check values. Otherwise asserts that the
/// launch was reported as an error ([`ServerError::Unsupported`] or
/// [`ServerError::Compilation`]) by `flush`, reports the test as a reduced run (the matrix
/// counts it as skipped, with the missing feature as its reason: its values were not checked
/// for that case), and returns `false`.
pub fn feature_gate<R: Runtime>(client: &ComputeClient<R>, supported: bool, what: &str) -> bool {
    if supported {
        return true;
    }
    compute_core::env::report_reduced(&format!("{} lacks {what}", R::name()));
    match client.flush() {
        Ok(()) => panic!(
            "{} lacks {what} but launching a kernel that uses it reported no error",
            R::name()
        ),
        Err(e) => assert!(
            is_unsupported_error(&e),
            "{} lacks {what}: expected an Unsupported or Compilation error, got {e:?}",
            R::name()
        ),
    }
    false
}

/// Whether the backend declares every element type of `elems`.
pub fn supports_all<R: Runtime>(client: &ComputeClient<R>, elems: &[ElemType]) -> bool {
    elems.iter().all(|&e| client.features().supports(e))
}

/// Assert two sequences are equal, reporting the first mismatches with their index.
pub fn assert_same<T: PartialEq + Debug>(got: &[T], expected: &[T], what: &str) {
    assert_eq!(
        got.len(),
        expected.len(),
        "{what}: result length {} != expected {}",
        got.len(),
        expected.len()
    );
    let bad: Vec<String> = got
        .iter()
        .zip(expected)
        .enumerate()
        .filter(|(_, (g, e))| g != e)
        .take(8)
        .map(|(i, (g, e))| format!("[{i}] got {g:?}, expected {e:?}"))
        .collect();
    let total = got.iter().zip(expected).filter(|(g, e)| g != e).count();
    assert!(
        bad.is_empty(),
        "{what}: {total} mismatches, first: {}",
        bad.join("; ")
    );
}

/// Assert `|got - expected| <= abs + rel * |expected|` for each pair (a NaN must match a NaN,
/// infinities must match exactly). `label(i)` describes entry `i` in the failure message.
pub fn assert_close_by(
    got: &[f64],
    expected: &[f64],
    rel: f64,
    abs: f64,
    what: &str,
    label: impl Fn(usize) -> String,
) {
    assert_eq!(got.len(), expected.len(), "{what}: result length");
    let mut bad = Vec::new();
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        let ok = if e.is_nan() {
            g.is_nan()
        } else if e.is_infinite() {
            g == e
        } else {
            (g - e).abs() <= abs + rel * e.abs()
        };
        if !ok {
            bad.push(format!("{}: got {g:e}, expected {e:e}", label(i)));
        }
    }
    assert!(
        bad.is_empty(),
        "{what} (tolerance rel {rel:e}, abs {abs:e}): {} mismatches, first: {}",
        bad.len(),
        bad.iter().take(8).cloned().collect::<Vec<_>>().join("; ")
    );
}

/// [`assert_close_by`] with entries labelled by index.
pub fn assert_close(got: &[f64], expected: &[f64], rel: f64, abs: f64, what: &str) {
    assert_close_by(got, expected, rel, abs, what, |i| format!("[{i}]"));
}

/// A host float type of the IR, converted through `f64` for references and comparisons.
pub trait HostFloat: Elem + Copy {
    /// The value as `f64` (exact).
    fn to_f64(self) -> f64;
    /// The nearest value of this type (round to nearest even).
    fn from_f64(v: f64) -> Self;
}

impl HostFloat for f32 {
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
}

impl HostFloat for f64 {
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
}

impl HostFloat for half::f16 {
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        half::f16::from_f64(v)
    }
}

impl HostFloat for half::bf16 {
    fn to_f64(self) -> f64 {
        half::bf16::to_f64(self)
    }
    fn from_f64(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
}

/// The error function in `f64`, accurate to about 1e-14 (Taylor series below 3, continued
/// fraction of `erfc` above).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 3.0 {
        // erf(a) = 2/sqrt(pi) * sum_n (-1)^n a^(2n+1) / (n! (2n+1))
        let mut term = a;
        let mut sum = a;
        let a2 = a * a;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -a2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * core::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(a) = exp(-a^2)/sqrt(pi) * 1/(a + 1/2/(a + 1/(a + 3/2/(a + 2/(a + ...)))))
        let mut f = a;
        for k in (1..60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / core::f64::consts::PI.sqrt() / f
    };
    if x < 0.0 { -r } else { r }
}

/// Round half to even, on the host.
pub fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_erf_matches_known_values() {
        let known = [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
        ];
        for (x, e) in known {
            assert!((erf(x) - e).abs() < 1e-13, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + e).abs() < 1e-13);
        }
    }

    #[test]
    fn host_round_half_even() {
        for (x, e) in [
            (0.5, 0.0),
            (1.5, 2.0),
            (2.5, 2.0),
            (-2.5, -2.0),
            (2.4, 2.0),
            (-3.5, -4.0),
        ] {
            assert_eq!(round_half_even(x), e, "{x}");
        }
    }
}
