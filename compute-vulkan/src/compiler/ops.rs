//! Per-component arithmetic, comparisons and conversions with the IR's semantics.

use compute_core::ElemType;
use compute_core::ServerError;
use compute_core::kernel::{BinaryOp, CmpOp, UnaryOp};
use spirv::Op;

use super::emit::{Emitter, bits};
use super::words::gl;

impl Emitter<'_> {
    /// Round an `f32` to the nearest `bf16` (ties to even), as an `f32`; NaN stays NaN.
    pub fn round_bf16(&mut self, x: u32) -> u32 {
        let u = self.m.t_u32();
        let f = self.m.t_float(32);
        let bt = self.m.t_bool();
        let b = self.op(Op::Bitcast, u, &[x]);
        let abs_mask = self.m.c_u32(0x7fff_ffff);
        let inf = self.m.c_u32(0x7f80_0000);
        let a = self.op(Op::BitwiseAnd, u, &[b, abs_mask]);
        let nan = self.op(Op::UGreaterThan, bt, &[a, inf]);
        let s16 = self.m.c_u32(16);
        let one = self.m.c_u32(1);
        let half = self.m.c_u32(0x7fff);
        let hi_mask = self.m.c_u32(0xffff_0000);
        let quiet = self.m.c_u32(0x0040_0000);
        let sh = self.op(Op::ShiftRightLogical, u, &[b, s16]);
        let lsb = self.op(Op::BitwiseAnd, u, &[sh, one]);
        let bias = self.op(Op::IAdd, u, &[half, lsb]);
        let r = self.op(Op::IAdd, u, &[b, bias]);
        let r = self.op(Op::BitwiseAnd, u, &[r, hi_mask]);
        let q = self.op(Op::BitwiseOr, u, &[b, quiet]);
        let q = self.op(Op::BitwiseAnd, u, &[q, hi_mask]);
        let r = self.op(Op::Select, u, &[nan, q, r]);
        self.op(Op::Bitcast, f, &[r])
    }

    /// A float register value widened to its compute type for math (`f32` for 16-bit floats).
    pub fn widen_math(&mut self, elem: ElemType, x: u32) -> u32 {
        if elem == ElemType::F16 {
            let f = self.m.t_float(32);
            self.op(Op::FConvert, f, &[x])
        } else {
            x
        }
    }

    /// A compute-type result converted back to the register type of `elem`.
    pub fn narrow_math(&mut self, elem: ElemType, x: u32) -> u32 {
        match elem {
            ElemType::F16 => {
                let h = self.m.t_float(16);
                self.op(Op::FConvert, h, &[x])
            }
            ElemType::BF16 => self.round_bf16(x),
            _ => x,
        }
    }

    /// Finish a float result computed in the register type (rounds `bf16`).
    fn fin(&mut self, elem: ElemType, x: u32) -> u32 {
        if elem == ElemType::BF16 {
            self.round_bf16(x)
        } else {
            x
        }
    }

    /// One component of a unary operation.
    pub fn unary(&mut self, op: UnaryOp, elem: ElemType, x: u32) -> Result<u32, ServerError> {
        let ty = self.reg_ty(elem);
        let bt = self.m.t_bool();
        if elem == ElemType::Bool {
            return match op {
                UnaryOp::Not | UnaryOp::BitNot => Ok(self.op(Op::LogicalNot, bt, &[x])),
                other => Err(self.bad(format!("{} on bool", other.name()))),
            };
        }
        if elem.is_int() {
            return match op {
                UnaryOp::Neg => Ok(self.op(Op::SNegate, ty, &[x])),
                UnaryOp::Abs => {
                    if elem.is_signed_int() {
                        let z = self.const_bits(elem, 0);
                        let neg = self.op(Op::SLessThan, bt, &[x, z]);
                        let n = self.op(Op::SNegate, ty, &[x]);
                        Ok(self.op(Op::Select, ty, &[neg, n, x]))
                    } else {
                        Ok(x)
                    }
                }
                UnaryOp::BitNot => Ok(self.op(Op::Not, ty, &[x])),
                UnaryOp::Not => {
                    let z = self.const_bits(elem, 0);
                    Ok(self.op(Op::IEqual, bt, &[x, z]))
                }
                other => Err(self.bad(format!("{} on {elem}", other.name()))),
            };
        }
        // Floats.
        Ok(match op {
            UnaryOp::Neg => self.op(Op::FNegate, ty, &[x]),
            UnaryOp::Abs => self.gl(ty, gl::FABS, &[x]),
            UnaryOp::Floor => self.gl(ty, gl::FLOOR, &[x]),
            UnaryOp::Ceil => self.gl(ty, gl::CEIL, &[x]),
            UnaryOp::Round if elem == ElemType::F64 => self.round_even64(x),
            UnaryOp::Round => self.gl(ty, gl::ROUND_EVEN, &[x]),
            UnaryOp::Sqrt => {
                let r = self.gl(ty, gl::SQRT, &[x]);
                self.fin(elem, r)
            }
            UnaryOp::Recip => {
                let one = self.const_of(elem, 1.0);
                let r = self.op(Op::FDiv, ty, &[one, x]);
                self.fin(elem, r)
            }
            UnaryOp::Not => {
                let z = self.const_of(elem, 0.0);
                self.op(Op::FOrdEqual, bt, &[x, z])
            }
            UnaryOp::BitNot => return Err(self.bad(format!("bit_not on {elem}"))),
            UnaryOp::Rsqrt
            | UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Log1p
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tanh
            | UnaryOp::Erf => {
                let m = self.widen_math(elem, x);
                let mb = if elem == ElemType::F64 { 64 } else { 32 };
                let r = self.math_unary(op, mb, m)?;
                self.narrow_math(elem, r)
            }
        })
    }

    /// Round half to even for `f64` from `floor` (some drivers' `f64` `RoundEven` rounds half
    /// away from zero): `d = x - floor(x)` is exact, ties go to the even neighbour.
    fn round_even64(&mut self, x: u32) -> u32 {
        let t = self.m.t_float(64);
        let bt = self.m.t_bool();
        let f = self.gl(t, gl::FLOOR, &[x]);
        let d = self.op(Op::FSub, t, &[x, f]);
        let half = self.m.c_float(64, 0.5);
        let one = self.m.c_float(64, 1.0);
        let f1 = self.op(Op::FAdd, t, &[f, one]);
        let hf = self.op(Op::FMul, t, &[f, half]);
        let hff = self.gl(t, gl::FLOOR, &[hf]);
        let even = self.op(Op::FOrdEqual, bt, &[hf, hff]);
        let tie = self.op(Op::Select, t, &[even, f, f1]);
        let up = self.op(Op::FOrdGreaterThan, bt, &[d, half]);
        let down = self.op(Op::FOrdLessThan, bt, &[d, half]);
        let r = self.op(Op::Select, t, &[up, f1, tie]);
        let r = self.op(Op::Select, t, &[down, f, r]);
        // NaN and infinities: floor passes them through (d is NaN).
        let nan = self.op(Op::IsNan, bt, &[d]);
        self.op(Op::Select, t, &[nan, x, r])
    }

    /// One component of a binary operation.
    pub fn binary(
        &mut self,
        op: BinaryOp,
        elem: ElemType,
        a: u32,
        b: u32,
    ) -> Result<u32, ServerError> {
        let ty = self.reg_ty(elem);
        let bt = self.m.t_bool();
        if elem == ElemType::Bool {
            return match op {
                BinaryOp::And | BinaryOp::BitAnd | BinaryOp::Min => {
                    Ok(self.op(Op::LogicalAnd, bt, &[a, b]))
                }
                BinaryOp::Or | BinaryOp::BitOr | BinaryOp::Max => {
                    Ok(self.op(Op::LogicalOr, bt, &[a, b]))
                }
                BinaryOp::BitXor => Ok(self.op(Op::LogicalNotEqual, bt, &[a, b])),
                other => Err(self.bad(format!("{} on bool", other.name()))),
            };
        }
        if elem.is_float() {
            let r = match op {
                BinaryOp::Add => self.op(Op::FAdd, ty, &[a, b]),
                BinaryOp::Sub => self.op(Op::FSub, ty, &[a, b]),
                BinaryOp::Mul => self.op(Op::FMul, ty, &[a, b]),
                BinaryOp::Div => self.op(Op::FDiv, ty, &[a, b]),
                BinaryOp::Rem => {
                    let x = self.widen_math(elem, a);
                    let y = self.widen_math(elem, b);
                    let mb = if elem == ElemType::F64 { 64 } else { 32 };
                    let r = self.fmod(mb, x, y);
                    // The exact remainder is representable in the operands' type.
                    return Ok(if elem == ElemType::F16 {
                        self.narrow_math(elem, r)
                    } else {
                        r
                    });
                }
                // NMin/NMax: a NaN operand yields the other one (C `fmin`, Rust `f32::min`).
                BinaryOp::Min => return Ok(self.gl(ty, gl::NMIN, &[a, b])),
                BinaryOp::Max => return Ok(self.gl(ty, gl::NMAX, &[a, b])),
                BinaryOp::Pow => {
                    let x = self.widen_math(elem, a);
                    let y = self.widen_math(elem, b);
                    let mb = if elem == ElemType::F64 { 64 } else { 32 };
                    let r = self.pow(mb, x, y);
                    return Ok(self.narrow_math(elem, r));
                }
                other => return Err(self.bad(format!("{} on {elem}", other.name()))),
            };
            return Ok(self.fin(elem, r));
        }
        let signed = elem.is_signed_int();
        let n = bits(elem);
        Ok(match op {
            BinaryOp::Add => self.op(Op::IAdd, ty, &[a, b]),
            BinaryOp::Sub => self.op(Op::ISub, ty, &[a, b]),
            BinaryOp::Mul => self.op(Op::IMul, ty, &[a, b]),
            BinaryOp::Div | BinaryOp::Rem => {
                let z = self.m.c_int(n, 0);
                let one = self.m.c_int(n, 1);
                let is0 = self.op(Op::IEqual, bt, &[b, z]);
                if signed {
                    let m1 = self.m.c_int(n, u64::MAX);
                    let ism1 = self.op(Op::IEqual, bt, &[b, m1]);
                    let special = self.op(Op::LogicalOr, bt, &[is0, ism1]);
                    let safe = self.op(Op::Select, ty, &[special, one, b]);
                    if op == BinaryOp::Div {
                        let q = self.op(Op::SDiv, ty, &[a, safe]);
                        let neg = self.op(Op::SNegate, ty, &[a]);
                        let q = self.op(Op::Select, ty, &[ism1, neg, q]);
                        self.op(Op::Select, ty, &[is0, a, q])
                    } else {
                        // `a - (a / b) * b` rather than OpSRem: NVIDIA's driver computes OpSRem of
                        // a negative dividend as an unsigned remainder (rem(-1, 2) == 1 on the
                        // H200), while its OpSDiv truncates correctly.
                        let q = self.op(Op::SDiv, ty, &[a, safe]);
                        let qb = self.op(Op::IMul, ty, &[q, safe]);
                        let r = self.op(Op::ISub, ty, &[a, qb]);
                        self.op(Op::Select, ty, &[special, z, r])
                    }
                } else {
                    let safe = self.op(Op::Select, ty, &[is0, one, b]);
                    if op == BinaryOp::Div {
                        let q = self.op(Op::UDiv, ty, &[a, safe]);
                        self.op(Op::Select, ty, &[is0, a, q])
                    } else {
                        let r = self.op(Op::UMod, ty, &[a, safe]);
                        self.op(Op::Select, ty, &[is0, z, r])
                    }
                }
            }
            BinaryOp::Min | BinaryOp::Max => {
                let o = match (op == BinaryOp::Min, signed) {
                    (true, true) => Op::SLessThan,
                    (true, false) => Op::ULessThan,
                    (false, true) => Op::SGreaterThan,
                    (false, false) => Op::UGreaterThan,
                };
                let c = self.op(o, bt, &[a, b]);
                self.op(Op::Select, ty, &[c, a, b])
            }
            BinaryOp::Pow => {
                // Integer pow (the builder rejects it): through f64 when available, else f32.
                let fe = if self.caps.float64 {
                    ElemType::F64
                } else {
                    ElemType::F32
                };
                let x = self.cast(elem, fe, a)?;
                let y = self.cast(elem, fe, b)?;
                let r = self.pow(bits(fe), x, y);
                self.cast(fe, elem, r)?
            }
            BinaryOp::BitAnd | BinaryOp::And => self.op(Op::BitwiseAnd, ty, &[a, b]),
            BinaryOp::BitOr | BinaryOp::Or => self.op(Op::BitwiseOr, ty, &[a, b]),
            BinaryOp::BitXor => self.op(Op::BitwiseXor, ty, &[a, b]),
            BinaryOp::Shl | BinaryOp::Shr => {
                let mask = self.m.c_int(n, u64::from(n - 1));
                let s = self.op(Op::BitwiseAnd, ty, &[b, mask]);
                let o = match (op, signed) {
                    (BinaryOp::Shl, _) => Op::ShiftLeftLogical,
                    (_, true) => Op::ShiftRightArithmetic,
                    _ => Op::ShiftRightLogical,
                };
                self.op(o, ty, &[a, s])
            }
        })
    }

    /// One component of a comparison.
    pub fn compare(&mut self, op: CmpOp, elem: ElemType, a: u32, b: u32) -> u32 {
        let bt = self.m.t_bool();
        let o = if elem == ElemType::Bool {
            match op {
                CmpOp::Eq => Op::LogicalEqual,
                CmpOp::Ne => Op::LogicalNotEqual,
                // false < true: compare as integers.
                _ => {
                    let u = self.m.t_u32();
                    let one = self.m.c_u32(1);
                    let zero = self.m.c_u32(0);
                    let x = self.op(Op::Select, u, &[a, one, zero]);
                    let y = self.op(Op::Select, u, &[b, one, zero]);
                    return self.compare(op, ElemType::U32, x, y);
                }
            }
        } else if elem.is_float() {
            match op {
                CmpOp::Eq => Op::FOrdEqual,
                CmpOp::Ne => Op::FUnordNotEqual,
                CmpOp::Lt => Op::FOrdLessThan,
                CmpOp::Le => Op::FOrdLessThanEqual,
                CmpOp::Gt => Op::FOrdGreaterThan,
                CmpOp::Ge => Op::FOrdGreaterThanEqual,
            }
        } else {
            let s = elem.is_signed_int();
            match op {
                CmpOp::Eq => Op::IEqual,
                CmpOp::Ne => Op::INotEqual,
                CmpOp::Lt if s => Op::SLessThan,
                CmpOp::Lt => Op::ULessThan,
                CmpOp::Le if s => Op::SLessThanEqual,
                CmpOp::Le => Op::ULessThanEqual,
                CmpOp::Gt if s => Op::SGreaterThan,
                CmpOp::Gt => Op::UGreaterThan,
                CmpOp::Ge if s => Op::SGreaterThanEqual,
                CmpOp::Ge => Op::UGreaterThanEqual,
            }
        };
        self.op(o, bt, &[a, b])
    }

    /// One component of `a * b + c`.
    pub fn fma(&mut self, elem: ElemType, a: u32, b: u32, c: u32) -> Result<u32, ServerError> {
        if elem == ElemType::F16 {
            // Fused in f32 (the f16 product is exact there; some drivers do not fuse f16 fma).
            let (x, y, z) = (
                self.widen_math(elem, a),
                self.widen_math(elem, b),
                self.widen_math(elem, c),
            );
            let f = self.m.t_float(32);
            let r = self.gl(f, gl::FMA, &[x, y, z]);
            Ok(self.narrow_math(elem, r))
        } else if elem.is_float() {
            let ty = self.reg_ty(elem);
            let r = self.gl(ty, gl::FMA, &[a, b, c]);
            Ok(self.fin(elem, r))
        } else {
            let p = self.binary(BinaryOp::Mul, elem, a, b)?;
            self.binary(BinaryOp::Add, elem, p, c)
        }
    }

    /// One component converted between element types (the IR's `Cast`).
    pub fn cast(&mut self, from: ElemType, to: ElemType, x: u32) -> Result<u32, ServerError> {
        if from == to {
            return Ok(x);
        }
        let bt = self.m.t_bool();
        let tt = self.reg_ty(to);
        if to == ElemType::Bool {
            return Ok(if from.is_float() {
                let z = self.const_of(from, 0.0);
                self.op(Op::FUnordNotEqual, bt, &[x, z])
            } else {
                let z = self.const_bits(from, 0);
                self.op(Op::INotEqual, bt, &[x, z])
            });
        }
        if from == ElemType::Bool {
            let one = self.const_of(to, 1.0);
            let zero = self.const_of(to, 0.0);
            return Ok(self.op(Op::Select, tt, &[x, one, zero]));
        }
        Ok(match (from.is_float(), to.is_float()) {
            (true, true) => {
                // Register types: f16, f32 (f32 and bf16), f64.
                let fr = self.reg_ty(from);
                let r = if fr == tt {
                    x
                } else {
                    self.op(Op::FConvert, tt, &[x])
                };
                self.fin(to, r)
            }
            (false, true) => {
                let o = if from.is_signed_int() {
                    Op::ConvertSToF
                } else {
                    Op::ConvertUToF
                };
                let r = self.op(o, tt, &[x]);
                self.fin(to, r)
            }
            (true, false) => self.float_to_int(from, to, x),
            (false, false) => {
                if bits(from) == bits(to) {
                    x
                } else if from.is_signed_int() {
                    self.op(Op::SConvert, tt, &[x])
                } else {
                    self.op(Op::UConvert, tt, &[x])
                }
            }
        })
    }

    /// Saturating float-to-integer conversion, NaN to 0.
    fn float_to_int(&mut self, from: ElemType, to: ElemType, x: u32) -> u32 {
        let bt = self.m.t_bool();
        let tt = self.reg_ty(to);
        let (fx, fb) = if from == ElemType::F64 {
            (x, 64)
        } else {
            (self.widen_math(from, x), 32)
        };
        let n = bits(to);
        let signed = to.is_signed_int();
        let (lo, hi) = if signed {
            (-(2f64.powi(n as i32 - 1)), 2f64.powi(n as i32 - 1))
        } else {
            (0.0, 2f64.powi(n as i32))
        };
        let (imin, imax) = if signed {
            (1u64 << (n - 1), (1u64 << (n - 1)) - 1)
        } else {
            (0, if n == 64 { u64::MAX } else { (1u64 << n) - 1 })
        };
        let clo = self.m.c_float(fb, lo);
        let chi = self.m.c_float(fb, hi);
        let wide = if n == 64 { 64 } else { 32 };
        let wt = self.m.t_int(wide);
        let conv = if signed {
            self.op(Op::ConvertFToS, wt, &[fx])
        } else {
            self.op(Op::ConvertFToU, wt, &[fx])
        };
        let conv = if wide != n {
            self.op(Op::UConvert, tt, &[conv])
        } else {
            conv
        };
        let below = self.op(Op::FOrdLessThanEqual, bt, &[fx, clo]);
        let above = self.op(Op::FOrdGreaterThanEqual, bt, &[fx, chi]);
        let nan = self.op(Op::IsNan, bt, &[fx]);
        let cmin = self.m.c_int(n, imin);
        let cmax = self.m.c_int(n, imax);
        let z = self.m.c_int(n, 0);
        let r = self.op(Op::Select, tt, &[above, cmax, conv]);
        let r = self.op(Op::Select, tt, &[below, cmin, r]);
        self.op(Op::Select, tt, &[nan, z, r])
    }

    /// The bits of a register scalar as an unsigned integer of the element's size.
    fn bits_of(&mut self, elem: ElemType, x: u32) -> u32 {
        let n = bits(elem);
        let it = self.m.t_int(n);
        match elem {
            ElemType::Bool => {
                let one = self.m.c_int(8, 1);
                let zero = self.m.c_int(8, 0);
                self.op(Op::Select, it, &[x, one, zero])
            }
            ElemType::BF16 => {
                let u = self.m.t_u32();
                let b = self.op(Op::Bitcast, u, &[x]);
                let s = self.m.c_u32(16);
                let sh = self.op(Op::ShiftRightLogical, u, &[b, s]);
                self.op(Op::UConvert, it, &[sh])
            }
            ElemType::F16 | ElemType::F32 | ElemType::F64 => self.op(Op::Bitcast, it, &[x]),
            _ => x,
        }
    }

    /// A register scalar from its bits.
    fn value_of_bits(&mut self, elem: ElemType, b: u32) -> u32 {
        let ty = self.reg_ty(elem);
        match elem {
            ElemType::Bool => {
                let bt = self.m.t_bool();
                let z = self.m.c_int(8, 0);
                self.op(Op::INotEqual, bt, &[b, z])
            }
            ElemType::BF16 => {
                let u = self.m.t_u32();
                let w = self.op(Op::UConvert, u, &[b]);
                let s = self.m.c_u32(16);
                let sh = self.op(Op::ShiftLeftLogical, u, &[w, s]);
                self.op(Op::Bitcast, ty, &[sh])
            }
            ElemType::F16 | ElemType::F32 | ElemType::F64 => self.op(Op::Bitcast, ty, &[b]),
            _ => b,
        }
    }

    /// Reinterpret the bits of a value (`xs`, little-endian components) as `width` components
    /// of `to`.
    pub fn bitcast(
        &mut self,
        from: ElemType,
        to: ElemType,
        xs: &[u32],
        width: usize,
    ) -> Result<Vec<u32>, ServerError> {
        let (fb, tb) = (bits(from), bits(to));
        if fb as usize * xs.len() != tb as usize * width {
            return Err(self.bad(format!(
                "bitcast of {} x {from} to {width} x {to} changes the size",
                xs.len()
            )));
        }
        let src: Vec<u32> = xs.iter().map(|&x| self.bits_of(from, x)).collect();
        let mut out = Vec::with_capacity(width);
        if fb == tb {
            out = src;
        } else if fb > tb {
            let k = fb / tb;
            let ft = self.m.t_int(fb);
            let tt = self.m.t_int(tb);
            for s in src {
                for j in 0..k {
                    let sh = if j == 0 {
                        s
                    } else {
                        let c = self.m.c_int(fb, u64::from(j * tb));
                        self.op(Op::ShiftRightLogical, ft, &[s, c])
                    };
                    out.push(self.op(Op::UConvert, tt, &[sh]));
                }
            }
        } else {
            let k = (tb / fb) as usize;
            let tt = self.m.t_int(tb);
            for chunk in src.chunks(k) {
                let mut acc = None;
                for (j, &s) in chunk.iter().enumerate() {
                    let w = self.op(Op::UConvert, tt, &[s]);
                    let w = if j == 0 {
                        w
                    } else {
                        let c = self.m.c_int(tb, (j as u64) * u64::from(fb));
                        self.op(Op::ShiftLeftLogical, tt, &[w, c])
                    };
                    acc = Some(match acc {
                        None => w,
                        Some(a) => self.op(Op::BitwiseOr, tt, &[a, w]),
                    });
                }
                out.push(acc.unwrap_or(0));
            }
        }
        Ok(out.into_iter().map(|b| self.value_of_bits(to, b)).collect())
    }
}
