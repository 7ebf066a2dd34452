//! Kernel IR: local arrays, shared memory with barriers, and atomics on global and shared memory.
//! Integer results are compared exactly; the f32 atomic sum adds small integers, so it is exact.

use compute_core::kernel::{KernelBuilder, Value};
use compute_core::{ComputeClient, ElemType, KernelArguments, Runtime};

use super::ir_util::{assert_same, build, download, feature_gate, launch, upload, zeros};

/// Local arrays are private to each unit: a scalar `i32` array filled and read back reversed, a
/// `f32x4` array, and out-of-range accesses (loads read 0, stores are dropped, always).
pub fn ir_memory_local_array<R: Runtime>(client: ComputeClient<R>) {
    let n = 100u32;
    const W: u32 = 6;
    let mut k = KernelBuilder::new("ir_local_array", [32, 1, 1]);
    let out = k.output("out", ElemType::I32, 1);
    let vout = k.output("vout", ElemType::F32, 4);
    let i = k.absolute_pos();
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let arr = k.local_array("arr", ElemType::I32, 1, 16);
        let ii = k.cast(i, ElemType::I32);
        k.range(0i32, 16i32, 1i32, |k, j| {
            let a = k.mul(ii, j);
            let b = k.mul(j, j);
            let v = k.sub(a, b);
            k.store(arr, j, v);
        });
        // Out-of-range stores are dropped: they must not land in arr[0..16].
        k.store(arr, 16u32, 12345i32);
        k.store(arr, 1000u32, 777i32);
        // Weighted sum of the reversed array.
        let acc = k.var(0i32);
        k.range(0i32, 16i32, 1i32, |k, j| {
            let r = k.sub(15i32, j);
            let v = k.load(arr, r);
            let w = k.add(j, 1i32);
            let t = k.mul(v, w);
            let s = k.get(acc);
            let s = k.add(s, t);
            k.assign(acc, s);
        });
        let base = k.mul(i, W);
        let s = k.get(acc);
        k.store(out, base, s);
        let last = k.load(arr, 15u32);
        let idx = k.add(base, 1u32);
        k.store(out, idx, last);
        let oob = k.load(arr, 16u32);
        let idx = k.add(base, 2u32);
        k.store(out, idx, oob);
        let oob = k.load(arr, 4000u32);
        let idx = k.add(base, 3u32);
        k.store(out, idx, oob);
        let first = k.load(arr, 0u32);
        let idx = k.add(base, 4u32);
        k.store(out, idx, first);
        // Overwrite one entry and read it back.
        k.store(arr, 7u32, -1i32);
        let seven = k.load(arr, 7u32);
        let idx = k.add(base, 5u32);
        k.store(out, idx, seven);
        // A vector local array: v[j] = (i, j, i + j, i * j) as f32.
        let varr = k.local_array("varr", ElemType::F32, 4, 4);
        let fi = k.cast(i, ElemType::F32);
        k.range(0u32, 4u32, 1u32, |k, j| {
            let fj = k.cast(j, ElemType::F32);
            let s = k.add(fi, fj);
            let p = k.mul(fi, fj);
            let v = k.vector(&[fi, fj, s, p]);
            k.store(varr, j, v);
        });
        let vbase = k.mul(i, 4u32);
        k.range(0u32, 4u32, 1u32, |k, j| {
            let r = k.sub(3u32, j);
            let v = k.load(varr, r);
            let idx = k.add(vbase, j);
            k.store(vout, idx, v);
        });
    });
    let def = build(k);
    let h = zeros::<R, i32>(&client, (n * W) as usize);
    let hv = zeros::<R, f32>(&client, (n * 16) as usize);
    launch(
        &client,
        &def,
        [n.div_ceil(32), 1, 1],
        KernelArguments::new()
            .buffer(h.clone().binding())
            .buffer(hv.clone().binding()),
    );
    let expected: Vec<i32> = (0..n as i32)
        .flat_map(|i| {
            let arr: Vec<i32> = (0..16).map(|j| i * j - j * j).collect();
            let s: i32 = (0..16).map(|j| arr[15 - j as usize] * (j + 1)).sum();
            [s, arr[15], 0, 0, arr[0], -1]
        })
        .collect();
    assert_same(
        &download::<R, i32>(&client, &h),
        &expected,
        "per unit [reversed weighted sum, arr[15], arr[16] (oob: 0), arr[4000] (oob: 0), arr[0], arr[7] after store]",
    );
    let ev: Vec<f32> = (0..n)
        .flat_map(|i| {
            (0..4u32).rev().flat_map(move |j| {
                let (fi, fj) = (i as f32, j as f32);
                [fi, fj, fi + fj, fi * fj]
            })
        })
        .collect();
    assert_same(
        &download::<R, f32>(&client, &hv),
        &ev,
        "f32x4 local array, reversed",
    );
}

/// Shared memory reversal across a cube: each unit writes its element, a barrier, then each
/// reads its mirror's. Without the barrier (or with shared memory not private per cube) the
/// result is wrong. Eight cubes of 256 units.
pub fn ir_memory_shared_reverse_barrier<R: Runtime>(client: ComputeClient<R>) {
    let cube = 256u32;
    let cubes = 8u32;
    let n = (cube * cubes) as usize;
    let input: Vec<u32> = (0..n as u32)
        .map(|v| v.wrapping_mul(2_654_435_761))
        .collect();
    let mut k = KernelBuilder::new("ir_shared_reverse", [cube, 1, 1]);
    let hin = k.input("in", ElemType::U32, 1);
    let out = k.output("out", ElemType::U32, 1);
    let sh = k.shared("tile", ElemType::U32, 1, cube);
    let i = k.absolute_pos();
    let u = k.unit_pos();
    let v = k.load(hin, i);
    k.store(sh, u, v);
    k.barrier();
    let m = k.sub(cube - 1, u);
    let r = k.load(sh, m);
    k.store(out, i, r);
    let def = build(k);
    let h = zeros::<R, u32>(&client, n);
    launch(
        &client,
        &def,
        [cubes, 1, 1],
        KernelArguments::new()
            .buffer(upload(&client, &input).binding())
            .buffer(h.clone().binding()),
    );
    let expected: Vec<u32> = input
        .chunks(cube as usize)
        .flat_map(|c| c.iter().rev().copied().collect::<Vec<_>>())
        .collect();
    assert_same(
        &download::<R, u32>(&client, &h),
        &expected,
        "per-cube reversal through shared memory",
    );
}

/// A tree reduction in shared memory: stride halving in a `loop` with a barrier per step, over
/// 16 cubes of 256 `u32`; plus a `f32x4` shared array summed the same way (small integers:
/// exact). Shared memory also reads 0 and drops stores out of range.
pub fn ir_memory_shared_reduction<R: Runtime>(client: ComputeClient<R>) {
    let cube = 256u32;
    let cubes = 16u32;
    let n = (cube * cubes) as usize;
    let input: Vec<u32> = (0..n as u32).map(|v| (v * 7919) % 1000).collect();
    let vin: Vec<f32> = (0..n * 4).map(|v| (v % 13) as f32).collect();
    let mut k = KernelBuilder::new("ir_shared_reduce", [cube, 1, 1]);
    let hin = k.input("in", ElemType::U32, 1);
    let hvin = k.input("vin", ElemType::F32, 4);
    let out = k.output("out", ElemType::U32, 1);
    let vout = k.output("vout", ElemType::F32, 4);
    let sh = k.shared("partial", ElemType::U32, 1, cube);
    let vsh = k.shared("vpartial", ElemType::F32, 4, cube);
    let i = k.absolute_pos();
    let u = k.unit_pos();
    let v = k.load(hin, i);
    k.store(sh, u, v);
    let vv = k.load(hvin, i);
    k.store(vsh, u, vv);
    // Out-of-range shared store: dropped, must not corrupt anything.
    k.store(sh, cube + 3, 0xFFFF_FFFFu32);
    k.barrier();
    let stride = k.var(cube / 2);
    k.loop_(|k| {
        let s = k.get(stride);
        let done = k.eq(s, 0u32);
        k.if_(done, |k| k.break_());
        let active = k.lt(u, s);
        k.if_(active, |k| {
            let other = k.add(u, s);
            let a = k.load(sh, u);
            let b = k.load(sh, other);
            let t = k.add(a, b);
            k.store(sh, u, t);
            let a = k.load(vsh, u);
            let b = k.load(vsh, other);
            let t = k.add(a, b);
            k.store(vsh, u, t);
        });
        k.barrier();
        let s = k.shr(s, 1u32);
        k.assign(stride, s);
    });
    let first = k.eq(u, 0u32);
    k.if_(first, |k| {
        let c = k.cube_pos();
        let total = k.load(sh, 0u32);
        let oob = k.load(sh, cube + 3);
        let t = k.add(total, oob);
        k.store(out, c, t);
        let vt = k.load(vsh, 0u32);
        k.store(vout, c, vt);
    });
    let def = build(k);
    let h = zeros::<R, u32>(&client, cubes as usize);
    let hv = zeros::<R, f32>(&client, cubes as usize * 4);
    launch(
        &client,
        &def,
        [cubes, 1, 1],
        KernelArguments::new()
            .buffer(upload(&client, &input).binding())
            .buffer(upload(&client, &vin).binding())
            .buffer(h.clone().binding())
            .buffer(hv.clone().binding()),
    );
    let expected: Vec<u32> = input
        .chunks(cube as usize)
        .map(|c| c.iter().sum())
        .collect();
    assert_same(
        &download::<R, u32>(&client, &h),
        &expected,
        "per-cube sum (+ out-of-range shared load, 0)",
    );
    let ev: Vec<f32> = vin
        .chunks(cube as usize * 4)
        .flat_map(|c| (0..4).map(move |lane| c.iter().skip(lane).step_by(4).sum::<f32>()))
        .collect();
    assert_same(&download::<R, f32>(&client, &hv), &ev, "per-cube f32x4 sum");
}

fn atomics<R: Runtime>(client: &ComputeClient<R>) -> bool {
    client.features().atomics
}

/// A histogram with `atomic_add` on global `u32` across 64 cubes of 256 units (heavy contention
/// on 37 bins); the count matches the host's exactly.
pub fn ir_memory_atomic_histogram<R: Runtime>(client: ComputeClient<R>) {
    let bins = 37u32;
    let n = 64 * 256usize;
    let input: Vec<u32> = (0..n as u32)
        .map(|v| v.wrapping_mul(2_654_435_761).rotate_left(7) % 1000)
        .collect();
    let mut k = KernelBuilder::new("ir_histogram", [256, 1, 1]);
    let hin = k.input("in", ElemType::U32, 1);
    let hist = k.output("hist", ElemType::U32, 1);
    let i = k.absolute_pos();
    let v = k.load(hin, i);
    let b = k.rem(v, bins);
    k.atomic_add(hist, b, 1u32);
    let def = build(k);
    let h = zeros::<R, u32>(&client, bins as usize);
    launch(
        &client,
        &def,
        [64, 1, 1],
        KernelArguments::new()
            .buffer(upload(&client, &input).binding())
            .buffer(h.clone().binding()),
    );
    if !feature_gate(&client, atomics(&client), "atomics") {
        return;
    }
    let mut expected = vec![0u32; bins as usize];
    for v in &input {
        expected[(v % bins) as usize] += 1;
    }
    assert_same(&download::<R, u32>(&client, &h), &expected, "histogram");
}

/// Every atomic operation on global memory, contended by 256 units in 4 cubes: add, sub,
/// and, or, xor on `u32`; min, max on `i32` (signed order) and `u32` (unsigned order);
/// exchange (every value is returned exactly once); compare-exchange (exactly one winner); a
/// compare-exchange loop counter; atomic store and load.
pub fn ir_memory_atomic_global_ops<R: Runtime>(client: ComputeClient<R>) {
    let units = 256u32;
    let mut k = KernelBuilder::new("ir_atomic_global", [64, 1, 1]);
    let bits = k.output("bits", ElemType::U32, 1);
    let signed = k.output("signed", ElemType::I32, 1);
    let ret = k.output("ret", ElemType::U32, 1);
    let slots = k.output("slots", ElemType::U32, 1);
    let i = k.absolute_pos();
    let one = k.lit_u32(1);
    let bit = k.rem(i, 32u32);
    let mask = k.shl(one, bit);
    // bits: [sum, 1000000 - n, and (starts all ones), or, xor, umin, umax, xchg, cas, loop cas]
    k.atomic_add(bits, 0u32, i);
    k.atomic_sub(bits, 1u32, 1u32);
    let nmask = k.bit_not(mask);
    k.atomic_and(bits, 2u32, nmask);
    k.atomic_or(bits, 3u32, mask);
    let x = k.mul(i, 2_654_435_761u32);
    k.atomic_xor(bits, 4u32, x);
    k.atomic_min(bits, 5u32, x);
    k.atomic_max(bits, 6u32, x);
    let id = k.add(i, 1u32);
    let old = k.atomic_exchange(bits, 7u32, id);
    let ri = k.mul(i, 2u32);
    k.store(ret, ri, old);
    let old = k.atomic_compare_exchange(bits, 8u32, 0u32, id);
    let ri1 = k.add(ri, 1u32);
    k.store(ret, ri1, old);
    // A lock-free increment: retry the compare-exchange until it sees its own read.
    k.loop_(|k| {
        let cur = k.atomic_load(bits, 9u32);
        let next = k.add(cur, 1u32);
        let seen = k.atomic_compare_exchange(bits, 9u32, cur, next);
        let done = k.eq(seen, cur);
        k.if_(done, |k| k.break_());
    });
    // signed: [min, max] of values with both signs.
    let xi = k.bitcast(x, ElemType::I32);
    let xi = k.shr(xi, 4i32);
    k.atomic_min(signed, 0u32, xi);
    k.atomic_max(signed, 1u32, xi);
    // slots: atomic store then atomic load of one's own slot (n..2n), and of a neighbour's
    // slot written before a previous launch (0..n).
    let v = k.mul(i, 3u32);
    let own = k.add(i, units);
    k.atomic_store(slots, own, v);
    let back = k.atomic_load(slots, own);
    let plus = k.add(back, 1u32);
    k.store(slots, i, plus);
    let def = build(k);
    let mut init = vec![0u32; 10];
    init[1] = 1_000_000;
    init[2] = u32::MAX;
    init[5] = u32::MAX;
    let hbits = upload(&client, &init);
    let hsigned = upload(&client, &[i32::MAX, i32::MIN]);
    let hret = zeros::<R, u32>(&client, units as usize * 2);
    let hslots = zeros::<R, u32>(&client, units as usize * 2);
    launch(
        &client,
        &def,
        [units / 64, 1, 1],
        KernelArguments::new()
            .buffer(hbits.clone().binding())
            .buffer(hsigned.clone().binding())
            .buffer(hret.clone().binding())
            .buffer(hslots.clone().binding()),
    );
    if !feature_gate(&client, atomics(&client), "atomics") {
        return;
    }
    let got = download::<R, u32>(&client, &hbits);
    let xs: Vec<u32> = (0..units).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let sum: u32 = (0..units).sum();
    let xor = xs.iter().fold(0, |a, b| a ^ b);
    let expected_fixed = [
        sum,
        1_000_000 - units,
        0,
        u32::MAX,
        xor,
        *xs.iter().min().unwrap(),
        *xs.iter().max().unwrap(),
    ];
    assert_same(
        &got[..7],
        &expected_fixed,
        "[add, sub, and, or, xor, min (u32), max (u32)]",
    );
    assert_eq!(got[9], units, "compare-exchange loop counter");
    let ret = download::<R, u32>(&client, &hret);
    // Exchange: the returned values and the final value are 0..=units, each once.
    let mut seen: Vec<u32> = ret.iter().step_by(2).copied().collect();
    seen.push(got[7]);
    seen.sort_unstable();
    assert_same(
        &seen,
        &(0..=units).collect::<Vec<_>>(),
        "exchange: returned values and final value",
    );
    // Compare-exchange: one unit saw 0 and won; every other saw the winner's id.
    let cas: Vec<u32> = ret.iter().skip(1).step_by(2).copied().collect();
    let winners: Vec<usize> = (0..units as usize).filter(|&u| cas[u] == 0).collect();
    assert_eq!(
        winners.len(),
        1,
        "compare-exchange: exactly one winner, got {winners:?}"
    );
    let winner_id = winners[0] as u32 + 1;
    assert_eq!(
        got[8], winner_id,
        "compare-exchange: the final value is the winner's"
    );
    assert!(
        cas.iter()
            .enumerate()
            .all(|(u, &c)| u == winners[0] || c == winner_id),
        "compare-exchange: losers must see the winner's value {winner_id}: {cas:?}"
    );
    let si: Vec<i32> = xs.iter().map(|&x| (x as i32) >> 4).collect();
    assert_same(
        &download::<R, i32>(&client, &hsigned),
        &[*si.iter().min().unwrap(), *si.iter().max().unwrap()],
        "[min, max] (i32, signed order)",
    );
    let slots = download::<R, u32>(&client, &hslots);
    let es: Vec<u32> = (0..units)
        .map(|i| i * 3 + 1)
        .chain((0..units).map(|i| i * 3))
        .collect();
    assert_same(
        &slots,
        &es,
        "atomic_store then atomic_load of the unit's slot",
    );
}

/// Atomics on shared memory: a per-cube histogram (zeroed, barrier, `atomic_add`, barrier, then
/// merged into global with `atomic_add`), and per-cube `atomic_max`, `atomic_min`, `atomic_sub`,
/// `atomic_or`, `atomic_and`, `atomic_xor`, `atomic_exchange`, `atomic_compare_exchange` results
/// written out by unit 0. 32 cubes of 128 units.
pub fn ir_memory_atomic_shared<R: Runtime>(client: ComputeClient<R>) {
    let cube = 128u32;
    let cubes = 32u32;
    let bins = 16u32;
    let n = (cube * cubes) as usize;
    let input: Vec<u32> = (0..n as u32)
        .map(|v| v.wrapping_mul(40_503).rotate_right(3))
        .collect();
    const STATS: u32 = 8;
    let mut k = KernelBuilder::new("ir_atomic_shared", [cube, 1, 1]);
    let hin = k.input("in", ElemType::U32, 1);
    let hist = k.output("hist", ElemType::U32, 1);
    let stats = k.output("stats", ElemType::U32, 1);
    let sh = k.shared("bins", ElemType::U32, 1, bins);
    let st = k.shared("cube_stats", ElemType::U32, 1, STATS);
    let i = k.absolute_pos();
    let u = k.unit_pos();
    let zero_bins = k.lt(u, bins);
    k.if_(zero_bins, |k| k.store(sh, u, 0u32));
    let init: [u32; STATS as usize] = [0, u32::MAX, 100_000, 0, u32::MAX, 0, 0, 0];
    let is0 = k.eq(u, 0u32);
    k.if_(is0, |k| {
        for (j, &v) in init.iter().enumerate() {
            k.store(st, j as u32, v);
        }
    });
    k.barrier();
    let v = k.load(hin, i);
    let b = k.rem(v, bins);
    k.atomic_add(sh, b, 1u32);
    let small = k.shr(v, 8u32);
    k.atomic_max(st, 0u32, small);
    k.atomic_min(st, 1u32, small);
    k.atomic_sub(st, 2u32, u);
    let one = k.lit_u32(1);
    let bit = k.rem(u, 32u32);
    let mask: Value = k.shl(one, bit);
    k.atomic_or(st, 3u32, mask);
    let nmask = k.bit_not(mask);
    k.atomic_and(st, 4u32, nmask);
    k.atomic_xor(st, 5u32, v);
    let id = k.add(u, 1u32);
    k.atomic_exchange(st, 6u32, id);
    k.atomic_compare_exchange(st, 7u32, 0u32, id);
    k.barrier();
    k.if_(zero_bins, |k| {
        let c = k.load(sh, u);
        k.atomic_add(hist, u, c);
    });
    k.if_(is0, |k| {
        let c = k.cube_pos();
        let base = k.mul(c, STATS);
        for j in 0..STATS {
            let s = k.atomic_load(st, j);
            let idx = k.add(base, j);
            k.store(stats, idx, s);
        }
    });
    let def = build(k);
    let hh = zeros::<R, u32>(&client, bins as usize);
    let hs = zeros::<R, u32>(&client, (cubes * STATS) as usize);
    launch(
        &client,
        &def,
        [cubes, 1, 1],
        KernelArguments::new()
            .buffer(upload(&client, &input).binding())
            .buffer(hh.clone().binding())
            .buffer(hs.clone().binding()),
    );
    if !feature_gate(&client, atomics(&client), "atomics") {
        return;
    }
    let mut eh = vec![0u32; bins as usize];
    for v in &input {
        eh[(v % bins) as usize] += 1;
    }
    assert_same(
        &download::<R, u32>(&client, &hh),
        &eh,
        "histogram through shared atomics",
    );
    let got = download::<R, u32>(&client, &hs);
    let mut bad = Vec::new();
    for c in 0..cubes as usize {
        let vals = &input[c * cube as usize..(c + 1) * cube as usize];
        let g = &got[c * STATS as usize..(c + 1) * STATS as usize];
        let smalls = vals.iter().map(|v| v >> 8);
        let expected_det = [
            smalls.clone().max().unwrap(),
            smalls.min().unwrap(),
            100_000 - (0..cube).sum::<u32>(),
            u32::MAX,
            0,
            vals.iter().fold(0, |a, b| a ^ b),
        ];
        for (j, e) in expected_det.iter().enumerate() {
            if g[j] != *e {
                bad.push(format!("cube {c} stat {j}: got {}, expected {e}", g[j]));
            }
        }
        if !(1..=cube).contains(&g[6]) {
            bad.push(format!("cube {c} exchange: final {} is no unit's id", g[6]));
        }
        if !(1..=cube).contains(&g[7]) {
            bad.push(format!(
                "cube {c} compare-exchange: final {} is no unit's id",
                g[7]
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "per-cube shared [max, min, sub, or, and, xor, exchange, compare-exchange]: {}",
        bad.join("; ")
    );
}

/// Atomic add on `f32` (sums of small integers: exact in any order) and on `u64`, `i64`
/// min/max, on global memory; gated on atomics and the 64-bit types.
pub fn ir_memory_atomic_wide_and_float<R: Runtime>(client: ComputeClient<R>) {
    let units = 512u32;
    let mut k = KernelBuilder::new("ir_atomic_wide", [128, 1, 1]);
    let f = k.output("f", ElemType::F32, 1);
    let w = k.output("w", ElemType::U64, 1);
    let s = k.output("s", ElemType::I64, 1);
    let i = k.absolute_pos();
    let r = k.rem(i, 10u32);
    let fv = k.cast(r, ElemType::F32);
    k.atomic_add(f, 0u32, fv);
    let wi = k.cast(i, ElemType::U64);
    let big = k.mul(wi, 1u64 << 33);
    k.atomic_add(w, 0u32, big);
    let si = k.cast(i, ElemType::I64);
    let sv = k.mul(si, -(1i64 << 40));
    let sv = k.add(sv, 1i64 << 45);
    k.atomic_min(s, 0u32, sv);
    k.atomic_max(s, 1u32, sv);
    let def = build(k);
    let hf = zeros::<R, f32>(&client, 1);
    let hw = zeros::<R, u64>(&client, 1);
    let hs = upload(&client, &[i64::MAX, i64::MIN]);
    launch(
        &client,
        &def,
        [units / 128, 1, 1],
        KernelArguments::new()
            .buffer(hf.clone().binding())
            .buffer(hw.clone().binding())
            .buffer(hs.clone().binding()),
    );
    let f = client.features();
    let ok = f.atomics && f.supports(ElemType::U64) && f.supports(ElemType::I64);
    if !feature_gate(&client, ok, "64-bit atomics") {
        return;
    }
    let ef: f32 = (0..units).map(|i| (i % 10) as f32).sum();
    assert_same(&download::<R, f32>(&client, &hf), &[ef], "f32 atomic_add");
    let ew: u64 = (0..units as u64)
        .map(|i| i << 33)
        .fold(0u64, |a, b| a.wrapping_add(b));
    assert_same(&download::<R, u64>(&client, &hw), &[ew], "u64 atomic_add");
    let sv: Vec<i64> = (0..units as i64)
        .map(|i| i * -(1 << 40) + (1 << 45))
        .collect();
    assert_same(
        &download::<R, i64>(&client, &hs),
        &[*sv.iter().min().unwrap(), *sv.iter().max().unwrap()],
        "i64 [atomic_min, atomic_max]",
    );
}
