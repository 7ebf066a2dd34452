//! The JIT against the interpreter: the same kernels on the same inputs give the same bits.
//!
//! Size: a test file; each test is one operation family checked against the interpreter.

use compute_core::elem::ElemType;
use compute_core::kernel::{BinaryOp, CmpOp, KernelBuilder, KernelDefinition, UnaryOp};

use super::super::{Executor, HostArg, compile_interpreted, plan::compile_with};

/// Deterministic bytes with edge values mixed in: 0, all ones, sign bits, NaN, infinities.
fn input(elem: ElemType, n: usize, seed: u64) -> Vec<u8> {
    let size = elem.size();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n * size);
    let edges: &[u64] = match elem {
        ElemType::F32 => &[
            0,
            0x8000_0000,
            0x3f80_0000,
            0xbf80_0000,
            0x7fc0_0000,
            0x7f80_0000,
            0xff80_0000,
            0x4f00_0000,
            0xcf00_0001,
            0x3f00_0000,
            0x4040_0000,
        ],
        ElemType::F64 => &[
            0,
            0x8000_0000_0000_0000,
            0x3ff0_0000_0000_0000,
            0x7ff8_0000_0000_0000,
            0x7ff0_0000_0000_0000,
            0x43e0_0000_0000_0000,
            0x3fe0_0000_0000_0000,
        ],
        ElemType::F16 => &[0, 0x8000, 0x3c00, 0x7e00, 0x7c00, 0x3800, 0x5640],
        ElemType::BF16 => &[0, 0x8000, 0x3f80, 0x7fc0, 0x7f80, 0x3f00],
        ElemType::Bool => &[0, 1],
        _ => &[
            0,
            1,
            u64::MAX,
            1 << (size * 8 - 1),
            (1 << (size * 8 - 1)) - 1,
            2,
            7,
        ],
    };
    for i in 0..n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let mut v = if i % 3 == 0 {
            edges[(i / 3) % edges.len()]
        } else {
            s
        };
        match elem {
            ElemType::Bool => v &= 1,
            // Moderate floats, so arithmetic is not all overflow.
            ElemType::F32 if i % 3 != 0 => {
                v = (((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 200.0).to_bits() as u64
            }
            ElemType::F64 if i % 3 != 0 => {
                v = (((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 200.0).to_bits()
            }
            ElemType::F16 if i % 3 != 0 => {
                v = half::f16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 50.0)
                    .to_bits() as u64
            }
            ElemType::BF16 if i % 3 != 0 => {
                v = half::bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 50.0)
                    .to_bits() as u64
            }
            _ => {}
        }
        out.extend_from_slice(&v.to_le_bytes()[..size]);
    }
    out
}

fn same(elem: ElemType, a: &[u8], b: &[u8]) -> bool {
    let size = elem.size();
    a.chunks(size).zip(b.chunks(size)).all(|(x, y)| {
        if x == y {
            return true;
        }
        // NaNs may differ in payload.
        match elem {
            ElemType::F32 => {
                f32::from_le_bytes(x.try_into().unwrap()).is_nan()
                    && f32::from_le_bytes(y.try_into().unwrap()).is_nan()
            }
            ElemType::F64 => {
                f64::from_le_bytes(x.try_into().unwrap()).is_nan()
                    && f64::from_le_bytes(y.try_into().unwrap()).is_nan()
            }
            ElemType::F16 => {
                half::f16::from_le_bytes(x.try_into().unwrap()).is_nan()
                    && half::f16::from_le_bytes(y.try_into().unwrap()).is_nan()
            }
            ElemType::BF16 => {
                half::bf16::from_le_bytes(x.try_into().unwrap()).is_nan()
                    && half::bf16::from_le_bytes(y.try_into().unwrap()).is_nan()
            }
            _ => false,
        }
    })
}

/// Run `def` on both executors over `inputs` (read-only) and a zeroed output of `out_bytes`;
/// assert the JIT ran and the outputs agree.
fn check(
    def: &KernelDefinition,
    cubes: u32,
    inputs: &[Vec<u8>],
    out_elem: ElemType,
    out_bytes: usize,
) {
    let jit = compile_with(def, true).unwrap();
    assert_eq!(
        jit.executor(),
        Executor::Jit,
        "kernel `{}` fell back: {:?}",
        def.name(),
        jit.jit_fallback()
    );
    let interp = compile_interpreted(def).unwrap();
    assert_eq!(interp.executor(), Executor::Interpreter);
    let mut outs = Vec::new();
    for plan in [&jit, &interp] {
        let mut ins: Vec<Vec<u8>> = inputs.to_vec();
        let mut out = vec![0u8; out_bytes];
        let mut args: Vec<HostArg<'_>> = ins.iter_mut().map(|b| HostArg::new(b)).collect();
        args.push(HostArg::new(&mut out));
        plan.execute_host([cubes, 1, 1], &mut args, &[]).unwrap();
        outs.push(out);
    }
    assert!(
        same(out_elem, &outs[0], &outs[1]),
        "kernel `{}`: JIT {:?}\ninterpreter {:?}",
        def.name(),
        &outs[0][..outs[0].len().min(64)],
        &outs[1][..outs[1].len().min(64)]
    );
}

const N: usize = 256;

fn binary_kernel(op: BinaryOp, elem: ElemType, width: u8) -> Option<KernelDefinition> {
    let mut k = KernelBuilder::new(&format!("bin_{}_{elem}_{width}", op.name()), [32, 1, 1]);
    let a = k.input("a", elem, width);
    let b = k.input("b", elem, width);
    let o = k.output("o", elem, width);
    let i = k.absolute_pos();
    let x = k.load(a, i);
    let y = k.load(b, i);
    let r = k.binary(op, x, y);
    k.store(o, i, r);
    k.build().ok()
}

#[test]
fn binary_ops_match_the_interpreter() {
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::Pow,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::BitAnd,
        BinaryOp::BitOr,
        BinaryOp::BitXor,
        BinaryOp::Shl,
        BinaryOp::Shr,
    ];
    let mut ran = 0;
    for elem in ElemType::ALL {
        for width in [1u8, 2, 4, 8] {
            for op in ops {
                let Some(def) = binary_kernel(op, elem, width) else {
                    continue;
                };
                let n = N * width as usize;
                let ins = [input(elem, n, 1), input(elem, n, 2)];
                check(&def, (N / 32) as u32, &ins, elem, n * elem.size());
                ran += 1;
            }
        }
    }
    assert!(ran > 200, "only {ran} kernels built");
}

#[test]
fn unary_ops_and_comparisons_match_the_interpreter() {
    let ops = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Not,
        UnaryOp::BitNot,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Log1p,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Recip,
    ];
    let mut ran = 0;
    for elem in ElemType::ALL {
        for width in [1u8, 4] {
            let n = N * width as usize;
            let ins = [input(elem, n, 3)];
            for op in ops {
                let mut k = KernelBuilder::new(&format!("un_{}_{elem}", op.name()), [32, 1, 1]);
                let a = k.input("a", elem, width);
                let o = k.output("o", elem, width);
                let i = k.absolute_pos();
                let x = k.load(a, i);
                let r = k.unary(op, x);
                k.store(o, i, r);
                let Ok(def) = k.build() else { continue };
                check(&def, (N / 32) as u32, &ins, elem, n * elem.size());
                ran += 1;
            }
            for c in [
                CmpOp::Eq,
                CmpOp::Ne,
                CmpOp::Lt,
                CmpOp::Le,
                CmpOp::Gt,
                CmpOp::Ge,
            ] {
                let mut k = KernelBuilder::new(&format!("cmp_{}_{elem}", c.name()), [32, 1, 1]);
                let a = k.input("a", elem, width);
                let b = k.input("b", elem, width);
                let o = k.output("o", ElemType::Bool, width);
                let i = k.absolute_pos();
                let x = k.load(a, i);
                let y = k.load(b, i);
                let r = k.compare(c, x, y);
                k.store(o, i, r);
                let def = k.build().unwrap();
                let ins = [input(elem, n, 4), input(elem, n, 4 + (ran % 2) as u64)];
                check(&def, (N / 32) as u32, &ins, ElemType::Bool, n);
                ran += 1;
            }
        }
    }
    assert!(ran > 150, "only {ran} kernels built");
}

#[test]
fn casts_fma_clamp_select_match_the_interpreter() {
    for from in ElemType::ALL {
        for width in [1u8, 4] {
            let n = N * width as usize;
            let ins = [input(from, n, 5)];
            for to in ElemType::ALL {
                let mut k = KernelBuilder::new(&format!("cast_{from}_{to}"), [32, 1, 1]);
                let a = k.input("a", from, width);
                let o = k.output("o", to, width);
                let i = k.absolute_pos();
                let x = k.load(a, i);
                let r = k.cast(x, to);
                k.store(o, i, r);
                check(
                    &k.build().unwrap(),
                    (N / 32) as u32,
                    &ins,
                    to,
                    n * to.size(),
                );
            }
            if from == ElemType::Bool {
                continue;
            }
            let ins3 = [input(from, n, 6), input(from, n, 7), input(from, n, 8)];
            let mut k = KernelBuilder::new(&format!("clamp_sel_{from}"), [32, 1, 1]);
            let a = k.input("a", from, width);
            let b = k.input("b", from, width);
            let c = k.input("c", from, width);
            let o = k.output("o", from, width);
            let i = k.absolute_pos();
            let (x, y, z) = (k.load(a, i), k.load(b, i), k.load(c, i));
            let r = k.clamp(x, y, z);
            let lt = k.lt(r, y);
            let r = k.select(lt, x, r);
            k.store(o, i, r);
            check(
                &k.build().unwrap(),
                (N / 32) as u32,
                &ins3,
                from,
                n * from.size(),
            );
            if from.is_float() {
                let mut k = KernelBuilder::new(&format!("fma_{from}"), [32, 1, 1]);
                let a = k.input("a", from, width);
                let b = k.input("b", from, width);
                let c = k.input("c", from, width);
                let o = k.output("o", from, width);
                let i = k.absolute_pos();
                let (x, y, z) = (k.load(a, i), k.load(b, i), k.load(c, i));
                let r = k.fma(x, y, z);
                k.store(o, i, r);
                check(
                    &k.build().unwrap(),
                    (N / 32) as u32,
                    &ins3,
                    from,
                    n * from.size(),
                );
            }
        }
    }
}

#[test]
fn control_flow_barriers_and_shared_memory_match_the_interpreter() {
    // Per-unit loops with break/continue/return, then a barrier-split tree over shared memory
    // inside a uniform range loop, with values and variables crossing the barriers.
    let mut k = KernelBuilder::new("mixed", [64, 1, 1]);
    let a = k.input("a", ElemType::U32, 1);
    let o = k.output("o", ElemType::U32, 1);
    let tree = k.shared("tree", ElemType::U32, 1, 64);
    let unit = k.unit_pos();
    let i = k.absolute_pos();
    let x = k.load(a, i);
    let lim = k.rem(x, 23u32);
    let acc = k.var(0u32);
    k.loop_(|k| {
        let c = k.get(acc);
        let done = k.ge(c, lim);
        k.if_(done, |k| k.break_());
        let odd = k.bit_and(c, 1u32);
        let odd = k.eq(odd, 1u32);
        k.if_(odd, |k| {
            let c = k.get(acc);
            let c = k.add(c, 3u32);
            k.assign(acc, c);
            k.continue_();
        });
        let c = k.get(acc);
        let c = k.add(c, 1u32);
        k.assign(acc, c);
    });
    let total = k.var(0u32);
    k.range(0u32, 3u32, 1u32, |k, round| {
        let v = k.get(acc);
        let v = k.add(v, round);
        k.store(tree, unit, v);
        k.barrier();
        let mut stride = 32u32;
        while stride > 0 {
            let active = k.lt(unit, stride);
            k.if_(active, |k| {
                let other = k.add(unit, stride);
                let p = k.load(tree, unit);
                let q = k.load(tree, other);
                let s = k.add(p, q);
                k.store(tree, unit, s);
            });
            k.barrier();
            stride /= 2;
        }
        let s = k.load(tree, 0u32);
        let t = k.get(total);
        let t = k.add(t, s);
        let t = k.add(t, x);
        k.assign(total, t);
        k.barrier();
    });
    let quit = k.eq(lim, 5u32);
    k.if_(quit, |k| k.return_());
    let t = k.get(total);
    k.store(o, i, t);
    let def = k.build().unwrap();
    let n = 64 * 8;
    let ins = [input(ElemType::U32, n, 9)];
    check(&def, 8, &ins, ElemType::U32, n * 4);
}

#[test]
fn kernels_the_jit_leaves_to_the_interpreter() {
    // A plane operation in a per-unit range loop.
    let mut k = KernelBuilder::new("plane_in_range", [32, 1, 1]);
    let o = k.output("o", ElemType::U32, 1);
    let u = k.unit_pos();
    k.range(0u32, u, 1u32, |k, j| {
        let s = k.plane_sum(j);
        k.store(o, u, s);
    });
    let plan = compile_with(&k.build().unwrap(), true).unwrap();
    assert_eq!(plan.executor(), Executor::Interpreter);
    assert!(plan.jit_fallback().unwrap().contains("not uniform"));

    // A break out of a range loop that holds a barrier.
    let mut k = KernelBuilder::new("break_range_barrier", [32, 1, 1]);
    let o = k.output("o", ElemType::U32, 1);
    let u = k.unit_pos();
    k.range(0u32, 4u32, 1u32, |k, j| {
        k.barrier();
        let c = k.eq(j, u);
        k.if_(c, |k| k.break_());
    });
    k.store(o, u, u);
    let plan = compile_with(&k.build().unwrap(), true).unwrap();
    assert_eq!(plan.executor(), Executor::Interpreter);
    assert!(plan.jit_fallback().unwrap().contains("range loop"));
}

#[test]
fn partial_last_cube_is_bounds_checked() {
    // Unguarded `absolute_pos` accesses: full cubes take the unchecked loop, the last cube the
    // checked one (its out-of-range loads read 0, its stores are dropped).
    for width in [1u8, 4] {
        let mut k = KernelBuilder::new("partial", [64, 1, 1]);
        let a = k.input("a", ElemType::F32, width);
        let b = k.input("b", ElemType::F32, width);
        let o = k.output("o", ElemType::F32, width);
        let i = k.absolute_pos();
        let x = k.load(a, i);
        let y = k.load(b, i);
        let s = k.add(x, y);
        k.store(o, i, s);
        let def = k.build().unwrap();
        let n = 1000 * width as usize;
        let ins = [
            input(ElemType::F32, n, 10),
            input(ElemType::F32, n - 3 * width as usize, 11),
        ];
        check(&def, 16, &ins, ElemType::F32, (n - 7 * width as usize) * 4);
    }
}

#[test]
fn plane_ops_match_the_interpreter() {
    // Plane operations at the top level, some units returned before them.
    let mut k = KernelBuilder::new("planes", [96, 1, 1]);
    let a = k.input("a", ElemType::F32, 1);
    let o = k.output("o", ElemType::F32, 4);
    let m = k.output("m", ElemType::U32, 4);
    let i = k.absolute_pos();
    let u = k.unit_pos();
    let x = k.load(a, i);
    let skip = k.rem(u, 7u32);
    let skip = k.eq(skip, 3u32);
    k.if_(skip, |k| k.return_());
    let s = k.plane_sum(x);
    let mx = k.plane_max(x);
    let three = k.lit_u32(3);
    let b = k.plane_broadcast(x, three);
    let lane = k.bit_xor(u, 5u32);
    let sh = k.plane_shuffle(x, lane);
    let v = k.vector(&[s, mx, b, sh]);
    k.store(o, i, v);
    let pos = k.gt(x, 0.0f32);
    let bal = k.ballot(pos);
    k.store(m, i, bal);
    let def = k.build().unwrap();
    let n = 96 * 3;
    let jit = compile_with(&def, true).unwrap();
    assert_eq!(jit.executor(), Executor::Jit, "{:?}", jit.jit_fallback());
    let interp = compile_interpreted(&def).unwrap();
    let mut outs = Vec::new();
    for plan in [&jit, &interp] {
        let mut ins = input(ElemType::F32, n, 12);
        let mut out = vec![0u8; n * 16];
        let mut mask = vec![0u8; n * 16];
        let mut args = [
            HostArg::new(&mut ins),
            HostArg::new(&mut out),
            HostArg::new(&mut mask),
        ];
        plan.execute_host([3, 1, 1], &mut args, &[]).unwrap();
        outs.push((out, mask));
    }
    assert!(same(ElemType::F32, &outs[0].0, &outs[1].0));
    assert_eq!(outs[0].1, outs[1].1);
}

#[test]
fn divergent_barriers_loops_and_planes_match_the_interpreter() {
    // A tree reduction in `loop` with barriers, exits by `break`, a `continue` that skips a
    // round for some units, plane operations under a per-unit `if`, a barrier there too.
    let mut k = KernelBuilder::new("divergent", [64, 1, 1]);
    let a = k.input("a", ElemType::U32, 1);
    let o = k.output("o", ElemType::U32, 4);
    let sh = k.shared("sh", ElemType::U32, 1, 64);
    let i = k.absolute_pos();
    let u = k.unit_pos();
    let x = k.load(a, i);
    k.store(sh, u, x);
    k.barrier();
    let stride = k.var(32u32);
    let rounds = k.var(0u32);
    k.loop_(|k| {
        let s = k.get(stride);
        let done = k.eq(s, 0u32);
        k.if_(done, |k| k.break_());
        let half = k.shr(s, 1u32);
        k.assign(stride, half);
        let r = k.get(rounds);
        let r = k.add(r, 1u32);
        k.assign(rounds, r);
        let skip = k.eq(u, 60u32);
        k.if_(skip, |k| k.continue_());
        let active = k.lt(u, s);
        k.if_(active, |k| {
            let other = k.add(u, s);
            let p = k.load(sh, u);
            let q = k.load(sh, other);
            let t = k.add(p, q);
            k.store(sh, u, t);
        });
        k.barrier();
    });
    let odd = k.bit_and(x, 1u32);
    let odd = k.eq(odd, 1u32);
    let total = k.load(sh, 0u32);
    k.if_else(
        odd,
        |k| {
            let s = k.plane_sum(x);
            let t = k.lit_bool(true);
            let b = k.ballot(t);
            let b = k.extract(b, 0);
            k.barrier();
            let r = k.get(rounds);
            let v = k.vector(&[s, b, r, total]);
            k.store(o, i, v);
        },
        |k| {
            let m = k.plane_max(x);
            let v = k.vector(&[m, m, m, total]);
            k.store(o, i, v);
        },
    );
    let def = k.build().unwrap();
    let n = 64 * 4;
    let ins = [input(ElemType::U32, n, 13)];
    check(&def, 4, &ins, ElemType::U32, n * 16);
}

/// A small deterministic generator of kernels: random arithmetic over u32, i32 and f32 values,
/// casts, selects, ifs, range loops and loops with breaks, variables, and barrier-separated
/// rounds through shared memory.
struct Gen {
    s: u64,
}

impl Gen {
    fn next(&mut self) -> u64 {
        self.s ^= self.s << 13;
        self.s ^= self.s >> 7;
        self.s ^= self.s << 17;
        self.s
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }

    fn value(&mut self, k: &mut KernelBuilder, pool: &mut Vec<compute_core::kernel::Value>) {
        let a = self.pick(pool);
        let same: Vec<_> = pool
            .iter()
            .copied()
            .filter(|v| v.elem() == a.elem())
            .collect();
        let b = self.pick(&same);
        let e = a.elem();
        let r = match self.next() % 6 {
            0 | 1 => {
                let ops: &[BinaryOp] = if e == ElemType::F32 {
                    &[
                        BinaryOp::Add,
                        BinaryOp::Sub,
                        BinaryOp::Mul,
                        BinaryOp::Div,
                        BinaryOp::Min,
                        BinaryOp::Max,
                    ]
                } else {
                    &[
                        BinaryOp::Add,
                        BinaryOp::Sub,
                        BinaryOp::Mul,
                        BinaryOp::Div,
                        BinaryOp::Rem,
                        BinaryOp::Min,
                        BinaryOp::BitXor,
                        BinaryOp::Shr,
                        BinaryOp::Shl,
                    ]
                };
                let op = self.pick(ops);
                k.binary(op, a, b)
            }
            2 => {
                let to = self.pick(&[ElemType::U32, ElemType::I32, ElemType::F32]);
                k.cast(a, to)
            }
            3 => {
                let c = self.pick(&[CmpOp::Lt, CmpOp::Ge, CmpOp::Ne]);
                let c = k.compare(c, a, b);
                let other = self.pick(&same);
                k.select(c, b, other)
            }
            4 if e == ElemType::F32 => {
                let c = self.pick(&same);
                k.fma(a, b, c)
            }
            _ => {
                let ops: &[UnaryOp] = if e == ElemType::F32 {
                    &[UnaryOp::Abs, UnaryOp::Floor, UnaryOp::Neg, UnaryOp::Sin]
                } else {
                    &[UnaryOp::BitNot]
                };
                let op = self.pick(ops);
                k.unary(op, a)
            }
        };
        pool.push(r);
    }
}

#[test]
fn random_kernels_match_the_interpreter() {
    for seed in 1..=100u64 {
        let mut g = Gen {
            s: seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1,
        };
        let mut k = KernelBuilder::new(&format!("random_{seed}"), [64, 1, 1]);
        let ua = k.input("ua", ElemType::U32, 1);
        let fa = k.input("fa", ElemType::F32, 1);
        let out = k.output("out", ElemType::U32, 1);
        let fout = k.output("fout", ElemType::F32, 1);
        let sh = k.shared("sh", ElemType::U32, 1, 64);
        let i = k.absolute_pos();
        let u = k.unit_pos();
        let x = k.load(ua, i);
        let y = k.load(fa, i);
        let z = k.cast(x, ElemType::I32);
        let seven = k.lit_u32(7);
        let mut pool = vec![i, u, x, y, z, seven];
        let acc = k.var(0u32);
        let facc = k.var(0.0f32);
        let rounds = 1 + g.next() % 3;
        for _ in 0..rounds {
            for _ in 0..4 {
                g.value(&mut k, &mut pool);
            }
            let shape = g.next() % 4;
            let us: Vec<_> = pool
                .iter()
                .copied()
                .filter(|v| v.elem() == ElemType::U32)
                .collect();
            let fs: Vec<_> = pool
                .iter()
                .copied()
                .filter(|v| v.elem() == ElemType::F32)
                .collect();
            let (pu, pf) = (g.pick(&us), g.pick(&fs));
            let mut inner = pool.clone();
            let mut g2 = Gen { s: g.next() | 1 };
            match shape {
                0 => {
                    let c = k.bit_and(pu, 1u32);
                    let c = k.eq(c, 0u32);
                    k.if_else(
                        c,
                        |k| {
                            g2.value(k, &mut inner);
                            let a = k.get(acc);
                            let a = k.add(a, pu);
                            k.assign(acc, a);
                        },
                        |k| {
                            let f = k.get(facc);
                            let f = k.add(f, pf);
                            k.assign(facc, f);
                        },
                    );
                }
                1 => {
                    let n = k.rem(pu, 5u32);
                    k.range(0u32, n, 1u32, |k, j| {
                        inner.push(j);
                        g2.value(k, &mut inner);
                        let a = k.get(acc);
                        let a = k.bit_xor(a, j);
                        let a = k.add(a, 3u32);
                        k.assign(acc, a);
                    });
                }
                2 => {
                    let n = k.rem(pu, 6u32);
                    let c = k.var(0u32);
                    k.loop_(|k| {
                        let v = k.get(c);
                        let done = k.ge(v, n);
                        k.if_(done, |k| k.break_());
                        let v = k.add(v, 1u32);
                        k.assign(c, v);
                        let f = k.get(facc);
                        let f = k.mul(f, 0.5f32);
                        k.assign(facc, f);
                    });
                    let v = k.get(c);
                    let a = k.get(acc);
                    let a = k.add(a, v);
                    k.assign(acc, a);
                }
                _ => {
                    // Through shared memory: every unit writes, a barrier, read a neighbour.
                    let a = k.get(acc);
                    let a = k.add(a, pu);
                    k.store(sh, u, a);
                    k.barrier();
                    let other = k.bit_xor(u, 5u32);
                    let v = k.load(sh, other);
                    k.assign(acc, v);
                    k.barrier();
                }
            }
        }
        let a = k.get(acc);
        let us: Vec<_> = pool
            .iter()
            .copied()
            .filter(|v| v.elem() == ElemType::U32)
            .collect();
        let a = k.add(a, g.pick(&us));
        k.store(out, i, a);
        let f = k.get(facc);
        let fs: Vec<_> = pool
            .iter()
            .copied()
            .filter(|v| v.elem() == ElemType::F32)
            .collect();
        let f = k.add(f, g.pick(&fs));
        k.store(fout, i, f);
        let def = k.build().unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));

        let jit = compile_with(&def, true).unwrap();
        assert_eq!(jit.executor(), Executor::Jit, "{:?}", jit.jit_fallback());
        let interp = compile_interpreted(&def).unwrap();
        let n = 64 * 3;
        let mut outs = Vec::new();
        for plan in [&jit, &interp] {
            let mut ua = input(ElemType::U32, n, seed);
            let mut fa = input(ElemType::F32, n, seed + 100);
            let mut o = vec![0u8; n * 4];
            let mut fo = vec![0u8; n * 4];
            let mut args = [
                HostArg::new(&mut ua),
                HostArg::new(&mut fa),
                HostArg::new(&mut o),
                HostArg::new(&mut fo),
            ];
            plan.execute_host([3, 1, 1], &mut args, &[]).unwrap();
            outs.push((o, fo));
        }
        assert_eq!(outs[0].0, outs[1].0, "seed {seed}: u32 output");
        assert!(
            same(ElemType::F32, &outs[0].1, &outs[1].1),
            "seed {seed}: f32 output"
        );
    }
}

#[test]
fn the_client_reports_the_executor_and_features() {
    use compute_core::ComputeClient;

    use crate::{CpuDevice, CpuRuntime};
    let client = ComputeClient::<CpuRuntime>::load(&CpuDevice::default());
    let info = client.info();
    assert_eq!(info.jit, super::enabled());
    assert_eq!(info.cpu_features, super::features().describe());
    assert!(info.cpu_features.starts_with(std::env::consts::ARCH));
    let name = &client.properties().name;
    let path = if info.jit { "jit" } else { "interpreter" };
    assert!(
        name.contains(path) && name.contains(&info.cpu_features),
        "{name}"
    );
    #[cfg(target_arch = "x86_64")]
    if !super::features().forced_baseline {
        assert_eq!(
            super::features().avx2,
            std::arch::is_x86_feature_detected!("avx2")
        );
    }
}
