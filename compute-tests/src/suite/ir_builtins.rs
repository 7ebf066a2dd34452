//! Kernel IR: builtins in a 3-D launch — absolute, unit and cube positions (linear and x, y, z),
//! cube dimension and cube count (linear and x, y, z), plane size and unit position in the plane.
//! Linear variants flatten with x fastest. Exact.

use compute_core::kernel::{Builtin, KernelBuilder};
use compute_core::{ComputeClient, ElemType, KernelArguments, Runtime};

use super::ir_util::{assert_same, build, download, feature_gate, launch, zeros};

const DIM: [u32; 3] = [4, 2, 3];
const COUNT: [u32; 3] = [3, 2, 2];

const BUILTINS: [Builtin; 20] = [
    Builtin::AbsolutePos,
    Builtin::AbsolutePosX,
    Builtin::AbsolutePosY,
    Builtin::AbsolutePosZ,
    Builtin::UnitPos,
    Builtin::UnitPosX,
    Builtin::UnitPosY,
    Builtin::UnitPosZ,
    Builtin::CubePos,
    Builtin::CubePosX,
    Builtin::CubePosY,
    Builtin::CubePosZ,
    Builtin::CubeDim,
    Builtin::CubeDimX,
    Builtin::CubeDimY,
    Builtin::CubeDimZ,
    Builtin::CubeCount,
    Builtin::CubeCountX,
    Builtin::CubeCountY,
    Builtin::CubeCountZ,
];

/// Every unit of a [4, 2, 3] x [3, 2, 2] launch stores every position and size builtin at its
/// absolute position; each of the 288 slots is written exactly once with the host's values.
pub fn ir_builtins_3d<R: Runtime>(client: ComputeClient<R>) {
    let nb = BUILTINS.len() as u32;
    let units = DIM.iter().product::<u32>() * COUNT.iter().product::<u32>();
    let mut k = KernelBuilder::new("ir_builtins_3d", DIM);
    let out = k.output("out", ElemType::U32, 1);
    let hits = k.output("hits", ElemType::U32, 1);
    let abs = k.absolute_pos();
    let base = k.mul(abs, nb);
    for (j, &b) in BUILTINS.iter().enumerate() {
        let v = k.builtin(b);
        let idx = k.add(base, j as u32);
        k.store(out, idx, v);
    }
    // Every unit adds 1 to its own slot (plain load/store: one writer per slot).
    let h = k.load(hits, abs);
    let h = k.add(h, 1u32);
    k.store(hits, abs, h);
    let def = build(k);
    let ho = zeros::<R, u32>(&client, (units * nb) as usize);
    let hh = zeros::<R, u32>(&client, units as usize + 1);
    launch(
        &client,
        &def,
        COUNT,
        KernelArguments::new()
            .buffer(ho.clone().binding())
            .buffer(hh.clone().binding()),
    );
    let mut expected = vec![0u32; (units * nb) as usize];
    let cube_size: u32 = DIM.iter().product();
    let cube_count: u32 = COUNT.iter().product();
    for cz in 0..COUNT[2] {
        for cy in 0..COUNT[1] {
            for cx in 0..COUNT[0] {
                for uz in 0..DIM[2] {
                    for uy in 0..DIM[1] {
                        for ux in 0..DIM[0] {
                            let unit = ux + uy * DIM[0] + uz * DIM[0] * DIM[1];
                            let cube = cx + cy * COUNT[0] + cz * COUNT[0] * COUNT[1];
                            let abs = cube * cube_size + unit;
                            let row = [
                                abs,
                                cx * DIM[0] + ux,
                                cy * DIM[1] + uy,
                                cz * DIM[2] + uz,
                                unit,
                                ux,
                                uy,
                                uz,
                                cube,
                                cx,
                                cy,
                                cz,
                                cube_size,
                                DIM[0],
                                DIM[1],
                                DIM[2],
                                cube_count,
                                COUNT[0],
                                COUNT[1],
                                COUNT[2],
                            ];
                            let at = (abs * nb) as usize;
                            expected[at..at + nb as usize].copy_from_slice(&row);
                        }
                    }
                }
            }
        }
    }
    let got = download::<R, u32>(&client, &ho);
    let mut bad = Vec::new();
    for (slot, (g, e)) in got
        .chunks(nb as usize)
        .zip(expected.chunks(nb as usize))
        .enumerate()
    {
        for (j, b) in BUILTINS.iter().enumerate() {
            if g[j] != e[j] {
                bad.push(format!(
                    "unit {slot}: {} = {}, expected {}",
                    b.name(),
                    g[j],
                    e[j]
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} wrong builtins, first: {}",
        bad.len(),
        bad.iter().take(10).cloned().collect::<Vec<_>>().join("; ")
    );
    let mut eh = vec![1u32; units as usize];
    eh.push(0);
    assert_same(
        &download::<R, u32>(&client, &hh),
        &eh,
        "every absolute position exactly once",
    );
}

/// `plane_size` and `unit_pos_plane` in a 3-D cube: the plane size is uniform, within the
/// device's limits, and `unit_pos_plane == unit_pos % plane_size`. Gated on plane operations.
pub fn ir_builtins_plane_3d<R: Runtime>(client: ComputeClient<R>) {
    let dim = [8u32, 4, 2];
    let units: u32 = dim.iter().product::<u32>() * 2;
    let mut k = KernelBuilder::new("ir_builtins_plane_3d", dim);
    let out = k.output("out", ElemType::U32, 1);
    let abs = k.absolute_pos();
    let base = k.mul(abs, 3u32);
    let ps = k.plane_size();
    let pu = k.unit_pos_plane();
    let u = k.unit_pos();
    k.store(out, base, ps);
    let idx = k.add(base, 1u32);
    k.store(out, idx, pu);
    let idx = k.add(base, 2u32);
    k.store(out, idx, u);
    let def = build(k);
    let h = zeros::<R, u32>(&client, units as usize * 3);
    launch(
        &client,
        &def,
        [1, 2, 1],
        KernelArguments::new().buffer(h.clone().binding()),
    );
    if !feature_gate(&client, client.features().plane_ops, "plane operations") {
        return;
    }
    let got = download::<R, u32>(&client, &h);
    let ps = got[0];
    let hw = &client.properties().hardware;
    assert!(
        (hw.plane_size_min..=hw.plane_size_max).contains(&ps),
        "plane_size {ps} outside [{}, {}]",
        hw.plane_size_min,
        hw.plane_size_max
    );
    let cube: u32 = dim.iter().product();
    let expected: Vec<u32> = (0..units)
        .flat_map(|a| {
            let u = a % cube;
            [ps, u % ps, u]
        })
        .collect();
    assert_same(
        &got,
        &expected,
        "per unit [plane_size, unit_pos_plane, unit_pos]",
    );
}
