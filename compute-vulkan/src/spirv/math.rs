//! Float math routines emitted inline.
//!
//! `f32` uses `GLSL.std.450` for exp, log, sin, cos and pow; `GLSL.std.450` accepts only 16- and
//! 32-bit floats there, so `f64` gets its own routines (accurate to a few ulps over the usual
//! ranges):
//! - exp: `k = round(x / ln 2)`, `r = x - k ln 2` with a two-part `ln 2` (fused), a degree-14
//!   Taylor polynomial on `|r| <= 0.35`, then `2^k` applied as two exact power-of-two factors (so
//!   subnormal results round once);
//! - log: exponent and mantissa from the bits (subnormals pre-scaled by `2^54`), the mantissa in
//!   `[sqrt(1/2), sqrt(2))`, `log(m) = 2 atanh(s)`, `s = (m - 1) / (m + 1)`, a series in `s^2`;
//! - sin, cos: `k = round(x * 2 / pi)`, a three-part fused Cody-Waite reduction (accurate for
//!   `|x|` up to about `1e9`), Taylor polynomials on `[-pi/4, pi/4]`, the quadrant from `k mod 4`;
//! - pow: `exp(y log |x|)`, sign and special cases handled around it.
//!
//! Every float type (`f16` and `bf16` in `f32`) uses the same routines for:
//! - tanh: `expm1(2|x|) / (expm1(2|x|) + 2)` with a Taylor `expm1` below `|x| < 0.625`,
//!   `1 - 2 / (exp(2|x|) + 1)` above, the sign restored;
//! - log1p: `u = 1 + x`, `log(u) * x / (u - 1)` (exact where `u - 1 == 0`: `x`);
//! - erf: `2/sqrt(pi) e^{-x^2} sum 2^n x^{2n+1} / (2n+1)!!` (every term positive, no
//!   cancellation) in a counted loop, 1 past `|x| >= 6` (`f64`) or `4` (`f32`).

use compute_core::ServerError;
use compute_core::kernel::UnaryOp;
use spirv::Op;

use super::emit::Emitter;
use super::words::gl;

const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEFA_39EF);
const LN2_LO: f64 = f64::from_bits(0x3C7A_BC9E_3B39_803F);
const PIO2_1: f64 = f64::from_bits(0x3FF9_21FB_5444_2D18);
const PIO2_2: f64 = f64::from_bits(0x3C91_A626_3314_5C07);
const PIO2_3: f64 = f64::from_bits(0xB91F_1976_B7ED_8FBC);

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

    fn f2(&mut self, op: Op, mb: u32, a: u32, b: u32) -> u32 {
        let t = self.fty(mb);
        self.op(op, t, &[a, b])
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
            UnaryOp::Sin | UnaryOp::Cos => {
                if mb == 32 {
                    let f = if op == UnaryOp::Sin { gl::SIN } else { gl::COS };
                    self.gl(t, f, &[x])
                } else {
                    self.sincos64(x, op == UnaryOp::Sin)
                }
            }
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

    /// `e^x`.
    pub fn exp_(&mut self, mb: u32, x: u32) -> u32 {
        let t = self.fty(mb);
        if mb == 32 {
            return self.gl(t, gl::EXP, &[x]);
        }
        let lo = self.c(64, -746.0);
        let hi = self.c(64, 710.0);
        let xc = self.gl(t, gl::FMAX, &[x, lo]);
        let xc = self.gl(t, gl::FMIN, &[xc, hi]);
        let l2e = self.c(64, core::f64::consts::LOG2_E);
        let kx = self.f2(Op::FMul, 64, xc, l2e);
        let k = self.gl(t, gl::ROUND_EVEN, &[kx]);
        let nh = self.c(64, -LN2_HI);
        let nl = self.c(64, -LN2_LO);
        let r = self.ffma(64, k, nh, xc);
        let r = self.ffma(64, k, nl, r);
        let coeffs = inv_factorials(0, 1, 15, false);
        let p = self.horner(64, r, &coeffs);
        let i32t = self.m.t_int(32);
        let ki = self.op(Op::ConvertFToS, i32t, &[k]);
        let one = self.m.c_u32(1);
        let k1 = self.op(Op::ShiftRightArithmetic, i32t, &[ki, one]);
        let k2 = self.op(Op::ISub, i32t, &[ki, k1]);
        let s1 = self.pow2_64(k1);
        let s2 = self.pow2_64(k2);
        let r = self.f2(Op::FMul, 64, p, s1);
        let r = self.f2(Op::FMul, 64, r, s2);
        let ovf = self.c(64, 709.782_712_893_384);
        let unf = self.c(64, -745.133_219_101_941_2);
        let inf = self.c(64, f64::INFINITY);
        let zero = self.c(64, 0.0);
        let big = self.fcmp(Op::FOrdGreaterThan, x, ovf);
        let small = self.fcmp(Op::FOrdLessThan, x, unf);
        let r = self.sel(64, big, inf, r);
        let r = self.sel(64, small, zero, r);
        let bt = self.m.t_bool();
        let nan = self.op(Op::IsNan, bt, &[x]);
        self.sel(64, nan, x, r)
    }

    /// `2^k` for an `i32` `k` in the normal exponent range.
    fn pow2_64(&mut self, k: u32) -> u32 {
        let i32t = self.m.t_int(32);
        let i64t = self.m.t_int(64);
        let bias = self.m.c_u32(1023);
        let e = self.op(Op::IAdd, i32t, &[k, bias]);
        let e = self.op(Op::SConvert, i64t, &[e]);
        let s = self.m.c_int(64, 52);
        let b = self.op(Op::ShiftLeftLogical, i64t, &[e, s]);
        let f = self.fty(64);
        self.op(Op::Bitcast, f, &[b])
    }

    /// Natural logarithm.
    pub fn log_(&mut self, mb: u32, x: u32) -> u32 {
        let t = self.fty(mb);
        if mb == 32 {
            return self.gl(t, gl::LOG, &[x]);
        }
        let i32t = self.m.t_int(32);
        let u64t = self.m.t_int(64);
        let bt = self.m.t_bool();
        let min_normal = self.c(64, f64::MIN_POSITIVE);
        let tiny = self.fcmp(Op::FOrdLessThan, x, min_normal);
        let scale = self.c(64, 2f64.powi(54));
        let xs = self.f2(Op::FMul, 64, x, scale);
        let xs = self.sel(64, tiny, xs, x);
        let b = self.op(Op::Bitcast, u64t, &[xs]);
        let s52 = self.m.c_int(64, 52);
        let eb = self.op(Op::ShiftRightLogical, u64t, &[b, s52]);
        let m7ff = self.m.c_int(64, 0x7ff);
        let eb = self.op(Op::BitwiseAnd, u64t, &[eb, m7ff]);
        let e = self.op(Op::UConvert, i32t, &[eb]);
        let bias = self.m.c_u32(1023);
        let e = self.op(Op::ISub, i32t, &[e, bias]);
        let c54 = self.m.c_u32(54);
        let c0 = self.m.c_u32(0);
        let adj = self.op(Op::Select, i32t, &[tiny, c54, c0]);
        let e = self.op(Op::ISub, i32t, &[e, adj]);
        let mant = self.m.c_int(64, 0x000F_FFFF_FFFF_FFFF);
        let one_bits = self.m.c_int(64, 0x3FF0_0000_0000_0000);
        let mb_ = self.op(Op::BitwiseAnd, u64t, &[b, mant]);
        let mb_ = self.op(Op::BitwiseOr, u64t, &[mb_, one_bits]);
        let m = self.op(Op::Bitcast, t, &[mb_]);
        let sqrt2 = self.c(64, core::f64::consts::SQRT_2);
        let big = self.fcmp(Op::FOrdGreaterThan, m, sqrt2);
        let half = self.c(64, 0.5);
        let mh = self.f2(Op::FMul, 64, m, half);
        let m = self.sel(64, big, mh, m);
        let c1 = self.m.c_u32(1);
        let e1 = self.op(Op::IAdd, i32t, &[e, c1]);
        let e = self.op(Op::Select, i32t, &[big, e1, e]);
        let one = self.c(64, 1.0);
        let f = self.f2(Op::FSub, 64, m, one);
        let d = self.f2(Op::FAdd, 64, m, one);
        let s = self.f2(Op::FDiv, 64, f, d);
        let s2 = self.f2(Op::FMul, 64, s, s);
        let coeffs: Vec<f64> = (0..12).map(|k| 2.0 / f64::from(2 * k + 1)).collect();
        let p = self.horner(64, s2, &coeffs);
        let lm = self.f2(Op::FMul, 64, s, p);
        let ef = self.op(Op::ConvertSToF, t, &[e]);
        let lh = self.c(64, LN2_HI);
        let ll = self.c(64, LN2_LO);
        let lo = self.ffma(64, ef, ll, lm);
        let r = self.ffma(64, ef, lh, lo);
        let inf = self.c(64, f64::INFINITY);
        let ninf = self.c(64, f64::NEG_INFINITY);
        let nan = self.c(64, f64::NAN);
        let zero = self.c(64, 0.0);
        let is_inf = self.fcmp(Op::FOrdEqual, x, inf);
        let is_zero = self.fcmp(Op::FOrdEqual, x, zero);
        let neg = self.fcmp(Op::FOrdLessThan, x, zero);
        let xnan = self.op(Op::IsNan, bt, &[x]);
        let bad = self.op(Op::LogicalOr, bt, &[neg, xnan]);
        let r = self.sel(64, is_inf, inf, r);
        let r = self.sel(64, is_zero, ninf, r);
        self.sel(64, bad, nan, r)
    }

    /// `sin x` or `cos x` in `f64`.
    fn sincos64(&mut self, x: u32, sin: bool) -> u32 {
        let t = self.fty(64);
        let i32t = self.m.t_int(32);
        let bt = self.m.t_bool();
        let two_pi = self.c(64, core::f64::consts::FRAC_2_PI);
        let kx = self.f2(Op::FMul, 64, x, two_pi);
        let k = self.gl(t, gl::ROUND_EVEN, &[kx]);
        let p1 = self.c(64, -PIO2_1);
        let p2 = self.c(64, -PIO2_2);
        let p3 = self.c(64, -PIO2_3);
        let r = self.ffma(64, k, p1, x);
        let r = self.ffma(64, k, p2, r);
        let r = self.ffma(64, k, p3, r);
        let r2 = self.f2(Op::FMul, 64, r, r);
        let sc = inv_factorials(1, 2, 9, true);
        let sp = self.horner(64, r2, &sc);
        let s = self.f2(Op::FMul, 64, r, sp);
        let cc = inv_factorials(0, 2, 10, true);
        let c = self.horner(64, r2, &cc);
        // The quadrant: k mod 4 (through i64 so large |k| still wraps correctly).
        let i64t = self.m.t_int(64);
        let big = self.c(64, 9.0e15);
        let nbig = self.c(64, -9.0e15);
        let kc = self.gl(t, gl::FMIN, &[k, big]);
        let kc = self.gl(t, gl::FMAX, &[kc, nbig]);
        let k64 = self.op(Op::ConvertFToS, i64t, &[kc]);
        let q = self.op(Op::UConvert, i32t, &[k64]);
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
        // sin: q even -> sin r, odd -> cos r; cos(x) = sin(x + pi/2): shift the quadrant.
        let v = self.sel(64, odd, c, s);
        let nv = self.op(Op::FNegate, t, &[v]);
        self.sel(64, neg, nv, v)
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
        let core = if mb == 32 {
            self.gl(t, gl::POW, &[ax, y])
        } else {
            let l = self.log_(64, ax);
            let p = self.f2(Op::FMul, 64, y, l);
            self.exp_(64, p)
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
