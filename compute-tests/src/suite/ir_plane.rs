//! Kernel IR: plane (warp, subgroup) operations — sum, prod, min, max, all, any, broadcast,
//! shuffle, ballot — over full planes and under divergence (only the active units take part).
//!
//! The reference groups the units of a cube into planes of the `plane_size` the kernel reports,
//! with `unit_pos_plane == unit_pos % plane_size` (consecutive units form a plane). Sums and
//! products are of small integers, so every result is exact.

use compute_core::kernel::KernelBuilder;
use compute_core::{ComputeClient, ElemType, KernelArguments, Runtime};

use super::ir_util::{assert_same, build, download, feature_gate, launch, zeros};

const CUBE: u32 = 64;
const CUBES: u32 = 2;

fn value(i: u32) -> u32 {
    (i * 7 + i / 5) % 23
}

/// The plane size and lane of every unit, checked for consistency with the device's limits.
fn plane_layout<R: Runtime>(client: &ComputeClient<R>, meta: &[u32]) -> u32 {
    let ps = meta[0];
    let hw = &client.properties().hardware;
    assert!(
        (hw.plane_size_min..=hw.plane_size_max).contains(&ps) && ps.is_power_of_two(),
        "plane_size {ps} outside [{}, {}] or not a power of two",
        hw.plane_size_min,
        hw.plane_size_max
    );
    for (i, pair) in meta.chunks(2).enumerate() {
        let u = i as u32 % CUBE;
        assert_eq!(pair[0], ps, "plane_size differs at unit {i}");
        assert_eq!(pair[1], u % ps, "unit_pos_plane of unit {i}");
    }
    ps
}

/// Every plane operation over full planes of two cubes of 64 units.
pub fn ir_plane_ops<R: Runtime>(client: ComputeClient<R>) {
    let n = (CUBE * CUBES) as usize;
    const NU: u32 = 6;
    let mut k = KernelBuilder::new("ir_plane_ops", [CUBE, 1, 1]);
    let meta = k.output("meta", ElemType::U32, 1);
    let uo = k.output("u", ElemType::U32, 1);
    let so = k.output("s", ElemType::I32, 1);
    let fo = k.output("f", ElemType::F32, 1);
    let bo = k.output("ballot", ElemType::U32, 4);
    let i = k.absolute_pos();
    let ps = k.plane_size();
    let pu = k.unit_pos_plane();
    let m2 = k.mul(i, 2u32);
    k.store(meta, m2, ps);
    let m2 = k.add(m2, 1u32);
    k.store(meta, m2, pu);
    // v = (i * 7 + i / 5) % 23
    let a = k.mul(i, 7u32);
    let b = k.div(i, 5u32);
    let v = k.add(a, b);
    let v = k.rem(v, 23u32);
    let base = k.mul(i, NU);
    let sum = k.plane_sum(v);
    let bc = k.plane_broadcast(v, 3u32);
    let next = k.add(pu, 1u32);
    let lane = k.rem(next, ps);
    let sh = k.plane_shuffle(v, lane);
    let xl = k.bit_xor(pu, 1u32);
    let sx = k.plane_shuffle(v, xl);
    let lt = k.lt(v, 22u32);
    let all = k.plane_all(lt);
    let all = k.cast(all, ElemType::U32);
    let z = k.eq(v, 0u32);
    let any = k.plane_any(z);
    let any = k.cast(any, ElemType::U32);
    for (j, r) in [sum, bc, sh, sx, all, any].into_iter().enumerate() {
        let idx = k.add(base, j as u32);
        k.store(uo, idx, r);
    }
    // Signed: min, max of v - 11; prod of 2 (every 8th lane), -1 (every 3rd), 1.
    let vi = k.cast(v, ElemType::I32);
    let vi = k.sub(vi, 11i32);
    let mn = k.plane_min(vi);
    let mx = k.plane_max(vi);
    let r8 = k.rem(pu, 8u32);
    let e8 = k.eq(r8, 0u32);
    let r3 = k.rem(pu, 3u32);
    let e3 = k.eq(r3, 0u32);
    let m1 = k.select(e3, -1i32, 1i32);
    let pv = k.select(e8, 2i32, m1);
    let pr = k.plane_prod(pv);
    let sb = k.mul(i, 3u32);
    for (j, r) in [mn, mx, pr].into_iter().enumerate() {
        let idx = k.add(sb, j as u32);
        k.store(so, idx, r);
    }
    let vf = k.cast(v, ElemType::F32);
    let fs = k.plane_sum(vf);
    let fm = k.plane_max(vf);
    let fb = k.mul(i, 2u32);
    k.store(fo, fb, fs);
    let fb = k.add(fb, 1u32);
    k.store(fo, fb, fm);
    let odd = k.bit_and(v, 1u32);
    let odd = k.eq(odd, 1u32);
    let bal = k.ballot(odd);
    k.store(bo, i, bal);
    let def = build(k);
    let hm = zeros::<R, u32>(&client, n * 2);
    let hu = zeros::<R, u32>(&client, n * NU as usize);
    let hs = zeros::<R, i32>(&client, n * 3);
    let hf = zeros::<R, f32>(&client, n * 2);
    let hb = zeros::<R, u32>(&client, n * 4);
    launch(
        &client,
        &def,
        [CUBES, 1, 1],
        KernelArguments::new()
            .buffer(hm.clone().binding())
            .buffer(hu.clone().binding())
            .buffer(hs.clone().binding())
            .buffer(hf.clone().binding())
            .buffer(hb.clone().binding()),
    );
    if !feature_gate(&client, client.features().plane_ops, "plane operations") {
        return;
    }
    let ps = plane_layout(&client, &download::<R, u32>(&client, &hm));
    let mut eu = Vec::new();
    let mut es = Vec::new();
    let mut ef = Vec::new();
    let mut eb = Vec::new();
    for i in 0..n as u32 {
        let start = i - (i % CUBE) % ps;
        let lanes: Vec<u32> = (start..start + ps).collect();
        let pu = i - start;
        let vs: Vec<u32> = lanes.iter().map(|&l| value(l)).collect();
        eu.extend([
            vs.iter().sum(),
            vs[3],
            vs[((pu + 1) % ps) as usize],
            vs[(pu ^ 1) as usize],
            vs.iter().all(|&v| v < 22) as u32,
            vs.contains(&0) as u32,
        ]);
        let vi: Vec<i32> = vs.iter().map(|&v| v as i32 - 11).collect();
        let prod: i32 = (0..ps)
            .map(|l| {
                if l % 8 == 0 {
                    2
                } else if l % 3 == 0 {
                    -1
                } else {
                    1
                }
            })
            .product();
        es.extend([*vi.iter().min().unwrap(), *vi.iter().max().unwrap(), prod]);
        ef.extend([
            vs.iter().sum::<u32>() as f32,
            *vs.iter().max().unwrap() as f32,
        ]);
        let mut mask = [0u32; 4];
        for (l, &v) in vs.iter().enumerate() {
            if v % 2 == 1 {
                mask[l / 32] |= 1 << (l % 32);
            }
        }
        eb.extend(mask);
    }
    assert_same(
        &download::<R, u32>(&client, &hu),
        &eu,
        &format!(
            "plane_size {ps}, per unit [sum, broadcast(lane 3), shuffle(lane + 1), shuffle(lane ^ 1), all(v < 22), any(v == 0)]"
        ),
    );
    assert_same(
        &download::<R, i32>(&client, &hs),
        &es,
        "per unit [plane_min, plane_max, plane_prod] on i32",
    );
    assert_same(
        &download::<R, f32>(&client, &hf),
        &ef,
        "per unit [plane_sum, plane_max] on f32",
    );
    assert_same(
        &download::<R, u32>(&client, &hb),
        &eb,
        "ballot(v odd): bit l of word l / 32 for lane l",
    );
}

/// Plane operations under divergence: inside `if lane is even`, only the even lanes take part in
/// `plane_sum`, `plane_min`, `plane_all`, `plane_any` and `ballot`.
pub fn ir_plane_divergent<R: Runtime>(client: ComputeClient<R>) {
    let n = (CUBE * CUBES) as usize;
    const NU: u32 = 5;
    let mut k = KernelBuilder::new("ir_plane_divergent", [CUBE, 1, 1]);
    let meta = k.output("meta", ElemType::U32, 1);
    let uo = k.output("u", ElemType::U32, 1);
    let bo = k.output("ballot", ElemType::U32, 4);
    let i = k.absolute_pos();
    let ps = k.plane_size();
    let pu = k.unit_pos_plane();
    let m2 = k.mul(i, 2u32);
    k.store(meta, m2, ps);
    let m2 = k.add(m2, 1u32);
    k.store(meta, m2, pu);
    let a = k.mul(i, 7u32);
    let b = k.div(i, 5u32);
    let v = k.add(a, b);
    let v = k.rem(v, 23u32);
    let low = k.bit_and(pu, 1u32);
    let even = k.eq(low, 0u32);
    k.if_(even, |k| {
        let sum = k.plane_sum(v);
        let mn = k.plane_min(v);
        let c = k.ne(v, 5u32);
        let all = k.plane_all(c);
        let all = k.cast(all, ElemType::U32);
        let c = k.eq(v, 5u32);
        let any = k.plane_any(c);
        let any = k.cast(any, ElemType::U32);
        let t = k.lit_bool(true);
        let bal = k.ballot(t);
        let cnt = k.plane_sum(1u32);
        let base = k.mul(i, NU);
        for (j, r) in [sum, mn, all, any, cnt].into_iter().enumerate() {
            let idx = k.add(base, j as u32);
            k.store(uo, idx, r);
        }
        k.store(bo, i, bal);
    });
    let def = build(k);
    let hm = zeros::<R, u32>(&client, n * 2);
    let hu = zeros::<R, u32>(&client, n * NU as usize);
    let hb = zeros::<R, u32>(&client, n * 4);
    launch(
        &client,
        &def,
        [CUBES, 1, 1],
        KernelArguments::new()
            .buffer(hm.clone().binding())
            .buffer(hu.clone().binding())
            .buffer(hb.clone().binding()),
    );
    if !feature_gate(&client, client.features().plane_ops, "plane operations") {
        return;
    }
    let ps = plane_layout(&client, &download::<R, u32>(&client, &hm));
    let mut eu = Vec::new();
    let mut eb = Vec::new();
    for i in 0..n as u32 {
        let start = i - (i % CUBE) % ps;
        let pu = i - start;
        if pu % 2 == 1 {
            eu.extend([0; NU as usize]);
            eb.extend([0; 4]);
            continue;
        }
        let vs: Vec<u32> = (start..start + ps).step_by(2).map(value).collect();
        eu.extend([
            vs.iter().sum(),
            *vs.iter().min().unwrap(),
            vs.iter().all(|&v| v != 5) as u32,
            vs.contains(&5) as u32,
            vs.len() as u32,
        ]);
        let mut mask = [0u32; 4];
        for l in (0..ps as usize).step_by(2) {
            mask[l / 32] |= 1 << (l % 32);
        }
        eb.extend(mask);
    }
    assert_same(
        &download::<R, u32>(&client, &hu),
        &eu,
        &format!("plane_size {ps}, even lanes only: [sum, min, all(v != 5), any(v == 5), count]"),
    );
    assert_same(
        &download::<R, u32>(&client, &hb),
        &eb,
        "ballot(true) among the even lanes",
    );
}
