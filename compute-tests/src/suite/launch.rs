//! Launches: results, vector widths, bounds checks, zero counts, argument errors, flush and sync.

use compute_core::{ComputeClient, CubeCount, KernelArguments, Runtime, ServerError, block_on};

use crate::kernels;
use crate::util::{f32_bytes, ramp, sync};

/// An elementwise kernel computes the right values, at vector widths 1 and 4.
pub fn elementwise_add<R: Runtime>(client: ComputeClient<R>) {
    let n = 1000;
    let a = ramp(n, 0.5);
    let b = ramp(n, -3.0);
    for width in [1u8, 4] {
        let ha = client.create(f32_bytes(&a));
        let hb = client.create(f32_bytes(&b));
        let out = client.empty(n * 4);
        kernels::launch_binary(&client, &kernels::add_f32(width), &ha, &hb, &out, n, width);
        let got = client.read_one(out).unwrap().to_elems::<f32>();
        let expected: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(got, expected, "width {width}");
    }
}

/// `launch` drops out-of-range stores: an oversized launch leaves a neighbour untouched.
/// `launch_unchecked` of an exactly sized launch computes the same values.
pub fn bounds_checked_and_unchecked<R: Runtime>(client: ComputeClient<R>) {
    let n = 100;
    let layouts = client.create_tensors(vec![
        (
            compute_core::MemoryLayoutDescriptor::contiguous([n], 4),
            f32_bytes(&vec![0.0; n]),
        ),
        (
            compute_core::MemoryLayoutDescriptor::contiguous([n], 4),
            f32_bytes(&vec![-1.0; n]),
        ),
    ]);
    let (out, neighbour) = (layouts[0].memory.clone(), layouts[1].memory.clone());
    let kernel = kernels::fill_f32();
    client.launch(
        kernel.clone().into(),
        CubeCount::Static(16, 1, 1),
        KernelArguments::new()
            .buffer(out.clone().binding())
            .scalar(5.0f32),
    );
    let got = client.read(vec![out.clone(), neighbour.clone()]);
    assert!(got[0].to_elems::<f32>().iter().all(|&v| v == 5.0));
    assert!(
        got[1].to_elems::<f32>().iter().all(|&v| v == -1.0),
        "stores past the end landed"
    );
    let exact = (n as u32).div_ceil(kernels::CUBE_DIM);
    // The unchecked launch covers its buffer exactly: a multiple of the cube size.
    let m = exact as usize * kernels::CUBE_DIM as usize;
    let big = client.create(f32_bytes(&vec![0.0; m]));
    // SAFETY: `big` holds exactly `exact * CUBE_DIM` elements, one per unit of the launch.
    unsafe {
        client.launch_unchecked(
            kernel.into(),
            CubeCount::Static(exact, 1, 1),
            KernelArguments::new()
                .buffer(big.clone().binding())
                .scalar(7.0f32),
        )
    };
    assert!(
        client
            .read_one(big)
            .unwrap()
            .to_elems::<f32>()
            .iter()
            .all(|&v| v == 7.0)
    );
}

/// `launch` makes out-of-range global loads read 0, never a neighbour's bytes: an input that is
/// a range in the middle of one storage block (its neighbours hold -1 and -2), read at indices
/// running 32 past its end, scalar and at vector width 4.
pub fn out_of_range_global_loads_read_zero<R: Runtime>(client: ComputeClient<R>) {
    use super::ir_util::{build, download, launch};
    use compute_core::kernel::KernelBuilder;
    use compute_core::{ElemType, MemoryLayoutDescriptor};
    let n = 48usize;
    let data: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
    let layouts = client.create_tensors(vec![
        (
            MemoryLayoutDescriptor::contiguous([64], 4),
            f32_bytes(&[-1.0; 64]),
        ),
        (MemoryLayoutDescriptor::contiguous([n], 4), f32_bytes(&data)),
        (
            MemoryLayoutDescriptor::contiguous([64], 4),
            f32_bytes(&[-2.0; 64]),
        ),
    ]);
    let input = layouts[1].memory.clone();
    for width in [1u8, 4] {
        let units = 64u32;
        let mut k = KernelBuilder::new("oob_global_load", [units, 1, 1]);
        let x = k.input("x", ElemType::F32, width);
        let out = k.output("out", ElemType::F32, width);
        let i = k.absolute_pos();
        let j = k.add(i, 8u32);
        let v = k.load(x, j);
        k.store(out, i, v);
        let def = build(k);
        let w = width as usize;
        let out_h = client.create(f32_bytes(&vec![7.0; units as usize * w]));
        launch(
            &client,
            &def,
            [1, 1, 1],
            KernelArguments::new()
                .buffer(input.clone().binding())
                .buffer(out_h.clone().binding()),
        );
        let got = download::<R, f32>(&client, &out_h);
        let items = n / w;
        let data = &data;
        let want: Vec<f32> = (0..units as usize)
            .flat_map(|u| {
                let src = u + 8;
                (0..w).map(move |l| if src < items { data[src * w + l] } else { 0.0 })
            })
            .collect();
        assert_eq!(got, want, "width {width}: loads past the end read 0");
    }
    let neighbours = client.read(vec![layouts[0].memory.clone(), layouts[2].memory.clone()]);
    assert!(neighbours[0].to_elems::<f32>().iter().all(|&v| v == -1.0));
    assert!(neighbours[1].to_elems::<f32>().iter().all(|&v| v == -2.0));
}

/// A launch with zero cubes runs nothing and is still ordered.
pub fn zero_count_launch<R: Runtime>(client: ComputeClient<R>) {
    let out = client.create(f32_bytes(&[1.0, 2.0]));
    client.launch(
        kernels::fill_f32().into(),
        CubeCount::Static(0, 1, 1),
        KernelArguments::new()
            .buffer(out.clone().binding())
            .scalar(9.0f32),
    );
    sync(&client);
    assert_eq!(
        client.read_one(out).unwrap().to_elems::<f32>(),
        vec![1.0, 2.0]
    );
}

/// A launch whose cube count is read from a device buffer.
pub fn dynamic_cube_count<R: Runtime>(client: ComputeClient<R>) {
    let n = kernels::CUBE_DIM as usize * 3;
    let out = client.create(f32_bytes(&vec![0.0; n]));
    let count = client.create(compute_core::Bytes::from_elems(vec![2u32, 1, 1]));
    client.launch(
        kernels::fill_f32().into(),
        CubeCount::Dynamic(count.binding()),
        KernelArguments::new()
            .buffer(out.clone().binding())
            .scalar(3.0f32),
    );
    let got = client.read_one(out).unwrap().to_elems::<f32>();
    let covered = kernels::CUBE_DIM as usize * 2;
    assert!(got[..covered].iter().all(|&v| v == 3.0));
    assert!(got[covered..].iter().all(|&v| v == 0.0));
}

/// Wrong arguments are errors returned by the next flush (launch) or sync, never a crash.
pub fn launch_argument_errors_are_reported<R: Runtime>(client: ComputeClient<R>) {
    let out = client.empty(16);
    client.launch(
        kernels::fill_f32().into(),
        CubeCount::Static(1, 1, 1),
        KernelArguments::new().buffer(out.clone().binding()),
    );
    let err = client.flush().unwrap_err();
    assert!(
        matches!(
            err,
            ServerError::Launch(compute_core::error::LaunchError::ArgumentCount {
                what: "scalars",
                expected: 1,
                found: 0,
                ..
            })
        ),
        "missing scalar: {err:?}"
    );
    client.launch(
        kernels::fill_f32().into(),
        CubeCount::Static(1, 1, 1),
        KernelArguments::new()
            .buffer(out.clone().binding())
            .scalar(1u32),
    );
    let err = block_on(client.sync()).unwrap_err();
    assert!(
        matches!(
            err,
            ServerError::Launch(compute_core::error::LaunchError::ScalarType {
                expected: compute_core::ElemType::F32,
                found: compute_core::ElemType::U32,
                ..
            })
        ),
        "wrong scalar type: {err:?}"
    );
    client.flush().unwrap();
    sync(&client);
}
