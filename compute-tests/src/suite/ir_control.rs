//! Kernel IR: control flow — divergent `if`/`else`, range loops with positive, negative and zero
//! steps (and the overflow stop of `ir.rs`), `loop`/`break`/`continue`, early `return`; variables
//! across blocks. All results are integers, compared exactly.

use compute_core::kernel::KernelBuilder;
use compute_core::{ComputeClient, ElemType, KernelArguments, Runtime};

use super::ir_util::{assert_same, build, download, launch, zeros};

/// Nested `if`/`else` that diverges within a cube: every unit takes its own path and assigns a
/// variable declared outside the branches.
pub fn ir_control_if_else_divergence<R: Runtime>(client: ComputeClient<R>) {
    let n = 200u32;
    let mut k = KernelBuilder::new("ir_if_else", [64, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let i = k.absolute_pos();
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        let v = k.var(0u32);
        let r3 = k.rem(i, 3u32);
        let m3 = k.eq(r3, 0u32);
        k.if_else(
            m3,
            |k| {
                let r2 = k.bit_and(i, 1u32);
                let even = k.eq(r2, 0u32);
                k.if_else(
                    even,
                    |k| {
                        let x = k.mul(i, 10u32);
                        k.assign(v, x);
                    },
                    |k| {
                        let x = k.add(i, 1000u32);
                        k.assign(v, x);
                    },
                );
            },
            |k| {
                let big = k.gt(i, 100u32);
                k.if_(big, |k| {
                    let x = k.sub(i, 100u32);
                    k.assign(v, x);
                });
                // Runs for every unit of this branch, after the nested if.
                let cur = k.get(v);
                let x = k.add(cur, 7u32);
                k.assign(v, x);
            },
        );
        let r = k.get(v);
        k.store(out, i, r);
    });
    let def = build(k);
    let h = zeros::<R, u32>(&client, n as usize);
    launch(
        &client,
        &def,
        [4, 1, 1],
        KernelArguments::new().buffer(h.clone().binding()),
    );
    let expected: Vec<u32> = (0..n)
        .map(|i| {
            if i % 3 == 0 {
                if i % 2 == 0 { i * 10 } else { i + 1000 }
            } else {
                i.saturating_sub(100) + 7
            }
        })
        .collect();
    assert_same(
        &download::<R, u32>(&client, &h),
        &expected,
        "nested if/else per unit",
    );
}

/// Range loops: per-unit trip counts with step 3, a negative step counting down while `i > end`,
/// a zero step (no iteration), an empty range, and the stop when `i + step` overflows (u8 up,
/// i8 down, u32 near MAX). Each loop records (count, sum of the counter widened to i64).
pub fn ir_control_range_steps<R: Runtime>(client: ComputeClient<R>) {
    let units = 40u32;
    const LOOPS: usize = 7;
    let mut k = KernelBuilder::new("ir_range_steps", [8, 1, 1]);
    let out = k.output("out", ElemType::I64, 1);
    // start/end/step of the fixed loops come from scalars: nothing to fold at compile time.
    let s_neg = [
        k.scalar("neg_start", ElemType::I32),
        k.scalar("neg_end", ElemType::I32),
        k.scalar("neg_step", ElemType::I32),
    ];
    let zero_step = k.scalar("zero_step", ElemType::U32);
    let u8s = [
        k.scalar("u8_start", ElemType::U8),
        k.scalar("u8_end", ElemType::U8),
        k.scalar("u8_step", ElemType::U8),
    ];
    let i8s = [
        k.scalar("i8_start", ElemType::I8),
        k.scalar("i8_end", ElemType::I8),
        k.scalar("i8_step", ElemType::I8),
    ];
    let u32s = [
        k.scalar("u32_start", ElemType::U32),
        k.scalar("u32_end", ElemType::U32),
        k.scalar("u32_step", ElemType::U32),
    ];
    let i = k.absolute_pos();
    let inside = k.lt(i, units);
    k.if_(inside, |k| {
        let base = k.mul(i, (2 * LOOPS) as u32);
        let record = |k: &mut KernelBuilder,
                      slot: usize,
                      body: &dyn Fn(
            &mut KernelBuilder,
            compute_core::kernel::Var,
            compute_core::kernel::Var,
        )| {
            let count = k.var(0i64);
            let sum = k.var(0i64);
            body(k, count, sum);
            let c = k.get(count);
            let s = k.get(sum);
            let idx = k.add(base, (2 * slot) as u32);
            k.store(out, idx, c);
            let idx = k.add(idx, 1u32);
            k.store(out, idx, s);
        };
        let tally = |k: &mut KernelBuilder, count, sum, v: compute_core::kernel::Value| {
            let c = k.get(count);
            let c = k.add(c, 1i64);
            k.assign(count, c);
            let w = k.cast(v, ElemType::I64);
            let s = k.get(sum);
            let s = k.add(s, w);
            k.assign(sum, s);
        };
        // 0: 0..i step 3 (per-unit trip count).
        record(k, 0, &|k, c, s| {
            k.range(0u32, i, 3u32, |k, j| tally(k, c, s, j))
        });
        // 1: 10 down to -5 exclusive, step -3: 10, 7, 4, 1, -2.
        record(k, 1, &|k, c, s| {
            k.range(s_neg[0], s_neg[1], s_neg[2], |k, j| tally(k, c, s, j))
        });
        // 2: zero step: no iteration.
        record(k, 2, &|k, c, s| {
            k.range(0u32, 10u32, zero_step, |k, j| tally(k, c, s, j))
        });
        // 3: u8 200..255 step 50: 200, 250, then 300 overflows: stop.
        record(k, 3, &|k, c, s| {
            k.range(u8s[0], u8s[1], u8s[2], |k, j| tally(k, c, s, j))
        });
        // 4: i8 -100 down to -128 step -50: -100, then -150 overflows: stop.
        record(k, 4, &|k, c, s| {
            k.range(i8s[0], i8s[1], i8s[2], |k, j| tally(k, c, s, j))
        });
        // 5: u32 MAX-5..MAX step 4: MAX-5, MAX-1.
        record(k, 5, &|k, c, s| {
            k.range(u32s[0], u32s[1], u32s[2], |k, j| tally(k, c, s, j))
        });
        // 6: empty: i..i.
        record(k, 6, &|k, c, s| {
            k.range(i, i, 1u32, |k, j| tally(k, c, s, j))
        });
    });
    let def = build(k);
    let h = zeros::<R, i64>(&client, units as usize * 2 * LOOPS);
    launch(
        &client,
        &def,
        [units / 8, 1, 1],
        KernelArguments::new()
            .buffer(h.clone().binding())
            .scalar(10i32)
            .scalar(-5i32)
            .scalar(-3i32)
            .scalar(0u32)
            .scalar(200u8)
            .scalar(255u8)
            .scalar(50u8)
            .scalar(-100i8)
            .scalar(-128i8)
            .scalar(-50i8)
            .scalar(u32::MAX - 5)
            .scalar(u32::MAX)
            .scalar(4u32),
    );
    let max = u32::MAX as i64;
    let expected: Vec<i64> = (0..units as i64)
        .flat_map(|i| {
            let up: Vec<i64> = (0..i).step_by(3).collect();
            [
                up.len() as i64,
                up.iter().sum(),
                5,
                10 + 7 + 4 + 1 - 2,
                0,
                0,
                2,
                450,
                1,
                -100,
                2,
                (max - 5) + (max - 1),
                0,
                0,
            ]
        })
        .collect();
    assert_same(
        &download::<R, i64>(&client, &h),
        &expected,
        "per unit (count, sum) of [0..i step 3, 10..-5 step -3, step 0, u8 200..255 step 50, i8 -100..-128 step -50, u32 MAX-5..MAX step 4, i..i]",
    );
}

/// `loop` with `break` at per-unit trip counts (Collatz steps), `continue` in a range loop, and a
/// `break` that leaves only the inner of two nested loops.
pub fn ir_control_loop_break_continue<R: Runtime>(client: ComputeClient<R>) {
    let n = 96u32;
    let mut k = KernelBuilder::new("ir_loops", [32, 1, 1]);
    let out = k.output("out", ElemType::U32, 1);
    let i = k.absolute_pos();
    let inside = k.lt(i, n);
    k.if_(inside, |k| {
        // Collatz steps of i + 1.
        let start = k.add(i, 1u32);
        let x = k.var(start);
        let steps = k.var(0u32);
        k.loop_(|k| {
            let cur = k.get(x);
            let done = k.eq(cur, 1u32);
            k.if_(done, |k| k.break_());
            let odd = k.bit_and(cur, 1u32);
            let odd = k.eq(odd, 1u32);
            let up = k.mul(cur, 3u32);
            let up = k.add(up, 1u32);
            let down = k.shr(cur, 1u32);
            let next = k.select(odd, up, down);
            k.assign(x, next);
            let s = k.get(steps);
            let s = k.add(s, 1u32);
            k.assign(steps, s);
        });
        // Sum of j in 0..i, skipping multiples of 3 with continue.
        let sum = k.var(0u32);
        k.range(0u32, i, 1u32, |k, j| {
            let r = k.rem(j, 3u32);
            let skip = k.eq(r, 0u32);
            k.if_(skip, |k| k.continue_());
            let s = k.get(sum);
            let s = k.add(s, j);
            k.assign(sum, s);
        });
        // Nested: for a in 0..4, inner loop counts b up and breaks at b == a + (i % 3); the
        // outer loop keeps going.
        let total = k.var(0u32);
        let r3 = k.rem(i, 3u32);
        k.range(0u32, 4u32, 1u32, |k, a| {
            let limit = k.add(a, r3);
            let b = k.var(0u32);
            k.loop_(|k| {
                let cur = k.get(b);
                let stop = k.ge(cur, limit);
                k.if_(stop, |k| k.break_());
                let nb = k.add(cur, 1u32);
                k.assign(b, nb);
            });
            let t = k.get(total);
            let bv = k.get(b);
            let t = k.add(t, bv);
            k.assign(total, t);
        });
        let base = k.mul(i, 3u32);
        let s = k.get(steps);
        k.store(out, base, s);
        let idx = k.add(base, 1u32);
        let s = k.get(sum);
        k.store(out, idx, s);
        let idx = k.add(base, 2u32);
        let t = k.get(total);
        k.store(out, idx, t);
    });
    let def = build(k);
    let h = zeros::<R, u32>(&client, n as usize * 3);
    launch(
        &client,
        &def,
        [3, 1, 1],
        KernelArguments::new().buffer(h.clone().binding()),
    );
    let expected: Vec<u32> = (0..n)
        .flat_map(|i| {
            let mut x = i + 1;
            let mut steps = 0;
            while x != 1 {
                x = if x % 2 == 1 { 3 * x + 1 } else { x / 2 };
                steps += 1;
            }
            let sum: u32 = (0..i).filter(|j| j % 3 != 0).sum();
            let total: u32 = (0..4).map(|a| a + i % 3).sum();
            [steps, sum, total]
        })
        .collect();
    assert_same(
        &download::<R, u32>(&client, &h),
        &expected,
        "per unit [collatz steps (loop/break), sum skipping multiples of 3 (continue), nested break total]",
    );
}

/// Early `return`: odd units return before their store; units return from inside a loop at
/// iteration `i % 5`, after storing the iterations before it, and never reach the store after
/// the loop.
pub fn ir_control_early_return<R: Runtime>(client: ComputeClient<R>) {
    let n = 64u32;
    let mut k = KernelBuilder::new("ir_return", [32, 1, 1]);
    let flags = k.output("flags", ElemType::U32, 1);
    let trace = k.output("trace", ElemType::U32, 1);
    let i = k.absolute_pos();
    let stop_at = k.rem(i, 5u32);
    // trace[i * 8 + j] = j + 1 for each iteration run; trace[i * 8 + 7] = 99 after the loop.
    let base = k.mul(i, 8u32);
    let odd = k.bit_and(i, 1u32);
    let odd = k.eq(odd, 1u32);
    k.if_else(
        odd,
        |k| {
            k.range(0u32, 6u32, 1u32, |k, j| {
                let stop = k.eq(j, stop_at);
                k.if_(stop, |k| k.return_());
                let idx = k.add(base, j);
                let v = k.add(j, 1u32);
                k.store(trace, idx, v);
            });
            let idx = k.add(base, 7u32);
            k.store(trace, idx, 99u32);
            k.return_();
        },
        |k| {
            k.store(flags, i, 1u32);
        },
    );
    // Reached by even units only.
    let cur = k.load(flags, i);
    let v = k.add(cur, 10u32);
    k.store(flags, i, v);
    let def = build(k);
    let hf = zeros::<R, u32>(&client, n as usize);
    let ht = zeros::<R, u32>(&client, n as usize * 8);
    launch(
        &client,
        &def,
        [n / 32, 1, 1],
        KernelArguments::new()
            .buffer(hf.clone().binding())
            .buffer(ht.clone().binding()),
    );
    let ef: Vec<u32> = (0..n).map(|i| if i % 2 == 1 { 0 } else { 11 }).collect();
    assert_same(
        &download::<R, u32>(&client, &hf),
        &ef,
        "flags: 11 for even units, 0 for odd (returned)",
    );
    let et: Vec<u32> = (0..n)
        .flat_map(|i| {
            let mut t = [0u32; 8];
            if i % 2 == 1 {
                for j in 0..(i % 5) {
                    t[j as usize] = j + 1;
                }
            }
            t
        })
        .collect();
    assert_same(
        &download::<R, u32>(&client, &ht),
        &et,
        "trace: iterations before the return at i % 5, nothing after the loop",
    );
}
