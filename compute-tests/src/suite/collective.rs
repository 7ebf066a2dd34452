//! Collectives between the devices of one runtime.

use compute_core::{ComputeClient, DeviceId, ElemType, ReduceOperation, Runtime};

use crate::kernels;
use crate::util::{client_of, devices_or_single_device_check, f32_bytes, ramp};

/// `all_reduce` Sum and Mean over f32 and i32 on a subset of the devices.
pub fn all_reduce_sum_and_mean<R: Runtime>(client: ComputeClient<R>) {
    let Some(ids) = devices_or_single_device_check(&client, 3, "all_reduce_sum_and_mean") else {
        return;
    };
    let mut clients: Vec<ComputeClient<R>> = ids.iter().map(|&d| client_of::<R>(d)).collect();
    for c in &mut clients {
        c.ensure_init_collective(ids.clone());
    }
    let n = 1000;
    let mut outputs = Vec::new();
    for (rank, c) in clients.iter_mut().enumerate() {
        let src = c.create(f32_bytes(&ramp(n, rank as f32 + 1.0)));
        let sum = c.empty(n * 4);
        let mean = c.empty(n * 4);
        c.all_reduce(
            src.clone(),
            sum.clone(),
            ElemType::F32,
            ids.clone(),
            ReduceOperation::Sum,
        );
        c.all_reduce(
            src,
            mean.clone(),
            ElemType::F32,
            ids.clone(),
            ReduceOperation::Mean,
        );
        let isrc = c.create(compute_core::Bytes::from_elems(vec![
            rank as i32 * 3 - 1;
            5
        ]));
        let isum = c.empty(20);
        c.all_reduce(
            isrc,
            isum.clone(),
            ElemType::I32,
            ids.clone(),
            ReduceOperation::Sum,
        );
        outputs.push((sum, mean, isum));
    }
    for (c, (sum, mean, isum)) in clients.iter().zip(outputs) {
        c.sync_collective();
        let sum = c.read_one(sum).unwrap().to_elems::<f32>();
        let mean = c.read_one(mean).unwrap().to_elems::<f32>();
        for i in 0..n {
            assert_eq!(sum[i], i as f32 * 6.0);
            assert_eq!(mean[i], i as f32 * 2.0);
        }
        assert_eq!(c.read_one(isum).unwrap().to_elems::<i32>(), vec![6; 5]);
        c.flush().unwrap();
    }
}

/// A collective is ordered after the compute that produced its input, and before later reads.
pub fn all_reduce_orders_with_compute<R: Runtime>(client: ComputeClient<R>) {
    let Some(ids) = devices_or_single_device_check(&client, 2, "all_reduce_orders_with_compute")
    else {
        return;
    };
    let mut clients: Vec<ComputeClient<R>> = ids.iter().map(|&d| client_of::<R>(d)).collect();
    let n = 4096;
    let mut outs = Vec::new();
    for c in &mut clients {
        c.ensure_init_collective(ids.clone());
        let input = c.create(f32_bytes(&vec![1.0; n]));
        let produced = c.empty(n * 4);
        kernels::launch_slow_add(c, &input, &produced, n, 500);
        let reduced = c.empty(n * 4);
        c.all_reduce(
            produced,
            reduced.clone(),
            ElemType::F32,
            ids.clone(),
            ReduceOperation::Sum,
        );
        outs.push(reduced);
    }
    for (c, out) in clients.iter().zip(outs) {
        let got = c.read_one(out).unwrap().to_elems::<f32>();
        assert!(got.iter().all(|&v| v == 1002.0), "{:?}", &got[..4]);
    }
}

/// A collective over a group that does not contain the device, or before init, is an error.
pub fn collective_errors<R: Runtime>(mut client: ComputeClient<R>) {
    let Some(ids) = devices_or_single_device_check(&client, 2, "collective_errors") else {
        return;
    };
    let others: Vec<DeviceId> = ids
        .iter()
        .copied()
        .filter(|&d| d != client.device_id())
        .collect();
    let a = client.empty(4);
    let b = client.empty(4);
    client.all_reduce(
        a.clone(),
        b.clone(),
        ElemType::F32,
        others,
        ReduceOperation::Sum,
    );
    assert!(client.flush().is_err());
    let never_initialised = vec![
        client.device_id(),
        DeviceId::new(client.device_id().type_id, 999),
    ];
    client.all_reduce(a, b, ElemType::F32, never_initialised, ReduceOperation::Sum);
    assert!(client.flush().is_err());
}
