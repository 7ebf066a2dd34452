//! `#[kernel]` functions against their `KernelBuilder` twins: the same IR, the same kernel id.

use crate::elem::ElemType;
use crate::kernel::{KernelBuilder, KernelDefinition, KernelFloat, kernel};

fn same(macro_def: &KernelDefinition, twin: KernelBuilder) {
    let twin = twin.build().expect("the twin builds");
    assert_eq!(macro_def, &twin, "IR differs from the builder twin");
    assert_eq!(macro_def.id(), twin.id());
}

#[kernel(cube_dim = 256)]
fn saxpy(x: &[f32], y: &mut [f32], a: f32) {
    let i = ABSOLUTE_POS;
    if i < x.len() {
        y[i] = a.mul_add(x[i], y[i]);
    }
}

#[test]
fn saxpy_matches_its_twin() {
    let mut k = KernelBuilder::new("saxpy", [256, 1, 1]);
    let x = k.input("x", ElemType::F32, 1);
    let y = k.output("y", ElemType::F32, 1);
    let a = k.scalar("a", ElemType::F32);
    let i = k.absolute_pos();
    let n = k.len(x);
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let xv = k.load(x, i);
        let yv = k.load(y, i);
        let r = k.fma(a, xv, yv);
        k.store(y, i, r);
    });
    same(saxpy::definition(), k);
    assert!(
        std::ptr::eq(saxpy::definition(), saxpy::definition()),
        "cached"
    );
}

const TILE: u32 = 16;

/// Generic over the element type and the vector width; unrolled loop, shared memory, barrier,
/// `while` on a build-time value, compound assignment, casts, `step_by`, `loop`/`break`/`continue`.
#[kernel(cube_dim = [TILE, 1, 1], name = format!("mix_{W}"))]
fn mix<F: KernelFloat, const W: u32>(input: &[[F; W]], out: &mut [F], n: u32) {
    let tile = SharedMemory::<F>::new(TILE);
    let unit = UNIT_POS;
    let mut acc = [0.0 as F; W];
    for j in (unit..n).step_by(TILE) {
        acc += input[j];
    }
    let mut s = acc[0];
    #[unroll]
    for c in 1..W {
        s += acc[c];
    }
    tile[unit] = s;
    sync_units();
    #[comptime]
    let mut stride = TILE / 2;
    while stride > 0 {
        if unit < stride {
            tile[unit] += tile[unit + stride];
        }
        sync_units();
        stride /= 2;
    }
    let mut count = 0u32;
    loop {
        count += 1;
        if count >= 3 && unit % 2 == 0 {
            break;
        }
        if count > 10 {
            break;
        }
        continue;
    }
    if unit == 0 {
        out[CUBE_POS] = tile[0] * (count as F).sqrt();
    }
}

fn mix_twin(w: u8) -> KernelBuilder {
    let mut k = KernelBuilder::new(&format!("mix_{w}"), [TILE, 1, 1]);
    let input = k.input("input", ElemType::F32, w);
    let out = k.output("out", ElemType::F32, 1);
    let n = k.scalar("n", ElemType::U32);
    let tile = k.shared("tile", ElemType::F32, 1, TILE);
    let unit = k.unit_pos();
    let zero = k.lit_f32(0.0);
    let zero = k.splat(zero, w);
    let acc = k.var_named("acc", zero);
    k.range(unit, n, TILE, |k, j| {
        let x = k.load(input, j);
        let old = k.get(acc);
        let sum = k.add(old, x);
        k.assign(acc, sum);
    });
    let v = k.get(acc);
    let first = k.extract(v, 0);
    let s = k.var_named("s", first);
    for c in 1..w {
        let v = k.get(acc);
        let x = k.extract(v, c);
        let old = k.get(s);
        let sum = k.add(old, x);
        k.assign(s, sum);
    }
    let v = k.get(s);
    k.store(tile, unit, v);
    k.barrier();
    let mut stride = TILE / 2;
    while stride > 0 {
        let active = k.lt(unit, stride);
        k.if_(active, |k| {
            let other = k.add(unit, stride);
            let r = k.load(tile, other);
            let old = k.load(tile, unit);
            let sum = k.add(old, r);
            k.store(tile, unit, sum);
        });
        k.barrier();
        stride /= 2;
    }
    let count = k.var_named("count", 0u32);
    k.loop_(|k| {
        let old = k.get(count);
        let new = k.add(old, 1u32);
        k.assign(count, new);
        let c = k.get(count);
        let enough = k.ge(c, 3u32);
        let r = k.rem(unit, 2u32);
        let even = k.eq(r, 0u32);
        let both = k.and(enough, even);
        k.if_(both, |k| k.break_());
        let c = k.get(count);
        let many = k.gt(c, 10u32);
        k.if_(many, |k| k.break_());
        k.continue_();
    });
    let first = k.eq(unit, 0u32);
    k.if_(first, |k| {
        let t = k.load(tile, 0u32);
        let c = k.get(count);
        let c = k.cast(c, ElemType::F32);
        let c = k.sqrt(c);
        let v = k.mul(t, c);
        let cube = k.cube_pos();
        k.store(out, cube, v);
    });
    k
}

#[test]
fn generic_kernel_matches_its_twins() {
    same(mix::definition::<f32, 4>(), mix_twin(4));
    same(mix::definition::<f32, 1>(), mix_twin(1));
    assert_ne!(
        mix::definition::<f32, 4>().id(),
        mix::definition::<f32, 1>().id()
    );
    assert_eq!(mix::definition::<f64, 2>().buffers()[0].elem, ElemType::F64);
    assert!(std::ptr::eq(
        mix::definition::<f32, 4>(),
        mix::definition::<f32, 4>()
    ));
}

/// `&&` whose right side reads memory runs it only where the left side holds.
#[kernel(cube_dim = 64)]
fn guarded(x: &[u32], out: &mut [u32]) {
    let i = ABSOLUTE_POS;
    if i < x.len() && x[i] > 3 {
        out[i] = 1;
    }
}

#[test]
fn short_circuit_reads_only_where_needed() {
    let mut k = KernelBuilder::new("guarded", [64, 1, 1]);
    let x = k.input("x", ElemType::U32, 1);
    let out = k.output("out", ElemType::U32, 1);
    let i = k.absolute_pos();
    let n = k.len(x);
    let inside = k.lt(i, n);
    let and = k.var_named("and", inside);
    k.if_(inside, |k| {
        let v = k.load(x, i);
        let big = k.gt(v, 3u32);
        k.assign(and, big);
    });
    let c = k.get(and);
    k.if_(c, |k| k.store(out, i, 1u32));
    same(guarded::definition(), k);
}

/// A `#[comptime]` parameter: an `if` on it keeps one branch; constants fold (`-1` and `N * 2`
/// are literals of the operand's type, not kernel operations).
#[kernel(cube_dim = 32)]
fn offset(out: &mut [i32], #[comptime] negate: bool, #[comptime] n: u32) {
    let i = ABSOLUTE_POS;
    let scale = n * 2;
    if negate {
        out[i] = (i * scale) as i32 * -1;
    } else {
        out[i] = (i * scale) as i32;
    }
}

#[test]
fn comptime_parameters_select_and_fold() {
    for negate in [false, true] {
        let mut k = KernelBuilder::new("offset", [32, 1, 1]);
        let out = k.output("out", ElemType::I32, 1);
        let i = k.absolute_pos();
        let v = k.mul(i, 6u32);
        let v = k.cast(v, ElemType::I32);
        let v = if negate { k.mul(v, -1i32) } else { v };
        k.store(out, i, v);
        same(offset::definition(negate, 3), k);
    }
    assert!(!std::ptr::eq(
        offset::definition(true, 3),
        offset::definition(false, 3)
    ));
    assert!(std::ptr::eq(
        offset::definition(true, 3),
        offset::definition(true, 3)
    ));
}

/// Type errors are the builder's, reported by `try_definition`.
#[kernel(cube_dim = 32)]
fn mixes_types(x: &[f32], out: &mut [u32]) {
    out[ABSOLUTE_POS] = x[ABSOLUTE_POS] + 1u32;
}

#[test]
fn type_errors_come_from_the_builder() {
    let e = mixes_types::try_definition().unwrap_err();
    assert!(
        matches!(e, crate::kernel::BuildError::Type { ref op, .. } if op == "add"),
        "{e}"
    );
}
