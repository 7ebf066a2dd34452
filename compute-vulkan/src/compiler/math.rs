//! Float math routines emitted inline.
//!
//! `GLSL.std.450` accepts only 16- and 32-bit floats for its transcendental functions and promises
//! little precision for them (exp: `3 + 2|x|` ulp; log, sin, cos: absolute errors of `2^-21` to
//! `2^-11`), so every float type gets its own routines (`f16` and `bf16` compute in `f32`),
//! accurate to a few ulps over the usual ranges:
//! - exp: `k = round(x / ln 2)`, `r = x - k ln 2` with a two-part `ln 2` (exact products), a
//!   Taylor polynomial on `|r| <= 0.35`, then `2^k` applied as two exact power-of-two factors (so
//!   subnormal results round once);
//! - pow: `exp(y log |x|)` (for `f32` through the `f64` routines when the device has `f64`), sign
//!   and special cases handled around it;
//! - log: exponent and mantissa from the bits (subnormals pre-scaled), the mantissa in
//!   `[sqrt(1/2), sqrt(2))`, `log(m) = 2 atanh(s)`, `s = (m - 1) / (m + 1)`, a series in `s^2`;
//! - sin, cos: `k = round(x * 2 / pi)`, a Cody-Waite reduction by `pi / 2` in parts with exact
//!   products (accurate while `k` fits the parts' spare bits: `|x|` up to about `1e6` for `f64`,
//!   `1e5` for `f32`), Taylor polynomials on `[-pi/4, pi/4]`, the quadrant from `k mod 4`;
//! - tanh: `expm1(2|x|) / (expm1(2|x|) + 2)` with a Taylor `expm1` below `|x| < 0.625`,
//!   `1 - 2 / (exp(2|x|) + 1)` above, the sign restored;
//! - log1p: `u = 1 + x`, `log(u) * x / (u - 1)` (exact where `u - 1 == 0`: `x`);
//! - erf: `2/sqrt(pi) e^{-x^2} sum 2^n x^{2n+1} / (2n+1)!!` (every term positive, no
//!   cancellation) in a counted loop, 1 past `|x| >= 6` (`f64`) or `4` (`f32`);
//! - the float remainder (`fmod`, exact): `|x|` reduced by `|y| 2^k` (largest fitting `k`, from
//!   `FrexpStruct`/`Ldexp`), one exact subtraction per binade, the sign of `x`.

use compute_core::ServerError;
use compute_core::kernel::UnaryOp;
use spirv::Op;

use super::emit::Emitter;
use super::words::gl;

// Cody-Waite constants whose leading parts have trailing zero bits, so `k * part` is exact for
// the `k` that occur (no reliance on a fused multiply-add: `GLSL.std.450 Fma` may be unfused).
/// `ln 2`, high 32 bits.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
/// `ln 2 - LN2_HI`.
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// `pi / 2` in three 33-bit parts and a tail.
const PIO2_1: f64 = f64::from_bits(0x3FF9_21FB_5440_0000);
const PIO2_2: f64 = f64::from_bits(0x3DD0_B461_1A60_0000);
const PIO2_3: f64 = f64::from_bits(0x3BA3_198A_2E00_0000);
const PIO2_3T: f64 = f64::from_bits(0x397B_839A_2520_49C1);
/// `pi / 2` in f32 parts (8, 11 bits and the rest), as Cephes' `sinf`.
const PIO2_F32: [f64; 3] = [
    1.5703125,
    4.837_512_969_970_703e-4,
    7.549_789_954_891_882e-8,
];

/// `1 / n!` for `n` in `0..=max`, alternating in sign when `alt`, every `step`-th from `first`.
fn inv_factorials(first: u32, step: u32, count: usize, alt: bool) -> Vec<f64> {
    let mut out = Vec::with_capacity(count);
    let mut n = first;
    for i in 0..count {
        let mut f = 1.0f64;
        for k in 2..=n {
            f *= f64::from(k);
        }
        let sign = if alt && i % 2 == 1 { -1.0 } else { 1.0 };
        out.push(sign / f);
        n += step;
    }
    out
}

impl Emitter<'_> {
    fn fty(&mut self, mb: u32) -> u32 {
        self.m.t_float(mb)
    }

    fn c(&mut self, mb: u32, v: f64) -> u32 {
        self.m.c_float(mb, v)
    }

    /// A float operation the driver must neither contract nor reassociate (`NoContraction`:
    /// the routines rely on exact steps like `(1 + x) - 1` and Cody-Waite reductions).
    fn f2(&mut self, op: Op, mb: u32, a: u32, b: u32) -> u32 {
        let t = self.fty(mb);
        let id = self.op(op, t, &[a, b]);
        self.m.decorate(id, spirv::Decoration::NoContraction, &[]);
        id
    }

    /// `x - k * c`, exact when `k * c` is.
    fn reduce(&mut self, mb: u32, x: u32, k: u32, c: f64) -> u32 {
        let cc = self.c(mb, c);
        let p = self.f2(Op::FMul, mb, k, cc);
        self.f2(Op::FSub, mb, x, p)
    }

    fn ffma(&mut self, mb: u32, a: u32, b: u32, c: u32) -> u32 {
        let t = self.fty(mb);
        self.gl(t, gl::FMA, &[a, b, c])
    }

    fn sel(&mut self, mb: u32, c: u32, a: u32, b: u32) -> u32 {
        let t = self.fty(mb);
        self.op(Op::Select, t, &[c, a, b])
    }

    fn fcmp(&mut self, op: Op, a: u32, b: u32) -> u32 {
        let bt = self.m.t_bool();
        self.op(op, bt, &[a, b])
    }

    /// `sum coeffs[i] x^i` by Horner's rule (fused).
    fn horner(&mut self, mb: u32, x: u32, coeffs: &[f64]) -> u32 {
        let mut acc = self.c(mb, coeffs[coeffs.len() - 1]);
        for &k in coeffs[..coeffs.len() - 1].iter().rev() {
            let ck = self.c(mb, k);
            acc = self.ffma(mb, acc, x, ck);
        }
        acc
    }

    /// A float math function on a value of the compute type (`mb` = 32 or 64 bits).
    pub fn math_unary(&mut self, op: UnaryOp, mb: u32, x: u32) -> Result<u32, ServerError> {
        let t = self.fty(mb);
        Ok(match op {
            UnaryOp::Rsqrt => {
                let s = self.gl(t, gl::SQRT, &[x]);
                let one = self.c(mb, 1.0);
                self.f2(Op::FDiv, mb, one, s)
            }
            UnaryOp::Exp => self.exp_(mb, x),
            UnaryOp::Log => self.log_(mb, x),
            UnaryOp::Sin | UnaryOp::Cos => self.sincos(mb, x, op == UnaryOp::Sin),
            UnaryOp::Tanh => self.tanh_(mb, x),
            UnaryOp::Log1p => {
                let one = self.c(mb, 1.0);
                let u = self.f2(Op::FAdd, mb, one, x);
                let d = self.f2(Op::FSub, mb, u, one);
                let l = self.log_(mb, u);
                let q = self.f2(Op::FDiv, mb, x, d);
                let r = self.f2(Op::FMul, mb, l, q);
                let z = self.c(mb, 0.0);
                let exact = self.fcmp(Op::FOrdEqual, d, z);
                self.sel(mb, exact, x, r)
            }
            UnaryOp::Erf => self.erf_(mb, x),
            other => return Err(self.bad(format!("{} is not a math routine", other.name()))),
        })
    }

    /// `e^x` (own routine for both widths: `GLSL.std.450 Exp` only promises `3 + 2|x|` ulp).
    pub fn exp_(&mut self, mb: u32, x: u32) -> u32 {
        let t = self.fty(mb);
        // (clamp range, overflow and underflow thresholds, ln 2 split, Taylor terms)
        let (lo, hi, ovf, unf, ln2, terms) = if mb == 64 {
            (
                -746.0,
                710.0,
                709.782_712_893_384,
                -745.133_219_101_941_2,
                (LN2_HI, LN2_LO),
                15,
            )
        } else {
            (
                -104.0,
                89.0,
                88.722_835,
                -103.972_08,
                (0.693_359_375, -2.121_944_400_546_905_8e-4),
                9,
            )
        };
        let clo = self.c(mb, lo);
        let chi = self.c(mb, hi);
        let xc = self.gl(t, gl::FMAX, &[x, clo]);
        let xc = self.gl(t, gl::FMIN, &[xc, chi]);
        let l2e = self.c(mb, core::f64::consts::LOG2_E);
        let kx = self.f2(Op::FMul, mb, xc, l2e);
        let k = self.gl(t, gl::ROUND_EVEN, &[kx]);
        let r = self.reduce(mb, xc, k, ln2.0);
        let r = self.reduce(mb, r, k, ln2.1);
        let coeffs = inv_factorials(0, 1, terms, false);
        let p = self.horner(mb, r, &coeffs);
        let i32t = self.m.t_int(32);
        let ki = self.op(Op::ConvertFToS, i32t, &[k]);
        let one = self.m.c_u32(1);
        let k1 = self.op(Op::ShiftRightArithmetic, i32t, &[ki, one]);
        let k2 = self.op(Op::ISub, i32t, &[ki, k1]);
        let s1 = self.pow2(mb, k1);
        let s2 = self.pow2(mb, k2);
        let r = self.f2(Op::FMul, mb, p, s1);
        let r = self.f2(Op::FMul, mb, r, s2);
        let ovf = self.c(mb, ovf);
        let unf = self.c(mb, unf);
        let inf = self.c(mb, f64::INFINITY);
        let zero = self.c(mb, 0.0);
        let big = self.fcmp(Op::FOrdGreaterThan, x, ovf);
        let small = self.fcmp(Op::FOrdLessThan, x, unf);
        let r = self.sel(mb, big, inf, r);
        let r = self.sel(mb, small, zero, r);
        let bt = self.m.t_bool();
        let nan = self.op(Op::IsNan, bt, &[x]);
        self.sel(mb, nan, x, r)
    }

    /// `2^k` for an `i32` `k` in the normal exponent range of the float type.
    fn pow2(&mut self, mb: u32, k: u32) -> u32 {
        let i32t = self.m.t_int(32);
        let f = self.fty(mb);
        if mb == 32 {
            let bias = self.m.c_u32(127);
            let e = self.op(Op::IAdd, i32t, &[k, bias]);
            let s = self.m.c_u32(23);
            let b = self.op(Op::ShiftLeftLogical, i32t, &[e, s]);
            return self.op(Op::Bitcast, f, &[b]);
        }
        let i64t = self.m.t_int(64);
        let bias = self.m.c_u32(1023);
        let e = self.op(Op::IAdd, i32t, &[k, bias]);
        let e = self.op(Op::SConvert, i64t, &[e]);
        let s = self.m.c_int(64, 52);
        let b = self.op(Op::ShiftLeftLogical, i64t, &[e, s]);
        self.op(Op::Bitcast, f, &[b])
    }

    /// Natural logarithm (own routine for both widths: `GLSL.std.450 Log` only promises an
    /// absolute error of `2^-21` near 1, too coarse for `log1p`).
    pub fn log_(&mut self, mb: u32, x: u32) -> u32 {
        let t = self.fty(mb);
        let i32t = self.m.t_int(32);
        let ut = self.m.t_int(mb);
        let bt = self.m.t_bool();
        // (mantissa bits, exponent mask, bias, subnormal pre-scale, series terms, ln 2 parts)
        let (mant_bits, emask, bias, pre, terms, ln2) = if mb == 64 {
            (52u32, 0x7ffu64, 1023u32, 54u32, 12, (LN2_HI, LN2_LO))
        } else {
            // ln 2 as Cephes' logf: 0.693359375 (9 bits) + the rest.
            (
                23,
                0xff,
                127,
                24,
                6,
                (0.693_359_375, -2.121_944_400_546_905_8e-4),
            )
        };
        let min_normal = if mb == 64 {
            f64::MIN_POSITIVE
        } else {
            f64::from(f32::MIN_POSITIVE)
        };
        let min_normal = self.c(mb, min_normal);
        let tiny = self.fcmp(Op::FOrdLessThan, x, min_normal);
        let scale = self.c(mb, 2f64.powi(pre as i32));
        let xs = self.f2(Op::FMul, mb, x, scale);
        let xs = self.sel(mb, tiny, xs, x);
        let b = self.op(Op::Bitcast, ut, &[xs]);
        let sh = self.m.c_int(mb, u64::from(mant_bits));
        let eb = self.op(Op::ShiftRightLogical, ut, &[b, sh]);
        let em = self.m.c_int(mb, emask);
        let eb = self.op(Op::BitwiseAnd, ut, &[eb, em]);
        let e = if mb == 64 {
            self.op(Op::UConvert, i32t, &[eb])
        } else {
            eb
        };
        let cb = self.m.c_u32(bias);
        let e = self.op(Op::ISub, i32t, &[e, cb]);
        let cpre = self.m.c_u32(pre);
        let c0 = self.m.c_u32(0);
        let adj = self.op(Op::Select, i32t, &[tiny, cpre, c0]);
        let e = self.op(Op::ISub, i32t, &[e, adj]);
        let mant = self.m.c_int(mb, (1u64 << mant_bits) - 1);
        let one_bits = self.m.c_int(mb, u64::from(bias) << mant_bits);
        let mbits = self.op(Op::BitwiseAnd, ut, &[b, mant]);
        let mbits = self.op(Op::BitwiseOr, ut, &[mbits, one_bits]);
        let m = self.op(Op::Bitcast, t, &[mbits]);
        let sqrt2 = self.c(mb, core::f64::consts::SQRT_2);
        let big = self.fcmp(Op::FOrdGreaterThan, m, sqrt2);
        let half = self.c(mb, 0.5);
        let mh = self.f2(Op::FMul, mb, m, half);
        let m = self.sel(mb, big, mh, m);
        let c1 = self.m.c_u32(1);
        let e1 = self.op(Op::IAdd, i32t, &[e, c1]);
        let e = self.op(Op::Select, i32t, &[big, e1, e]);
        let one = self.c(mb, 1.0);
        let f = self.f2(Op::FSub, mb, m, one);
        let d = self.f2(Op::FAdd, mb, m, one);
        let s = self.f2(Op::FDiv, mb, f, d);
        let s2 = self.f2(Op::FMul, mb, s, s);
        let coeffs: Vec<f64> = (0..terms).map(|k| 2.0 / f64::from(2 * k + 1)).collect();
        let p = self.horner(mb, s2, &coeffs);
        let lm = self.f2(Op::FMul, mb, s, p);
        let ef = self.op(Op::ConvertSToF, t, &[e]);
        // e * ln2_hi is exact; the small parts are summed first.
        let ll = self.c(mb, ln2.1);
        let lo = self.f2(Op::FMul, mb, ef, ll);
        let lo = self.f2(Op::FAdd, mb, lo, lm);
        let lh = self.c(mb, ln2.0);
        let hi = self.f2(Op::FMul, mb, ef, lh);
        let r = self.f2(Op::FAdd, mb, hi, lo);
        let inf = self.c(mb, f64::INFINITY);
        let ninf = self.c(mb, f64::NEG_INFINITY);
        let nan = self.c(mb, f64::NAN);
        let zero = self.c(mb, 0.0);
        let is_inf = self.fcmp(Op::FOrdEqual, x, inf);
        let is_zero = self.fcmp(Op::FOrdEqual, x, zero);
        let neg = self.fcmp(Op::FOrdLessThan, x, zero);
        let xnan = self.op(Op::IsNan, bt, &[x]);
        let bad = self.op(Op::LogicalOr, bt, &[neg, xnan]);
        let r = self.sel(mb, is_inf, inf, r);
        let r = self.sel(mb, is_zero, ninf, r);
        self.sel(mb, bad, nan, r)
    }

    /// `sin x` or `cos x` (`mb` = 32 or 64 bits).
    fn sincos(&mut self, mb: u32, x: u32, sin: bool) -> u32 {
        let t = self.fty(mb);
        let i32t = self.m.t_int(32);
        let bt = self.m.t_bool();
        let two_pi = self.c(mb, core::f64::consts::FRAC_2_PI);
        let kx = self.f2(Op::FMul, mb, x, two_pi);
        let k = self.gl(t, gl::ROUND_EVEN, &[kx]);
        let r = if mb == 64 {
            let r = self.reduce(64, x, k, PIO2_1);
            let r = self.reduce(64, r, k, PIO2_2);
            let r = self.reduce(64, r, k, PIO2_3);
            self.reduce(64, r, k, PIO2_3T)
        } else {
            let r = self.reduce(32, x, k, PIO2_F32[0]);
            let r = self.reduce(32, r, k, PIO2_F32[1]);
            self.reduce(32, r, k, PIO2_F32[2])
        };
        let r2 = self.f2(Op::FMul, mb, r, r);
        let (ns, nc) = if mb == 64 { (9, 10) } else { (6, 7) };
        let sc = inv_factorials(1, 2, ns, true);
        let sp = self.horner(mb, r2, &sc);
        let s = self.f2(Op::FMul, mb, r, sp);
        let cc = inv_factorials(0, 2, nc, true);
        let c = self.horner(mb, r2, &cc);
        // The quadrant: k mod 4 (k clamped so the conversion stays defined; past the clamp the
        // reduction is meaningless anyway).
        let lim = if mb == 64 { 9.0e15 } else { 1.0e9 };
        let big = self.c(mb, lim);
        let nbig = self.c(mb, -lim);
        let kc = self.gl(t, gl::FMIN, &[k, big]);
        let kc = self.gl(t, gl::FMAX, &[kc, nbig]);
        let q = if mb == 64 {
            let i64t = self.m.t_int(64);
            let k64 = self.op(Op::ConvertFToS, i64t, &[kc]);
            self.op(Op::UConvert, i32t, &[k64])
        } else {
            self.op(Op::ConvertFToS, i32t, &[kc])
        };
        // cos(x) = sin(x + pi/2): shift the quadrant by one.
        let q = if sin {
            q
        } else {
            let one = self.m.c_u32(1);
            self.op(Op::IAdd, i32t, &[q, one])
        };
        let one = self.m.c_u32(1);
        let two = self.m.c_u32(2);
        let zero = self.m.c_u32(0);
        let odd = self.op(Op::BitwiseAnd, i32t, &[q, one]);
        let odd = self.op(Op::INotEqual, bt, &[odd, zero]);
        let neg = self.op(Op::BitwiseAnd, i32t, &[q, two]);
        let neg = self.op(Op::INotEqual, bt, &[neg, zero]);
        // Quadrant q: sin r, cos r, -sin r, -cos r.
        let v = self.sel(mb, odd, c, s);
        let nv = self.op(Op::FNegate, t, &[v]);
        self.sel(mb, neg, nv, v)
    }

    /// Hyperbolic tangent.
    fn tanh_(&mut self, mb: u32, x: u32) -> u32 {
        let t = self.fty(mb);
        let a = self.gl(t, gl::FABS, &[x]);
        let a2 = self.f2(Op::FAdd, mb, a, a);
        let n = if mb == 64 { 22 } else { 13 };
        let coeffs = inv_factorials(1, 1, n, false);
        let p = self.horner(mb, a2, &coeffs);
        let em = self.f2(Op::FMul, mb, a2, p);
        let two = self.c(mb, 2.0);
        let one = self.c(mb, 1.0);
        let d = self.f2(Op::FAdd, mb, em, two);
        let small = self.f2(Op::FDiv, mb, em, d);
        let e = self.exp_(mb, a2);
        let e1 = self.f2(Op::FAdd, mb, e, one);
        let q = self.f2(Op::FDiv, mb, two, e1);
        let large = self.f2(Op::FSub, mb, one, q);
        let cut = self.c(mb, 0.625);
        let is_small = self.fcmp(Op::FOrdLessThan, a, cut);
        let r = self.sel(mb, is_small, small, large);
        let zero = self.c(mb, 0.0);
        let neg = self.fcmp(Op::FOrdLessThan, x, zero);
        let nr = self.op(Op::FNegate, t, &[r]);
        self.sel(mb, neg, nr, r)
    }

    /// The error function (a counted loop over the positive series).
    fn erf_(&mut self, mb: u32, x: u32) -> u32 {
        let t = self.fty(mb);
        let (cutoff, iters) = if mb == 64 { (6.0, 100) } else { (4.0, 48) };
        let a = self.gl(t, gl::FABS, &[x]);
        let a2 = self.f2(Op::FMul, mb, a, a);
        let tw = self.f2(Op::FAdd, mb, a2, a2);
        let three = self.c(mb, 3.0);
        let term = self.fn_var(t, None);
        let sum = self.fn_var(t, None);
        let den = self.fn_var(t, None);
        self.op_void(Op::Store, &[term, a]);
        self.op_void(Op::Store, &[sum, a]);
        self.op_void(Op::Store, &[den, three]);
        self.counted_loop(iters, |e| {
            let tv = e.op(Op::Load, t, &[term]);
            let dv = e.op(Op::Load, t, &[den]);
            let num = e.f2(Op::FMul, mb, tv, tw);
            let nt = e.f2(Op::FDiv, mb, num, dv);
            e.op_void(Op::Store, &[term, nt]);
            let sv = e.op(Op::Load, t, &[sum]);
            let ns = e.f2(Op::FAdd, mb, sv, nt);
            e.op_void(Op::Store, &[sum, ns]);
            let two = e.c(mb, 2.0);
            let nd = e.f2(Op::FAdd, mb, dv, two);
            e.op_void(Op::Store, &[den, nd]);
        });
        let s = self.op(Op::Load, t, &[sum]);
        let na2 = self.op(Op::FNegate, t, &[a2]);
        let ex = self.exp_(mb, na2);
        let k = self.c(mb, core::f64::consts::FRAC_2_SQRT_PI);
        let r = self.f2(Op::FMul, mb, s, ex);
        let r = self.f2(Op::FMul, mb, r, k);
        let one = self.c(mb, 1.0);
        let cut = self.c(mb, cutoff);
        let sat = self.fcmp(Op::FOrdGreaterThanEqual, a, cut);
        let r = self.sel(mb, sat, one, r);
        let r = self.gl(t, gl::FMIN, &[r, one]);
        let zero = self.c(mb, 0.0);
        let neg = self.fcmp(Op::FOrdLessThan, x, zero);
        let nr = self.op(Op::FNegate, t, &[r]);
        self.sel(mb, neg, nr, r)
    }

    /// `fmod(x, y)`, exact (truncated remainder, the sign of `x`), for the compute type `mb`:
    /// `OpFRem` is only as precise as `x - y * trunc(x / y)` on some drivers. The remainder is
    /// reduced by `|y| * 2^k` with the largest `k` that fits, each step exact (Sterbenz), at most
    /// one step per binade between `x` and `y`.
    pub fn fmod(&mut self, mb: u32, x: u32, y: u32) -> u32 {
        let t = self.fty(mb);
        let bt = self.m.t_bool();
        let i32t = self.m.t_int(32);
        let ax = self.gl(t, gl::FABS, &[x]);
        let ay = self.gl(t, gl::FABS, &[y]);
        let r = self.fn_var(t, None);
        self.op_void(Op::Store, &[r, ax]);
        let frexp_ty = self.m.t_struct(&[t, i32t]);
        let ey = self.gl(frexp_ty, gl::FREXP_STRUCT, &[ay]);
        let ey = self.op(Op::CompositeExtract, i32t, &[ey, 1]);
        self.while_loop(
            |e| {
                let rv = e.op(Op::Load, t, &[r]);
                e.fcmp(Op::FOrdGreaterThanEqual, rv, ay)
            },
            |e| {
                let rv = e.op(Op::Load, t, &[r]);
                let er = e.gl(frexp_ty, gl::FREXP_STRUCT, &[rv]);
                let er = e.op(Op::CompositeExtract, i32t, &[er, 1]);
                let d = e.op(Op::ISub, i32t, &[er, ey]);
                let sc = e.gl(t, gl::LDEXP, &[ay, d]);
                let too_big = e.fcmp(Op::FOrdGreaterThan, sc, rv);
                let half = e.c(mb, 0.5);
                let hs = e.f2(Op::FMul, mb, sc, half);
                let sc = e.sel(mb, too_big, hs, sc);
                let nr = e.f2(Op::FSub, mb, rv, sc);
                e.op_void(Op::Store, &[r, nr]);
            },
        );
        let rv = self.op(Op::Load, t, &[r]);
        let zero = self.c(mb, 0.0);
        let negz = {
            // -0.0 < 0 is false: look at the sign bit.
            let ut = self.m.t_int(mb);
            let b = self.op(Op::Bitcast, ut, &[x]);
            let sign = self.m.c_int(mb, 1u64 << (mb - 1));
            let s = self.op(Op::BitwiseAnd, ut, &[b, sign]);
            let z = self.m.c_int(mb, 0);
            self.op(Op::INotEqual, bt, &[s, z])
        };
        let nrv = self.op(Op::FNegate, t, &[rv]);
        let res = self.sel(mb, negz, nrv, rv);
        // NaN for y == 0, x infinite or either NaN; x itself when y is infinite.
        let inf = self.c(mb, f64::INFINITY);
        let nan = self.c(mb, f64::NAN);
        let y0 = self.fcmp(Op::FOrdEqual, ay, zero);
        let xinf = self.fcmp(Op::FOrdEqual, ax, inf);
        let yinf = self.fcmp(Op::FOrdEqual, ay, inf);
        let xn = self.op(Op::IsNan, bt, &[x]);
        let yn = self.op(Op::IsNan, bt, &[y]);
        let bad = self.op(Op::LogicalOr, bt, &[y0, xinf]);
        let bad = self.op(Op::LogicalOr, bt, &[bad, xn]);
        let bad = self.op(Op::LogicalOr, bt, &[bad, yn]);
        let res = self.sel(mb, yinf, x, res);
        self.sel(mb, bad, nan, res)
    }

    /// A structured `while (cond) body` loop (`cond` runs in the header block, both closures
    /// straight-line).
    fn while_loop(&mut self, cond: impl FnOnce(&mut Self) -> u32, body: impl FnOnce(&mut Self)) {
        let header = self.m.id();
        let body_l = self.m.id();
        let cont = self.m.id();
        let merge = self.m.id();
        self.branch(header);
        self.label(header);
        let go = cond(self);
        self.op_void(Op::LoopMerge, &[merge, cont, 0]);
        self.op_void(Op::BranchConditional, &[go, body_l, merge]);
        self.terminated = true;
        self.label(body_l);
        body(self);
        self.branch(cont);
        self.label(cont);
        self.op_void(Op::Branch, &[header]);
        self.terminated = true;
        self.label(merge);
    }

    /// A structured loop running `body` `n` times (straight-line bodies only).
    fn counted_loop(&mut self, n: u32, body: impl FnOnce(&mut Self)) {
        let u = self.m.t_u32();
        let bt = self.m.t_bool();
        let zero = self.m.c_u32(0);
        let one = self.m.c_u32(1);
        let cn = self.m.c_u32(n);
        let ivar = self.fn_var(u, None);
        self.op_void(Op::Store, &[ivar, zero]);
        let header = self.m.id();
        let body_l = self.m.id();
        let cont = self.m.id();
        let merge = self.m.id();
        self.branch(header);
        self.label(header);
        let i = self.op(Op::Load, u, &[ivar]);
        let go = self.op(Op::ULessThan, bt, &[i, cn]);
        self.op_void(Op::LoopMerge, &[merge, cont, 0]);
        self.op_void(Op::BranchConditional, &[go, body_l, merge]);
        self.terminated = true;
        self.label(body_l);
        body(self);
        self.branch(cont);
        self.label(cont);
        let i = self.op(Op::Load, u, &[ivar]);
        let i1 = self.op(Op::IAdd, u, &[i, one]);
        self.op_void(Op::Store, &[ivar, i1]);
        self.op_void(Op::Branch, &[header]);
        self.terminated = true;
        self.label(merge);
    }

    /// `x^y` with C `pow` special cases (negative bases with integer exponents, zero).
    pub fn pow(&mut self, mb: u32, x: u32, y: u32) -> u32 {
        let t = self.fty(mb);
        let bt = self.m.t_bool();
        let ax = self.gl(t, gl::FABS, &[x]);
        let core = if mb == 32 && self.caps.float64 {
            // f32 pow through the f64 routines: the error of `y log x` stays far below an f32 ulp.
            let d = self.fty(64);
            let ax64 = self.op(Op::FConvert, d, &[ax]);
            let y64 = self.op(Op::FConvert, d, &[y]);
            let l = self.log_(64, ax64);
            let p = self.f2(Op::FMul, 64, y64, l);
            let r = self.exp_(64, p);
            self.op(Op::FConvert, t, &[r])
        } else {
            let l = self.log_(mb, ax);
            let p = self.f2(Op::FMul, mb, y, l);
            self.exp_(mb, p)
        };
        let zero = self.c(mb, 0.0);
        let one = self.c(mb, 1.0);
        let two = self.c(mb, 2.0);
        let inf = self.c(mb, f64::INFINITY);
        let nan = self.c(mb, f64::NAN);
        let fy = self.gl(t, gl::FLOOR, &[y]);
        let yint = self.fcmp(Op::FOrdEqual, fy, y);
        let rem = self.f2(Op::FRem, mb, y, two);
        let odd = self.fcmp(Op::FOrdNotEqual, rem, zero);
        let yodd = self.op(Op::LogicalAnd, bt, &[yint, odd]);
        let neg = self.fcmp(Op::FOrdLessThan, x, zero);
        let flip = self.op(Op::LogicalAnd, bt, &[neg, yodd]);
        let ncore = self.op(Op::FNegate, t, &[core]);
        let r = self.sel(mb, flip, ncore, core);
        let nint = self.op(Op::LogicalNot, bt, &[yint]);
        let bad = self.op(Op::LogicalAnd, bt, &[neg, nint]);
        let r = self.sel(mb, bad, nan, r);
        let xz = self.fcmp(Op::FOrdEqual, x, zero);
        let yneg = self.fcmp(Op::FOrdLessThan, y, zero);
        let ypos = self.fcmp(Op::FOrdGreaterThan, y, zero);
        let zinf = self.op(Op::LogicalAnd, bt, &[xz, yneg]);
        let zzero = self.op(Op::LogicalAnd, bt, &[xz, ypos]);
        let r = self.sel(mb, zinf, inf, r);
        let r = self.sel(mb, zzero, zero, r);
        let y0 = self.fcmp(Op::FOrdEqual, y, zero);
        self.sel(mb, y0, one, r)
    }
}
