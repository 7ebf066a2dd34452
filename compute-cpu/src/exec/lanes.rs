//! Per-type lane kernels: each is a tight loop over the components of whole registers, chosen once
//! at compile time as a function pointer, so execution never matches on types per element.
//!
//! Registers are `[u64]` slabs viewed as slices of the element type (bools are `u8` 0/1). Values
//! are laid out unit-major: component `c` of unit `l` of a width-`w` value is at `l * w + c`.

use bytemuck::Pod;
use compute_core::elem::ElemType;
use compute_core::kernel::{BinaryOp, CmpOp, UnaryOp};
use half::{bf16, f16};

/// `out = f(x)` over `n` components.
pub(crate) type UnFn = fn(&[u64], &mut [u64], usize);
/// `out = f(a, b)` over `n` components.
pub(crate) type BinFn = fn(&[u64], &[u64], &mut [u64], usize);
/// `out = f(a, b, c)` over `n` components.
pub(crate) type TerFn = fn(&[u64], &[u64], &[u64], &mut [u64], usize);

#[inline(always)]
pub(crate) fn view<T: Pod>(r: &[u64], n: usize) -> &[T] {
    &bytemuck::cast_slice(r)[..n]
}

#[inline(always)]
pub(crate) fn view_mut<T: Pod>(r: &mut [u64], n: usize) -> &mut [T] {
    &mut bytemuck::cast_slice_mut(r)[..n]
}

/// Arithmetic every numeric element type has. Integers wrap; see `compute_core::kernel::ir`.
pub(crate) trait Num: Pod + PartialOrd + Send + Sync {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    fn rem(self, o: Self) -> Self;
    fn min_(self, o: Self) -> Self;
    fn max_(self, o: Self) -> Self;
    fn neg(self) -> Self;
    fn abs_(self) -> Self;
}

/// Bit operations of integers.
pub(crate) trait Int: Num {
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn not(self) -> Self;
    fn shl(self, o: Self) -> Self;
    fn shr(self, o: Self) -> Self;
}

/// Math functions of floats.
pub(crate) trait Float: Num {
    fn fma(self, b: Self, c: Self) -> Self;
    fn math(self, op: MathOp) -> Self;
    fn pow(self, o: Self) -> Self;
}

/// The float unary functions, as a const-foldable selector.
#[derive(Clone, Copy)]
pub(crate) enum MathOp {
    Sqrt,
    Rsqrt,
    Exp,
    Log,
    Log1p,
    Sin,
    Cos,
    Tanh,
    Erf,
    Floor,
    Ceil,
    Round,
    Recip,
}

macro_rules! int_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn div(self, o: Self) -> Self { if o == 0 { self } else { self.wrapping_div(o) } }
            #[inline(always)] fn rem(self, o: Self) -> Self { if o == 0 { 0 } else { self.wrapping_rem(o) } }
            #[inline(always)] fn min_(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline(always)] fn max_(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline(always)] fn neg(self) -> Self { self.wrapping_neg() }
            #[allow(unused_comparisons)]
            #[inline(always)] fn abs_(self) -> Self { if self < 0 { self.wrapping_neg() } else { self } }
        }
        impl Int for $t {
            #[inline(always)] fn and(self, o: Self) -> Self { self & o }
            #[inline(always)] fn or(self, o: Self) -> Self { self | o }
            #[inline(always)] fn xor(self, o: Self) -> Self { self ^ o }
            #[inline(always)] fn not(self) -> Self { !self }
            #[inline(always)] fn shl(self, o: Self) -> Self { self.wrapping_shl(o as u32) }
            #[inline(always)] fn shr(self, o: Self) -> Self { self.wrapping_shr(o as u32) }
        }
    )*};
}

int_num!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn sub(self, o: Self) -> Self { self - o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            #[inline(always)] fn div(self, o: Self) -> Self { self / o }
            #[inline(always)] fn rem(self, o: Self) -> Self { self % o }
            #[inline(always)] fn min_(self, o: Self) -> Self { self.min(o) }
            #[inline(always)] fn max_(self, o: Self) -> Self { self.max(o) }
            #[inline(always)] fn neg(self) -> Self { -self }
            #[inline(always)] fn abs_(self) -> Self { self.abs() }
        }
        impl Float for $t {
            #[inline(always)] fn fma(self, b: Self, c: Self) -> Self { self.mul_add(b, c) }
            #[inline(always)] fn pow(self, o: Self) -> Self { self.powf(o) }
            #[inline(always)]
            fn math(self, op: MathOp) -> Self {
                match op {
                    MathOp::Sqrt => self.sqrt(),
                    MathOp::Rsqrt => 1.0 / self.sqrt(),
                    MathOp::Exp => self.exp(),
                    MathOp::Log => self.ln(),
                    MathOp::Log1p => self.ln_1p(),
                    MathOp::Sin => self.sin(),
                    MathOp::Cos => self.cos(),
                    MathOp::Tanh => self.tanh(),
                    MathOp::Erf => erf(self as f64) as $t,
                    MathOp::Floor => self.floor(),
                    MathOp::Ceil => self.ceil(),
                    MathOp::Round => self.round_ties_even(),
                    MathOp::Recip => 1.0 / self,
                }
            }
        }
    )*};
}

float_num!(f32, f64);

macro_rules! half_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            #[inline(always)] fn sub(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() - o.to_f32()) }
            #[inline(always)] fn mul(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
            #[inline(always)] fn div(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() / o.to_f32()) }
            #[inline(always)] fn rem(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() % o.to_f32()) }
            #[inline(always)] fn min_(self, o: Self) -> Self { <$t>::from_f32(self.to_f32().min(o.to_f32())) }
            #[inline(always)] fn max_(self, o: Self) -> Self { <$t>::from_f32(self.to_f32().max(o.to_f32())) }
            #[inline(always)] fn neg(self) -> Self { -self }
            #[inline(always)] fn abs_(self) -> Self { <$t>::from_f32(self.to_f32().abs()) }
        }
        impl Float for $t {
            #[inline(always)]
            fn fma(self, b: Self, c: Self) -> Self {
                // f32 holds the exact product of two halves, so this rounds once more at most.
                <$t>::from_f32(self.to_f32().mul_add(b.to_f32(), c.to_f32()))
            }
            #[inline(always)] fn pow(self, o: Self) -> Self { <$t>::from_f32(self.to_f32().powf(o.to_f32())) }
            #[inline(always)] fn math(self, op: MathOp) -> Self { <$t>::from_f32(self.to_f32().math(op)) }
        }
    )*};
}

half_num!(f16, bf16);

/// The error function, to about 1e-13 relative error in f64.
pub(crate) fn erf(x: f64) -> f64 {
    let a = x.abs();
    if a.is_nan() {
        return x;
    }
    let r = if a < 2.5 {
        // Maclaurin series: erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)).
        let x2 = a * a;
        let mut term = a;
        let mut sum = a;
        // At most 100 terms: for a < 2.5 the series has converged to f64 precision by then, and
        // the bound also ends the loop for a == 0 (where every term is 0).
        for n in 1..=100 {
            let n = n as f64;
            term *= -x2 / n;
            let t = term / (2.0 * n + 1.0);
            sum += t;
            if t.abs() <= 1e-17 * sum.abs() {
                break;
            }
        }
        sum * core::f64::consts::FRAC_2_SQRT_PI
    } else if a < 6.0 {
        // erfc by its continued fraction (modified Lentz), which converges fast for a >= 2.5.
        let tiny = 1e-300;
        let mut f = a;
        let mut c = a;
        let mut d = 0.0;
        for k in 1..200 {
            let an = k as f64 * 0.5;
            d = a + an * d;
            d = if d == 0.0 { tiny } else { 1.0 / d };
            c = a + an / c;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-a * a).exp() / (f * core::f64::consts::PI.sqrt())
    } else {
        1.0
    };
    if x < 0.0 { -r } else { r }
}

// ----- operation selectors -----

pub(crate) trait Op2<T> {
    fn f(a: T, b: T) -> T;
}

macro_rules! op2 {
    ($($name:ident: $bound:ident => |$a:ident, $b:ident| $e:expr;)*) => {$(
        pub(crate) struct $name;
        impl<T: $bound> Op2<T> for $name {
            #[inline(always)]
            fn f($a: T, $b: T) -> T { $e }
        }
    )*};
}

op2! {
    Add: Num => |a, b| a.add(b);
    Sub: Num => |a, b| a.sub(b);
    Mul: Num => |a, b| a.mul(b);
    Div: Num => |a, b| a.div(b);
    Rem: Num => |a, b| a.rem(b);
    Min: Num => |a, b| a.min_(b);
    Max: Num => |a, b| a.max_(b);
    Pow: Float => |a, b| a.pow(b);
    BitAnd: Int => |a, b| a.and(b);
    BitOr: Int => |a, b| a.or(b);
    BitXor: Int => |a, b| a.xor(b);
    Shl: Int => |a, b| a.shl(b);
    Shr: Int => |a, b| a.shr(b);
}

/// Whether this CPU runs the AVX2 + FMA instances of the lane kernels (detected once, see
/// [`features`](super::jit::features); `COMPUTE_CPU_SIMD=baseline` turns them off).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn has_avx2_fma() -> bool {
    let f = super::jit::features();
    f.avx2 && f.fma
}

#[inline(always)]
fn binary_loop<T: Pod, O: Op2<T>>(a: &[T], b: &[T], out: &mut [T]) {
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = O::f(a, b);
    }
}

/// The same loop compiled for AVX2 + FMA: eight f32 lanes per instruction, and `mul_add` is one
/// instruction instead of a libm call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn binary_avx2<T: Pod, O: Op2<T>>(a: &[T], b: &[T], out: &mut [T]) {
    binary_loop::<T, O>(a, b, out)
}

fn binary<T: Pod, O: Op2<T>>(a: &[u64], b: &[u64], out: &mut [u64], n: usize) {
    let (a, b, out) = (view::<T>(a, n), view::<T>(b, n), view_mut::<T>(out, n));
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (detected just above).
        return unsafe { binary_avx2::<T, O>(a, b, out) };
    }
    binary_loop::<T, O>(a, b, out)
}

fn logic_and(a: &[u64], b: &[u64], out: &mut [u64], n: usize) {
    let (a, b, out) = (view::<u8>(a, n), view::<u8>(b, n), view_mut::<u8>(out, n));
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = a & b;
    }
}

fn logic_or(a: &[u64], b: &[u64], out: &mut [u64], n: usize) {
    let (a, b, out) = (view::<u8>(a, n), view::<u8>(b, n), view_mut::<u8>(out, n));
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = a | b;
    }
}

macro_rules! by_num {
    ($elem:expr, $f:ident, $op:ty, $fty:ty) => {
        match $elem {
            ElemType::I8 => Some($f::<i8, $op> as $fty),
            ElemType::I16 => Some($f::<i16, $op> as $fty),
            ElemType::I32 => Some($f::<i32, $op> as $fty),
            ElemType::I64 => Some($f::<i64, $op> as $fty),
            ElemType::U8 => Some($f::<u8, $op> as $fty),
            ElemType::U16 => Some($f::<u16, $op> as $fty),
            ElemType::U32 => Some($f::<u32, $op> as $fty),
            ElemType::U64 => Some($f::<u64, $op> as $fty),
            ElemType::F16 => Some($f::<f16, $op> as $fty),
            ElemType::BF16 => Some($f::<bf16, $op> as $fty),
            ElemType::F32 => Some($f::<f32, $op> as $fty),
            ElemType::F64 => Some($f::<f64, $op> as $fty),
            ElemType::Bool => None,
        }
    };
}

macro_rules! by_int {
    ($elem:expr, $f:ident, $op:ty, $fty:ty) => {
        match $elem {
            ElemType::I8 => Some($f::<i8, $op> as $fty),
            ElemType::I16 => Some($f::<i16, $op> as $fty),
            ElemType::I32 => Some($f::<i32, $op> as $fty),
            ElemType::I64 => Some($f::<i64, $op> as $fty),
            ElemType::U8 => Some($f::<u8, $op> as $fty),
            ElemType::U16 => Some($f::<u16, $op> as $fty),
            ElemType::U32 => Some($f::<u32, $op> as $fty),
            ElemType::U64 => Some($f::<u64, $op> as $fty),
            _ => None,
        }
    };
}

macro_rules! by_float {
    ($elem:expr, $f:ident, $op:ty, $fty:ty) => {
        match $elem {
            ElemType::F16 => Some($f::<f16, $op> as $fty),
            ElemType::BF16 => Some($f::<bf16, $op> as $fty),
            ElemType::F32 => Some($f::<f32, $op> as $fty),
            ElemType::F64 => Some($f::<f64, $op> as $fty),
            _ => None,
        }
    };
}

/// The kernel of a binary operation on `elem`, if the type supports it.
pub(crate) fn binary_fn(op: BinaryOp, elem: ElemType) -> Option<BinFn> {
    match op {
        BinaryOp::Add => by_num!(elem, binary, Add, BinFn),
        BinaryOp::Sub => by_num!(elem, binary, Sub, BinFn),
        BinaryOp::Mul => by_num!(elem, binary, Mul, BinFn),
        BinaryOp::Div => by_num!(elem, binary, Div, BinFn),
        BinaryOp::Rem => by_num!(elem, binary, Rem, BinFn),
        BinaryOp::Min => by_num!(elem, binary, Min, BinFn),
        BinaryOp::Max => by_num!(elem, binary, Max, BinFn),
        BinaryOp::Pow => by_float!(elem, binary, Pow, BinFn),
        BinaryOp::BitAnd => by_int!(elem, binary, BitAnd, BinFn),
        BinaryOp::BitOr => by_int!(elem, binary, BitOr, BinFn),
        BinaryOp::BitXor => by_int!(elem, binary, BitXor, BinFn),
        BinaryOp::Shl => by_int!(elem, binary, Shl, BinFn),
        BinaryOp::Shr => by_int!(elem, binary, Shr, BinFn),
        BinaryOp::And => (elem == ElemType::Bool).then_some(logic_and as BinFn),
        BinaryOp::Or => (elem == ElemType::Bool).then_some(logic_or as BinFn),
    }
}

// ----- unary -----

pub(crate) trait Op1<T> {
    fn f(x: T) -> T;
}

pub(crate) struct Neg;
impl<T: Num> Op1<T> for Neg {
    #[inline(always)]
    fn f(x: T) -> T {
        x.neg()
    }
}

pub(crate) struct Abs;
impl<T: Num> Op1<T> for Abs {
    #[inline(always)]
    fn f(x: T) -> T {
        x.abs_()
    }
}

pub(crate) struct BitNot;
impl<T: Int> Op1<T> for BitNot {
    #[inline(always)]
    fn f(x: T) -> T {
        x.not()
    }
}

macro_rules! math_ops {
    ($($name:ident),*) => {$(
        pub(crate) struct $name;
        impl<T: Float> Op1<T> for $name {
            #[inline(always)]
            fn f(x: T) -> T { x.math(MathOp::$name) }
        }
    )*};
}

math_ops!(
    Sqrt, Rsqrt, Exp, Log, Log1p, Sin, Cos, Tanh, Erf, Floor, Ceil, Round, Recip
);

fn unary<T: Pod, O: Op1<T>>(x: &[u64], out: &mut [u64], n: usize) {
    let (x, out) = (view::<T>(x, n), view_mut::<T>(out, n));
    for (o, &x) in out.iter_mut().zip(x) {
        *o = O::f(x);
    }
}

fn logic_not(x: &[u64], out: &mut [u64], n: usize) {
    let (x, out) = (view::<u8>(x, n), view_mut::<u8>(out, n));
    for (o, &x) in out.iter_mut().zip(x) {
        *o = x ^ 1;
    }
}

/// The kernel of a unary operation on `elem`, if the type supports it.
pub(crate) fn unary_fn(op: UnaryOp, elem: ElemType) -> Option<UnFn> {
    match op {
        UnaryOp::Neg if elem.is_unsigned_int() => None,
        UnaryOp::Neg => by_num!(elem, unary, Neg, UnFn),
        UnaryOp::Abs if elem.is_unsigned_int() => None,
        UnaryOp::Abs => by_num!(elem, unary, Abs, UnFn),
        UnaryOp::Not => (elem == ElemType::Bool).then_some(logic_not as UnFn),
        UnaryOp::BitNot => by_int!(elem, unary, BitNot, UnFn),
        UnaryOp::Sqrt => by_float!(elem, unary, Sqrt, UnFn),
        UnaryOp::Rsqrt => by_float!(elem, unary, Rsqrt, UnFn),
        UnaryOp::Exp => by_float!(elem, unary, Exp, UnFn),
        UnaryOp::Log => by_float!(elem, unary, Log, UnFn),
        UnaryOp::Log1p => by_float!(elem, unary, Log1p, UnFn),
        UnaryOp::Sin => by_float!(elem, unary, Sin, UnFn),
        UnaryOp::Cos => by_float!(elem, unary, Cos, UnFn),
        UnaryOp::Tanh => by_float!(elem, unary, Tanh, UnFn),
        UnaryOp::Erf => by_float!(elem, unary, Erf, UnFn),
        UnaryOp::Floor => by_float!(elem, unary, Floor, UnFn),
        UnaryOp::Ceil => by_float!(elem, unary, Ceil, UnFn),
        UnaryOp::Round => by_float!(elem, unary, Round, UnFn),
        UnaryOp::Recip => by_float!(elem, unary, Recip, UnFn),
    }
}

// ----- ternary -----

pub(crate) struct Fma;
pub(crate) struct Clamp;
/// `a * b + c` rounded twice: `fma` where the CPU has no fused multiply-add (the IR fuses only
/// "where the hardware fuses"; a software fma costs a libm call per element).
pub(crate) struct MulAdd;

impl<T: Float> Op3<T> for MulAdd {
    #[inline(always)]
    fn f(a: T, b: T, c: T) -> T {
        a.mul(b).add(c)
    }
}

/// Whether `fma` of f32 and f64 is fused: the CPU has a fused multiply-add instruction.
pub(crate) fn fused_fma() -> bool {
    super::jit::features().fma
}

/// Whether `elem`'s `fma` runs unfused on this CPU (f32 and f64 without hardware fma; halves
/// are always exact, through f32).
fn unfused(elem: ElemType) -> bool {
    !fused_fma() && matches!(elem, ElemType::F32 | ElemType::F64)
}

pub(crate) trait Op3<T> {
    fn f(a: T, b: T, c: T) -> T;
}

impl<T: Float> Op3<T> for Fma {
    #[inline(always)]
    fn f(a: T, b: T, c: T) -> T {
        a.fma(b, c)
    }
}

impl<T: Num> Op3<T> for Clamp {
    #[inline(always)]
    fn f(x: T, lo: T, hi: T) -> T {
        x.max_(lo).min_(hi)
    }
}

#[inline(always)]
fn ternary_loop<T: Pod, O: Op3<T>>(a: &[T], b: &[T], c: &[T], out: &mut [T]) {
    for (((o, &a), &b), &c) in out.iter_mut().zip(a).zip(b).zip(c) {
        *o = O::f(a, b, c);
    }
}

/// See [`binary_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn ternary_avx2<T: Pod, O: Op3<T>>(a: &[T], b: &[T], c: &[T], out: &mut [T]) {
    ternary_loop::<T, O>(a, b, c, out)
}

fn ternary<T: Pod, O: Op3<T>>(a: &[u64], b: &[u64], c: &[u64], out: &mut [u64], n: usize) {
    let (a, b, c) = (view::<T>(a, n), view::<T>(b, n), view::<T>(c, n));
    let out = view_mut::<T>(out, n);
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (detected just above).
        return unsafe { ternary_avx2::<T, O>(a, b, c, out) };
    }
    ternary_loop::<T, O>(a, b, c, out)
}

// ----- accumulations in place -----

/// `acc = f(a, b, acc)` in place over `lanes` units of `width` components; what `a` and `b` are
/// depends on the kernel (see [`acc_add_fn`], [`acc_fma_fn`]).
pub(crate) type AccFn = fn(&[u64], &[u64], &mut [u64], usize, usize);

#[inline(always)]
fn acc2_loop<T: Pod, O: Op2<T>>(x: &[T], acc: &mut [T]) {
    for (o, &x) in acc.iter_mut().zip(x) {
        *o = O::f(*o, x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn acc2_avx2<T: Pod, O: Op2<T>>(x: &[T], acc: &mut [T]) {
    acc2_loop::<T, O>(x, acc)
}

/// `acc = acc op x` (`b` unused).
fn acc2<T: Pod, O: Op2<T>>(x: &[u64], _b: &[u64], acc: &mut [u64], lanes: usize, width: usize) {
    let n = lanes * width;
    let (x, acc) = (view::<T>(x, n), view_mut::<T>(acc, n));
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (detected just above).
        return unsafe { acc2_avx2::<T, O>(x, acc) };
    }
    acc2_loop::<T, O>(x, acc)
}

#[inline(always)]
fn acc3_loop<T: Pod, O: Op3<T>>(a: &[T], b: &[T], acc: &mut [T]) {
    for ((o, &a), &b) in acc.iter_mut().zip(a).zip(b) {
        *o = O::f(a, b, *o);
    }
}

/// Unit `l`'s scalar `s[l]` against each component of its vector in `b`.
#[inline(always)]
fn acc3_bcast_loop<T: Pod, O: Op3<T>>(s: &[T], b: &[T], acc: &mut [T], width: usize) {
    /// A fixed width, so the inner loop unrolls into whole vector registers.
    #[inline(always)]
    fn fixed<T: Pod, O: Op3<T>, const N: usize>(s: &[T], b: &[T], acc: &mut [T]) {
        let (acc, _) = acc.as_chunks_mut::<N>();
        let (b, _) = b.as_chunks::<N>();
        for ((o, b), &s) in acc.iter_mut().zip(b).zip(s) {
            for (o, &b) in o.iter_mut().zip(b) {
                *o = O::f(s, b, *o);
            }
        }
    }
    match width {
        4 => fixed::<T, O, 4>(s, b, acc),
        8 => fixed::<T, O, 8>(s, b, acc),
        16 => fixed::<T, O, 16>(s, b, acc),
        _ => {
            for ((o, b), &s) in acc
                .chunks_exact_mut(width)
                .zip(b.chunks_exact(width))
                .zip(s)
            {
                for (o, &b) in o.iter_mut().zip(b) {
                    *o = O::f(s, b, *o);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn acc3_avx2<T: Pod, O: Op3<T>>(a: &[T], b: &[T], acc: &mut [T]) {
    acc3_loop::<T, O>(a, b, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn acc3_bcast_avx2<T: Pod, O: Op3<T>>(s: &[T], b: &[T], acc: &mut [T], width: usize) {
    acc3_bcast_loop::<T, O>(s, b, acc, width)
}

/// `acc = f(a, b, acc)` per component.
fn acc3<T: Pod, O: Op3<T>>(a: &[u64], b: &[u64], acc: &mut [u64], lanes: usize, width: usize) {
    let n = lanes * width;
    let (a, b, acc) = (view::<T>(a, n), view::<T>(b, n), view_mut::<T>(acc, n));
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (detected just above).
        return unsafe { acc3_avx2::<T, O>(a, b, acc) };
    }
    acc3_loop::<T, O>(a, b, acc)
}

/// `acc = f(splat(s), b, acc)`: `s` is a scalar per unit, splatted without a register.
fn acc3_bcast<T: Pod, O: Op3<T>>(
    s: &[u64],
    b: &[u64],
    acc: &mut [u64],
    lanes: usize,
    width: usize,
) {
    let n = lanes * width;
    let (s, b, acc) = (view::<T>(s, lanes), view::<T>(b, n), view_mut::<T>(acc, n));
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA (detected just above).
        return unsafe { acc3_bcast_avx2::<T, O>(s, b, acc, width) };
    }
    acc3_bcast_loop::<T, O>(s, b, acc, width)
}

/// `acc = acc + x` in place.
pub(crate) fn acc_add_fn(elem: ElemType) -> Option<AccFn> {
    by_num!(elem, acc2, Add, AccFn)
}

/// `acc = fma(a, b, acc)` in place; with `bcast`, `a` is a per-unit scalar.
pub(crate) fn acc_fma_fn(elem: ElemType, bcast: bool) -> Option<AccFn> {
    if unfused(elem) {
        return if bcast {
            by_float!(elem, acc3_bcast, MulAdd, AccFn)
        } else {
            by_float!(elem, acc3, MulAdd, AccFn)
        };
    }
    if bcast {
        by_float!(elem, acc3_bcast, Fma, AccFn)
    } else {
        by_float!(elem, acc3, Fma, AccFn)
    }
}

/// The fused multiply-add kernel of a float type.
pub(crate) fn fma_fn(elem: ElemType) -> Option<TerFn> {
    if unfused(elem) {
        return by_float!(elem, ternary, MulAdd, TerFn);
    }
    by_float!(elem, ternary, Fma, TerFn)
}

/// The clamp kernel of a numeric type.
pub(crate) fn clamp_fn(elem: ElemType) -> Option<TerFn> {
    by_num!(elem, ternary, Clamp, TerFn)
}

// ----- comparisons -----

pub(crate) trait Cmp {
    fn f<T: PartialOrd>(a: T, b: T) -> bool;
}

macro_rules! cmp_ops {
    ($($name:ident => $op:tt),*) => {$(
        pub(crate) struct $name;
        impl Cmp for $name {
            #[inline(always)]
            fn f<T: PartialOrd>(a: T, b: T) -> bool { a $op b }
        }
    )*};
}

cmp_ops!(Eq => ==, Ne => !=, Lt => <, Le => <=, Gt => >, Ge => >=);

fn compare<T: Pod + PartialOrd, O: Cmp>(a: &[u64], b: &[u64], out: &mut [u64], n: usize) {
    let (a, b, out) = (view::<T>(a, n), view::<T>(b, n), view_mut::<u8>(out, n));
    for ((o, &a), &b) in out.iter_mut().zip(a).zip(b) {
        *o = O::f(a, b) as u8;
    }
}

fn compare_fn_for<O: Cmp>(elem: ElemType) -> BinFn {
    match elem {
        ElemType::Bool | ElemType::U8 => compare::<u8, O>,
        ElemType::I8 => compare::<i8, O>,
        ElemType::I16 => compare::<i16, O>,
        ElemType::I32 => compare::<i32, O>,
        ElemType::I64 => compare::<i64, O>,
        ElemType::U16 => compare::<u16, O>,
        ElemType::U32 => compare::<u32, O>,
        ElemType::U64 => compare::<u64, O>,
        ElemType::F16 => compare::<f16, O>,
        ElemType::BF16 => compare::<bf16, O>,
        ElemType::F32 => compare::<f32, O>,
        ElemType::F64 => compare::<f64, O>,
    }
}

/// The kernel of a comparison on `elem`; the output is bool (`u8`).
pub(crate) fn compare_fn(op: CmpOp, elem: ElemType) -> BinFn {
    match op {
        CmpOp::Eq => compare_fn_for::<Eq>(elem),
        CmpOp::Ne => compare_fn_for::<Ne>(elem),
        CmpOp::Lt => compare_fn_for::<Lt>(elem),
        CmpOp::Le => compare_fn_for::<Le>(elem),
        CmpOp::Gt => compare_fn_for::<Gt>(elem),
        CmpOp::Ge => compare_fn_for::<Ge>(elem),
    }
}

// ----- casts -----

/// A value on its way between two element types.
#[derive(Clone, Copy)]
pub(crate) enum Wide {
    I(i64),
    U(u64),
    F(f64),
}

/// How an element type converts to and from [`Wide`]; bools have their own codec over `u8`.
pub(crate) trait Codec {
    type S: Pod;
    fn to_wide(s: Self::S) -> Wide;
    fn from_wide(w: Wide) -> Self::S;
}

pub(crate) struct BoolCodec;

impl Codec for BoolCodec {
    type S = u8;
    #[inline(always)]
    fn to_wide(s: u8) -> Wide {
        Wide::U((s != 0) as u64)
    }
    #[inline(always)]
    fn from_wide(w: Wide) -> u8 {
        match w {
            Wide::I(i) => (i != 0) as u8,
            Wide::U(u) => (u != 0) as u8,
            Wide::F(f) => (f != 0.0) as u8,
        }
    }
}

macro_rules! int_codec {
    ($($t:ty => $v:ident as $w:ty),*) => {$(
        impl Codec for $t {
            type S = $t;
            #[inline(always)]
            fn to_wide(s: $t) -> Wide { Wide::$v(s as $w) }
            #[inline(always)]
            fn from_wide(w: Wide) -> $t {
                match w { Wide::I(i) => i as $t, Wide::U(u) => u as $t, Wide::F(f) => f as $t }
            }
        }
    )*};
}

int_codec!(i8 => I as i64, i16 => I as i64, i32 => I as i64, i64 => I as i64,
    u8 => U as u64, u16 => U as u64, u32 => U as u64, u64 => U as u64);

macro_rules! float_codec {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            type S = $t;
            #[inline(always)]
            fn to_wide(s: $t) -> Wide { Wide::F(s as f64) }
            #[inline(always)]
            fn from_wide(w: Wide) -> $t {
                match w { Wide::I(i) => i as $t, Wide::U(u) => u as $t, Wide::F(f) => f as $t }
            }
        }
    )*};
}

float_codec!(f32, f64);

macro_rules! half_codec {
    ($($t:ty),*) => {$(
        impl Codec for $t {
            type S = $t;
            #[inline(always)]
            fn to_wide(s: $t) -> Wide { Wide::F(s.to_f64()) }
            #[inline(always)]
            fn from_wide(w: Wide) -> $t {
                match w {
                    Wide::I(i) => <$t>::from_f64(i as f64),
                    Wide::U(u) => <$t>::from_f64(u as f64),
                    Wide::F(f) => <$t>::from_f64(f),
                }
            }
        }
    )*};
}

half_codec!(f16, bf16);

fn cast<A: Codec, B: Codec>(x: &[u64], out: &mut [u64], n: usize) {
    let (x, out) = (view::<A::S>(x, n), view_mut::<B::S>(out, n));
    for (o, &x) in out.iter_mut().zip(x) {
        *o = B::from_wide(A::to_wide(x));
    }
}

fn cast_from<A: Codec>(to: ElemType) -> UnFn {
    match to {
        ElemType::Bool => cast::<A, BoolCodec>,
        ElemType::I8 => cast::<A, i8>,
        ElemType::I16 => cast::<A, i16>,
        ElemType::I32 => cast::<A, i32>,
        ElemType::I64 => cast::<A, i64>,
        ElemType::U8 => cast::<A, u8>,
        ElemType::U16 => cast::<A, u16>,
        ElemType::U32 => cast::<A, u32>,
        ElemType::U64 => cast::<A, u64>,
        ElemType::F16 => cast::<A, f16>,
        ElemType::BF16 => cast::<A, bf16>,
        ElemType::F32 => cast::<A, f32>,
        ElemType::F64 => cast::<A, f64>,
    }
}

/// The conversion kernel from `from` to `to`.
pub(crate) fn cast_fn(from: ElemType, to: ElemType) -> UnFn {
    match from {
        ElemType::Bool => cast_from::<BoolCodec>(to),
        ElemType::I8 => cast_from::<i8>(to),
        ElemType::I16 => cast_from::<i16>(to),
        ElemType::I32 => cast_from::<i32>(to),
        ElemType::I64 => cast_from::<i64>(to),
        ElemType::U8 => cast_from::<u8>(to),
        ElemType::U16 => cast_from::<u16>(to),
        ElemType::U32 => cast_from::<u32>(to),
        ElemType::U64 => cast_from::<u64>(to),
        ElemType::F16 => cast_from::<f16>(to),
        ElemType::BF16 => cast_from::<bf16>(to),
        ElemType::F32 => cast_from::<f32>(to),
        ElemType::F64 => cast_from::<f64>(to),
    }
}

/// Converts an integer index register to `u64` indices; negative indices become `u64::MAX`.
pub(crate) type IndexFn = fn(&[u64], &mut [u64], usize);

fn index_signed<T: Pod + Into<i64>>(x: &[u64], out: &mut [u64], n: usize) {
    for (o, &x) in out[..n].iter_mut().zip(view::<T>(x, n)) {
        let v: i64 = x.into();
        *o = if v < 0 { u64::MAX } else { v as u64 };
    }
}

fn index_unsigned<T: Pod + Into<u64>>(x: &[u64], out: &mut [u64], n: usize) {
    for (o, &x) in out[..n].iter_mut().zip(view::<T>(x, n)) {
        *o = x.into();
    }
}

/// The index conversion of an integer type.
pub(crate) fn index_fn(elem: ElemType) -> Option<IndexFn> {
    Some(match elem {
        ElemType::I8 => index_signed::<i8>,
        ElemType::I16 => index_signed::<i16>,
        ElemType::I32 => index_signed::<i32>,
        ElemType::I64 => index_signed::<i64>,
        ElemType::U8 => index_unsigned::<u8>,
        ElemType::U16 => index_unsigned::<u16>,
        ElemType::U32 => index_unsigned::<u32>,
        ElemType::U64 => index_unsigned::<u64>,
        _ => return None,
    })
}
