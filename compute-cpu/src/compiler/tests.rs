//! Executor tests: kernels run on host buffers against host-computed results.
//!
//! Size: a test file; each test is a kernel and its host-computed reference.

use bytemuck::Pod;
use compute_core::elem::ElemType;
use compute_core::kernel::{KernelBuilder, KernelDefinition, ScalarValue};

use super::{BufferArg, HostArg, compile};

fn run(def: &KernelDefinition, count: [u32; 3], bufs: &mut [&mut [u8]], scalars: &[ScalarValue]) {
    let plan = compile(def).unwrap();
    let mut args: Vec<HostArg<'_>> = bufs.iter_mut().map(|b| HostArg::new(b)).collect();
    plan.execute_host(count, &mut args, scalars).unwrap();
}

fn bytes<T: Pod>(v: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(v)
}

fn axpy(width: u8) -> KernelDefinition {
    let mut k = KernelBuilder::new("axpy", [64, 1, 1]);
    let x = k.input("x", ElemType::F32, width);
    let y = k.output("y", ElemType::F32, width);
    let a = k.scalar("a", ElemType::F32);
    let i = k.absolute_pos();
    let n = k.len(y);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let xi = k.load(x, i);
        let yi = k.load(y, i);
        let r = k.fma(a, xi, yi);
        k.store(y, i, r);
    });
    k.build().unwrap()
}

#[test]
fn axpy_f32_width_1_and_4() {
    for width in [1u32, 4] {
        let n = 1000usize;
        let mut x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let mut y: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
        let expect: Vec<f32> = x
            .iter()
            .zip(&y)
            .map(|(x, y)| 2.5f32.mul_add(*x, *y))
            .collect();
        let cubes = (n as u32 / width).div_ceil(64);
        run(
            &axpy(width as u8),
            [cubes, 1, 1],
            &mut [bytes(&mut x), bytes(&mut y)],
            &[ScalarValue::F32(2.5)],
        );
        assert_eq!(y, expect, "width {width}");
    }
}

/// out[i] = f(a[i], b[i]) for every binary integer op, checked against host arithmetic.
macro_rules! int_ops_test {
    ($name:ident, $t:ty, $elem:expr) => {
        #[test]
        fn $name() {
            let ops = [
                "add", "sub", "mul", "div", "rem", "min", "max", "and", "or", "xor", "shl", "shr",
            ];
            let a: Vec<$t> = vec![7, 100, 0, 13, 5, <$t>::MAX, <$t>::MIN, 3, 64, 1];
            let b: Vec<$t> = vec![3, 7, 5, 0, 2, 2, 1, 0, 3, 63];
            let n = a.len();
            let mut k = KernelBuilder::new("int_ops", [16, 1, 1]);
            let ab = k.input("a", $elem, 1);
            let bb = k.input("b", $elem, 1);
            let outs: Vec<_> = ops.iter().map(|o| k.output(o, $elem, 1)).collect();
            let i = k.absolute_pos();
            let inside = k.lt(i, n as u32);
            k.if_(inside, |k| {
                let x = k.load(ab, i);
                let y = k.load(bb, i);
                let r = [
                    k.add(x, y),
                    k.sub(x, y),
                    k.mul(x, y),
                    k.div(x, y),
                    k.rem(x, y),
                    k.min(x, y),
                    k.max(x, y),
                    k.bit_and(x, y),
                    k.bit_or(x, y),
                    k.bit_xor(x, y),
                    k.shl(x, y),
                    k.shr(x, y),
                ];
                for (o, r) in outs.iter().zip(r) {
                    k.store(*o, i, r);
                }
            });
            let def = k.build().unwrap();
            let mut a2 = a.clone();
            let mut b2 = b.clone();
            let mut res: Vec<Vec<$t>> = vec![vec![0; n]; ops.len()];
            let mut bufs: Vec<&mut [u8]> = vec![bytes(&mut a2), bytes(&mut b2)];
            bufs.extend(res.iter_mut().map(|r| bytes(r)));
            run(&def, [1, 1, 1], &mut bufs, &[]);
            for j in 0..n {
                let (x, y) = (a[j], b[j]);
                let expect = [
                    x.wrapping_add(y),
                    x.wrapping_sub(y),
                    x.wrapping_mul(y),
                    if y == 0 { x } else { x.wrapping_div(y) },
                    if y == 0 { 0 } else { x.wrapping_rem(y) },
                    x.min(y),
                    x.max(y),
                    x & y,
                    x | y,
                    x ^ y,
                    x.wrapping_shl(y as u32),
                    x.wrapping_shr(y as u32),
                ];
                for (o, e) in ops.iter().zip(expect.iter().enumerate()) {
                    assert_eq!(res[e.0][j], *e.1, "{o}({x}, {y})");
                }
            }
        }
    };
}

int_ops_test!(i32_ops, i32, ElemType::I32);
int_ops_test!(u32_ops, u32, ElemType::U32);
int_ops_test!(i64_ops, i64, ElemType::I64);
int_ops_test!(u64_ops, u64, ElemType::U64);

#[test]
fn f64_arithmetic_casts_and_select() {
    let mut k = KernelBuilder::new("f64", [8, 1, 1]);
    let x = k.input("x", ElemType::F64, 1);
    let o_arith = k.output("arith", ElemType::F64, 1);
    let o_int = k.output("int", ElemType::I32, 1);
    let o_u64 = k.output("as_u64", ElemType::U64, 1);
    let o_sel = k.output("sel", ElemType::F32, 1);
    let i = k.absolute_pos();
    let v = k.load(x, i);
    let a = k.mul(v, 3.0f64);
    let a = k.sub(a, 1.0f64);
    let a = k.div(a, 2.0f64);
    let n = k.neg(v);
    let a = k.max(a, n);
    k.store(o_arith, i, a);
    let c = k.cast(v, ElemType::I32);
    k.store(o_int, i, c);
    let c = k.cast(v, ElemType::U64);
    k.store(o_u64, i, c);
    let f = k.cast(v, ElemType::F32);
    let pos = k.gt(v, 0.0f64);
    let small = k.lt(v, 100.0f64);
    let both = k.and(pos, small);
    let s = k.select(both, f, -1.0f32);
    k.store(o_sel, i, s);
    let def = k.build().unwrap();
    let mut xs = vec![1.5f64, -2.25, 0.0, 1e12, -1e12, f64::NAN, 99.5, 3.0];
    let input = xs.clone();
    let (mut ar, mut int, mut u, mut sel) =
        (vec![0f64; 8], vec![0i32; 8], vec![0u64; 8], vec![0f32; 8]);
    run(
        &def,
        [1, 1, 1],
        &mut [
            bytes(&mut xs),
            bytes(&mut ar),
            bytes(&mut int),
            bytes(&mut u),
            bytes(&mut sel),
        ],
        &[],
    );
    for (j, &v) in input.iter().enumerate() {
        let e = ((v * 3.0 - 1.0) / 2.0).max(-v);
        assert!(
            e.to_bits() == ar[j].to_bits() || (e.is_nan() && ar[j].is_nan()),
            "arith {v}"
        );
        assert_eq!(int[j], v as i32, "cast i32 {v}");
        assert_eq!(u[j], v as u64, "cast u64 {v}");
        let s = if v > 0.0 && v < 100.0 { v as f32 } else { -1.0 };
        assert_eq!(sel[j], s, "select {v}");
    }
}

#[test]
fn if_else_diverges_per_unit() {
    let mut k = KernelBuilder::new("diverge", [32, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let i = k.absolute_pos();
    let r = k.var(0u32);
    let odd = k.bit_and(i, 1u32);
    let even = k.eq(odd, 0u32);
    k.if_else(
        even,
        |k| {
            let big = k.ge(i, 40u32);
            k.if_else(
                big,
                |k| k.assign(r, 1u32),
                |k| {
                    let v = k.mul(i, 2u32);
                    k.assign(r, v);
                },
            );
        },
        |k| {
            let v = k.add(i, 100u32);
            k.assign(r, v);
        },
    );
    let v = k.get(r);
    k.store(out, i, v);
    let def = k.build().unwrap();
    let mut out_v = vec![0u32; 64];
    run(&def, [2, 1, 1], &mut [bytes(&mut out_v)], &[]);
    for (i, &v) in out_v.iter().enumerate() {
        let i = i as u32;
        let e = if i.is_multiple_of(2) {
            if i >= 40 { 1 } else { i * 2 }
        } else {
            i + 100
        };
        assert_eq!(v, e, "unit {i}");
    }
}

#[test]
fn range_loops_with_steps() {
    let mut k = KernelBuilder::new("sums", [16, 1, 1]);
    let up = k.output("up", ElemType::U32, 1);
    let down = k.output("down", ElemType::I32, 1);
    let i = k.absolute_pos();
    // up[i] = sum of j in (0..=i).step_by(2)
    let acc = k.var(0u32);
    let end = k.add(i, 1u32);
    k.range(0u32, end, 2u32, |k, j| {
        let s = k.get(acc);
        let s = k.add(s, j);
        k.assign(acc, s);
    });
    let s = k.get(acc);
    k.store(up, i, s);
    // down[i] = sum of j for j = i, i-3, ... > -5
    let acc2 = k.var(0i32);
    let start = k.cast(i, ElemType::I32);
    k.range(start, -5i32, -3i32, |k, j| {
        let s = k.get(acc2);
        let s = k.add(s, j);
        k.assign(acc2, s);
    });
    let s = k.get(acc2);
    k.store(down, i, s);
    let def = k.build().unwrap();
    let (mut u, mut d) = (vec![0u32; 16], vec![0i32; 16]);
    run(&def, [1, 1, 1], &mut [bytes(&mut u), bytes(&mut d)], &[]);
    for i in 0..16 {
        assert_eq!(u[i], (0..=i as u32).step_by(2).sum::<u32>(), "up {i}");
        let mut e = 0;
        let mut j = i as i32;
        while j > -5 {
            e += j;
            j -= 3;
        }
        assert_eq!(d[i], e, "down {i}");
    }
}

#[test]
fn loop_break_continue_and_early_return() {
    // out[i] = number of odd j < 3 * i (continue skips even j; break at 3 * i); units with
    // i % 5 == 4 return before storing.
    let mut k = KernelBuilder::new("loops", [8, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let i = k.absolute_pos();
    let skip = k.rem(i, 5u32);
    let skip = k.eq(skip, 4u32);
    k.if_(skip, |k| k.return_());
    let j = k.var(0u32);
    let count = k.var(0u32);
    let limit = k.mul(i, 3u32);
    k.loop_(|k| {
        let jv = k.get(j);
        let done = k.ge(jv, limit);
        k.if_(done, |k| k.break_());
        let next = k.add(jv, 1u32);
        k.assign(j, next);
        let even = k.bit_and(jv, 1u32);
        let even = k.eq(even, 0u32);
        k.if_(even, |k| k.continue_());
        let c = k.get(count);
        let c = k.add(c, 1u32);
        k.assign(count, c);
    });
    let c = k.get(count);
    k.store(out, i, c);
    let def = k.build().unwrap();
    let mut o = vec![u32::MAX; 24];
    run(&def, [3, 1, 1], &mut [bytes(&mut o)], &[]);
    for (i, &v) in o.iter().enumerate() {
        let e = if i % 5 == 4 {
            u32::MAX
        } else {
            (0..3 * i as u32).filter(|j| j % 2 == 1).count() as u32
        };
        assert_eq!(v, e, "unit {i}");
    }
}

#[test]
fn bounds_checks_on_and_off() {
    // No guard: 2 cubes of 64 units over 100 elements.
    let mut k = KernelBuilder::new("copy", [64, 1, 1]);
    let x = k.input("x", ElemType::U32, 1);
    let y = k.output("y", ElemType::U32, 1);
    let i = k.absolute_pos();
    let v = k.load(x, i);
    let v = k.add(v, 1u32);
    k.store(y, i, v);
    let plan = compile(&k.build().unwrap()).unwrap();
    let n = 100usize;
    let mut xs: Vec<u32> = (0..128).collect();
    let mut ys = vec![0u32; 128];
    for checked in [true, false] {
        ys.fill(0);
        let args = [
            BufferArg {
                ptr: bytes(&mut xs).as_mut_ptr(),
                len_bytes: n * 4,
                shape: &[],
                strides: &[],
            },
            BufferArg {
                ptr: bytes(&mut ys).as_mut_ptr(),
                len_bytes: n * 4,
                shape: &[],
                strides: &[],
            },
        ];
        // SAFETY: both allocations hold 128 elements, so even the unchecked accesses of units
        // 100..128 stay inside them; nothing else touches them during the call.
        unsafe { plan.execute([2, 1, 1], &args, &[], checked) }.unwrap();
        for (j, &v) in ys.iter().enumerate() {
            let e = if j < n || !checked { j as u32 + 1 } else { 0 };
            assert_eq!(v, e, "checked {checked}, element {j}");
        }
    }
    // Out-of-range loads read 0 when checked.
    let mut k = KernelBuilder::new("oob_load", [4, 1, 1]);
    let x = k.input("x", ElemType::F32, 4);
    let y = k.output("y", ElemType::F32, 4);
    let i = k.absolute_pos();
    let v = k.load(x, i);
    k.store(y, i, v);
    let mut xs = vec![1.0f32; 8];
    let mut ys = vec![9.0f32; 16];
    run(
        &k.build().unwrap(),
        [1, 1, 1],
        &mut [bytes(&mut xs), bytes(&mut ys)],
        &[],
    );
    assert_eq!(&ys[..8], &[1.0; 8]);
    assert_eq!(&ys[8..], &[0.0; 8]);
}

#[test]
fn positions_in_multi_dimensional_launches() {
    let dim = [4u32, 2, 3];
    let count = [3u32, 2, 2];
    let mut k = KernelBuilder::new("pos", dim);
    let out = k.output("out", ElemType::U32, 8);
    let parts = [
        k.absolute_pos_x(),
        k.absolute_pos_y(),
        k.absolute_pos_z(),
        k.unit_pos(),
        k.cube_pos(),
        k.cube_dim(),
        k.cube_count_y(),
        k.cube_dim_z(),
    ];
    let v = k.vector(&parts);
    let i = k.absolute_pos();
    k.store(out, i, v);
    let def = k.build().unwrap();
    let units = (dim.iter().product::<u32>() * count.iter().product::<u32>()) as usize;
    let mut o = vec![0u32; units * 8];
    run(&def, count, &mut [bytes(&mut o)], &[]);
    let cube_size = dim.iter().product::<u32>();
    for cz in 0..count[2] {
        for cy in 0..count[1] {
            for cx in 0..count[0] {
                let cube = cx + cy * count[0] + cz * count[0] * count[1];
                for uz in 0..dim[2] {
                    for uy in 0..dim[1] {
                        for ux in 0..dim[0] {
                            let unit = ux + uy * dim[0] + uz * dim[0] * dim[1];
                            let abs = (cube * cube_size + unit) as usize;
                            let e = [
                                cx * dim[0] + ux,
                                cy * dim[1] + uy,
                                cz * dim[2] + uz,
                                unit,
                                cube,
                                cube_size,
                                count[1],
                                dim[2],
                            ];
                            assert_eq!(&o[abs * 8..abs * 8 + 8], &e, "cube {cube} unit {unit}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn shared_memory_tree_reduction_with_barriers() {
    // Each cube of 64 units sums its 64 inputs through shared memory.
    let mut k = KernelBuilder::new("reduce", [64, 1, 1]);
    let x = k.input("x", ElemType::F32, 1);
    let out = k.output("out", ElemType::F32, 1);
    let sh = k.shared("partial", ElemType::F32, 1, 64);
    let u = k.unit_pos();
    let i = k.absolute_pos();
    let v = k.load(x, i);
    k.store(sh, u, v);
    k.barrier();
    let stride = k.var(32u32);
    k.loop_(|k| {
        let s = k.get(stride);
        let done = k.eq(s, 0u32);
        k.if_(done, |k| k.break_());
        let active = k.lt(u, s);
        k.if_(active, |k| {
            let a = k.load(sh, u);
            let j = k.add(u, s);
            let b = k.load(sh, j);
            let c = k.add(a, b);
            k.store(sh, u, c);
        });
        k.barrier();
        let half = k.shr(s, 1u32);
        k.assign(stride, half);
    });
    let first = k.eq(u, 0u32);
    k.if_(first, |k| {
        let total = k.load(sh, 0u32);
        let c = k.cube_pos();
        k.store(out, c, total);
    });
    let def = k.build().unwrap();
    assert_eq!(def.shared_memory_bytes(), 256);
    let mut xs: Vec<f32> = (0..64 * 50).map(|i| (i % 7) as f32).collect();
    let input = xs.clone();
    let mut o = vec![0f32; 50];
    run(&def, [50, 1, 1], &mut [bytes(&mut xs), bytes(&mut o)], &[]);
    for (c, &v) in o.iter().enumerate() {
        let e: f32 = input[c * 64..(c + 1) * 64].iter().sum();
        assert_eq!(v, e, "cube {c}");
    }
}

#[test]
fn global_and_shared_atomics() {
    let mut k = KernelBuilder::new("atomics", [32, 1, 1]);
    let counter = k.output("counter", ElemType::U32, 1);
    let fsum = k.output("fsum", ElemType::F32, 1);
    let maxes = k.output("maxes", ElemType::I32, 1);
    let sh = k.shared("local_count", ElemType::U32, 1, 1);
    let u = k.unit_pos();
    let i = k.absolute_pos();
    let first = k.eq(u, 0u32);
    k.if_(first, |k| k.store(sh, 0u32, 0u32));
    k.barrier();
    k.atomic_add(sh, 0u32, 1u32);
    k.atomic_add(counter, 0u32, 1u32);
    let f = k.cast(i, ElemType::F32);
    k.atomic_add(fsum, 0u32, f);
    let signed = k.cast(i, ElemType::I32);
    let neg = k.neg(signed);
    k.atomic_max(maxes, 0u32, signed);
    k.atomic_min(maxes, 1u32, neg);
    k.barrier();
    k.if_(first, |k| {
        let c = k.load(sh, 0u32);
        let slot = k.cube_pos();
        let slot = k.add(slot, 2u32);
        let c = k.cast(c, ElemType::I32);
        k.store(maxes, slot, c);
    });
    let def = k.build().unwrap();
    let cubes = 40u32;
    let (mut c, mut s, mut m) = (vec![0u32; 1], vec![0f32; 1], vec![0i32; 2 + cubes as usize]);
    run(
        &def,
        [cubes, 1, 1],
        &mut [bytes(&mut c), bytes(&mut s), bytes(&mut m)],
        &[],
    );
    let n = cubes * 32;
    assert_eq!(c[0], n);
    assert_eq!(s[0], (0..n).map(|v| v as f32).sum::<f32>());
    assert_eq!(m[0], n as i32 - 1);
    assert_eq!(m[1], -(n as i32 - 1));
    assert!(m[2..].iter().all(|&v| v == 32), "{m:?}");
}

#[test]
fn math_functions_match_std() {
    type F = fn(f32) -> f32;
    let host: [(&str, F); 11] = [
        ("sqrt", f32::sqrt),
        ("exp", f32::exp),
        ("log", f32::ln),
        ("log1p", f32::ln_1p),
        ("sin", f32::sin),
        ("cos", f32::cos),
        ("tanh", f32::tanh),
        ("floor", f32::floor),
        ("ceil", f32::ceil),
        ("round", f32::round_ties_even),
        ("recip", |x| 1.0 / x),
    ];
    let mut k = KernelBuilder::new("math", [16, 1, 1]);
    let x = k.input("x", ElemType::F32, 1);
    let outs: Vec<_> = host
        .iter()
        .map(|(n, _)| k.output(n, ElemType::F32, 1))
        .collect();
    let erf_out = k.output("erf", ElemType::F64, 1);
    let i = k.absolute_pos();
    let v = k.load(x, i);
    let r = [
        k.sqrt(v),
        k.exp(v),
        k.log(v),
        k.log1p(v),
        k.sin(v),
        k.cos(v),
        k.tanh(v),
        k.floor(v),
        k.ceil(v),
        k.round(v),
        k.recip(v),
    ];
    for (o, r) in outs.iter().zip(r) {
        k.store(*o, i, r);
    }
    let vd = k.cast(v, ElemType::F64);
    let e = k.erf(vd);
    k.store(erf_out, i, e);
    let def = k.build().unwrap();
    let xs: Vec<f32> = vec![
        0.5, 1.5, 2.5, 0.1, 3.0, 10.0, 0.75, 4.2, 1.0, 2.0, 0.0001, 5.5, 6.5, 0.3, 1.7, 2.9,
    ];
    let mut xin = xs.clone();
    let mut res = vec![vec![0f32; 16]; host.len()];
    let mut erf = vec![0f64; 16];
    let mut bufs: Vec<&mut [u8]> = vec![bytes(&mut xin)];
    bufs.extend(res.iter_mut().map(|r| bytes(r)));
    bufs.push(bytes(&mut erf));
    run(&def, [1, 1, 1], &mut bufs, &[]);
    for (f, (name, h)) in host.iter().enumerate() {
        for (j, &x) in xs.iter().enumerate() {
            assert_eq!(res[f][j], h(x), "{name}({x})");
        }
    }
    // erf reference values (Abramowitz & Stegun tables), to 1e-12.
    let reference = [
        (0.5, 0.520499877813047),
        (1.5, 0.966105146475311),
        (2.5, 0.999593047982555),
        (3.0, 0.999977909503001),
    ];
    for (x, e) in reference {
        let j = xs.iter().position(|&v| v == x as f32).unwrap();
        assert!((erf[j] - e).abs() < 1e-12, "erf({x}) = {} vs {e}", erf[j]);
    }
}

#[test]
fn plane_sum_and_broadcast() {
    let mut k = KernelBuilder::new("plane", [64, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let first = k.output("first", ElemType::U32, 1);
    let i = k.absolute_pos();
    let s = k.plane_sum(i);
    k.store(out, i, s);
    let b = k.plane_broadcast(i, 3u32);
    k.store(first, i, b);
    let def = k.build().unwrap();
    let (mut o, mut f) = (vec![0u32; 64], vec![0u32; 64]);
    run(&def, [1, 1, 1], &mut [bytes(&mut o), bytes(&mut f)], &[]);
    for i in 0..64u32 {
        let base = i / 32 * 32;
        assert_eq!(o[i as usize], (base..base + 32).sum::<u32>());
        assert_eq!(f[i as usize], base + 3);
    }
}

#[test]
fn strided_tensor_metadata() {
    // Copy a [3, 5] view with a row pitch of 8 into a contiguous [3, 5] tensor.
    let mut k = KernelBuilder::new("pitched", [16, 1, 1]);
    let src = k.input("src", ElemType::F32, 1);
    let dst = k.output("dst", ElemType::F32, 1);
    let i = k.absolute_pos();
    let rows = k.shape(dst, 0u32);
    let cols = k.shape(dst, 1u32);
    let n = k.mul(rows, cols);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let r = k.div(i, cols);
        let c = k.rem(i, cols);
        let s0 = k.stride(src, 0u32);
        let s1 = k.stride(src, 1u32);
        let a = k.mul(r, s0);
        let b = k.mul(c, s1);
        let at = k.add(a, b);
        let v = k.load(src, at);
        k.store(dst, i, v);
    });
    let rank = k.rank(src);
    let zero = k.eq(i, 0u32);
    k.if_(zero, |k| {
        let r = k.cast(rank, ElemType::F32);
        k.store(dst, 15u32, r);
    });
    let plan = compile(&k.build().unwrap()).unwrap();
    let mut s: Vec<f32> = (0..24).map(|v| v as f32).collect();
    let mut d = vec![0f32; 16];
    let (shape, sstrides, dstrides) = ([3usize, 5], [8usize, 1], [5usize, 1]);
    let mut args = [
        HostArg::tensor(bytes(&mut s), &shape, &sstrides),
        HostArg::tensor(bytes(&mut d), &shape, &dstrides),
    ];
    plan.execute_host([1, 1, 1], &mut args, &[]).unwrap();
    for r in 0..3 {
        for c in 0..5 {
            assert_eq!(d[r * 5 + c], (r * 8 + c) as f32);
        }
    }
    assert_eq!(d[15], 2.0);
}

#[test]
fn launch_arguments_are_checked() {
    let plan = compile(&axpy(1)).unwrap();
    let mut x = vec![0f32; 4];
    let mut y = vec![0f32; 4];
    let err = plan
        .execute_host(
            [1, 1, 1],
            &mut [HostArg::new(bytes(&mut x))],
            &[ScalarValue::F32(1.0)],
        )
        .unwrap_err();
    assert!(err.to_string().contains("takes 2 buffers"), "{err}");
    let err = plan
        .execute_host(
            [1, 1, 1],
            &mut [HostArg::new(bytes(&mut x)), HostArg::new(bytes(&mut y))],
            &[ScalarValue::U32(1)],
        )
        .unwrap_err();
    assert!(err.to_string().contains("scalar `a`"), "{err}");
}

#[test]
fn compile_is_fast() {
    // The interpreter's plan; the JIT's compile time is a bench row.
    let def = axpy(4);
    let start = std::time::Instant::now();
    let iters = 1000;
    for _ in 0..iters {
        std::hint::black_box(super::compile_interpreted(&def).unwrap());
    }
    let per = start.elapsed() / iters;
    eprintln!("compile_interpreted(axpy): {per:?} per kernel");
    assert!(per < std::time::Duration::from_millis(1), "{per:?}");
}

/// `cargo test -p compute-cpu --release compiler::tests::elementwise_throughput -- --ignored --nocapture`
#[test]
#[ignore = "benchmark; run in release"]
fn elementwise_throughput() {
    use rayon::prelude::*;
    let n = 16 << 20;
    let mut k = KernelBuilder::new("add", [256, 1, 1]);
    let a = k.input("a", ElemType::F32, 4);
    let b = k.input("b", ElemType::F32, 4);
    let c = k.output("c", ElemType::F32, 4);
    let i = k.absolute_pos();
    let x = k.load(a, i);
    let y = k.load(b, i);
    let s = k.add(x, y);
    k.store(c, i, s);
    let plan = compile(&k.build().unwrap()).unwrap();
    let mut av: Vec<f32> = (0..n).map(|v| v as f32).collect();
    let mut bv = vec![1.0f32; n];
    let mut cv = vec![0.0f32; n];
    let cubes = (n as u32 / 4).div_ceil(256);
    let reps = 10;
    let mut run_once = |checked: bool| {
        let args = [
            BufferArg {
                ptr: bytes(&mut av).as_mut_ptr(),
                len_bytes: n * 4,
                shape: &[],
                strides: &[],
            },
            BufferArg {
                ptr: bytes(&mut bv).as_mut_ptr(),
                len_bytes: n * 4,
                shape: &[],
                strides: &[],
            },
            BufferArg {
                ptr: bytes(&mut cv).as_mut_ptr(),
                len_bytes: n * 4,
                shape: &[],
                strides: &[],
            },
        ];
        // SAFETY: three live, distinct allocations of n f32; the launch covers exactly n.
        unsafe { plan.execute([cubes, 1, 1], &args, &[], checked) }.unwrap();
    };
    for checked in [true, false] {
        run_once(checked);
        let t = std::time::Instant::now();
        for _ in 0..reps {
            run_once(checked);
        }
        let ours = n as f64 * reps as f64 / t.elapsed().as_secs_f64();
        eprintln!("kernel a+b (checked {checked}): {:.3} G elem/s", ours / 1e9);
    }
    assert_eq!(cv[12345], 12346.0);
    let t = std::time::Instant::now();
    for _ in 0..reps {
        cv.par_chunks_mut(1 << 16)
            .zip(av.par_chunks(1 << 16))
            .zip(bv.par_chunks(1 << 16))
            .for_each(|((c, a), b)| {
                for ((c, a), b) in c.iter_mut().zip(a).zip(b) {
                    *c = a + b;
                }
            });
    }
    let base = n as f64 * reps as f64 / t.elapsed().as_secs_f64();
    eprintln!("rayon a+b: {:.3} G elem/s", base / 1e9);
}

/// Accumulations fused in place (`v = fma(splat(s), x, v)`, `v = x + v`) under full and partial
/// masks, and a variable read that must not share the register because the variable is
/// assigned while the value is still live.
#[test]
fn fused_accumulations_and_variable_reads() {
    let mut k = KernelBuilder::new("acc", [32, 1, 1]);
    let x = k.input("x", ElemType::F32, 4);
    let out = k.output("out", ElemType::F32, 4);
    let old = k.output("old", ElemType::F32, 4);
    let i = k.absolute_pos();
    let xi = k.load(x, i);
    let zero = k.splat(0.0f32, 4);
    let acc = k.var(zero);
    k.range(0u32, 3u32, 1u32, |k, j| {
        let s = k.cast(j, ElemType::F32);
        let s = k.add(s, 1.0f32);
        let v = k.get(acc);
        let r = k.fma(s, xi, v); // fused with the splat, all units active
        k.assign(acc, r);
        let odd = k.bit_and(i, 1u32);
        let odd = k.eq(odd, 1u32);
        k.if_(odd, |k| {
            let v = k.get(acc);
            let r = k.add(xi, v); // fused, half the units active
            k.assign(acc, r);
        });
    });
    let before = k.get(acc);
    let twice = k.add(before, before);
    k.assign(acc, twice);
    // `before` is live after the assignment, so it must hold the old value.
    k.store(old, i, before);
    let v = k.get(acc);
    k.store(out, i, v);
    let def = k.build().unwrap();
    let n = 64usize;
    let mut xs: Vec<f32> = (0..n * 4).map(|c| c as f32 * 0.25 - 3.0).collect();
    let mut outs = vec![0.0f32; n * 4];
    let mut olds = vec![0.0f32; n * 4];
    run(
        &def,
        [2, 1, 1],
        &mut [bytes(&mut xs), bytes(&mut outs), bytes(&mut olds)],
        &[],
    );
    for u in 0..n {
        for c in 0..4 {
            let x = xs[u * 4 + c];
            let mut a = 0.0f32;
            for j in 0..3 {
                a = (j as f32 + 1.0).mul_add(x, a);
                if u % 2 == 1 {
                    a += x;
                }
            }
            assert_eq!(olds[u * 4 + c], a, "unit {u} component {c}");
            assert_eq!(outs[u * 4 + c], a + a, "unit {u} component {c}");
        }
    }
}
