//! Collectives between the devices of one runtime.

use compute_core::{ComputeClient, DeviceId, ElemType, ReduceOperation, Runtime};

use crate::kernels;
use crate::util::{client_of, devices_or_single_device_check, f32_bytes, ramp};

/// Collective tests share the devices' servers, whose round numbers and collective errors are
/// per server and group: two of them running at once (the test harness runs tests in parallel)
/// would mix their rounds. Each holds this lock for its duration.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// `all_reduce` Sum and Mean over f32 and i32 on a subset of the devices.
pub fn all_reduce_sum_and_mean<R: Runtime>(client: ComputeClient<R>) {
    let _serial = serial();
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
    let _serial = serial();
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
    let _serial = serial();
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
    use compute_core::ServerError;
    use compute_core::collective::CollectiveError;
    let me = client.device_id();
    client.all_reduce(
        a.clone(),
        b.clone(),
        ElemType::F32,
        others,
        ReduceOperation::Sum,
    );
    let err = client.flush().unwrap_err();
    assert!(
        matches!(&err, ServerError::Collective(CollectiveError::NotInGroup { device, .. }) if *device == me),
        "{err:?}"
    );
    let missing = DeviceId::new(me.type_id, 999);
    client.all_reduce(
        a.clone(),
        b.clone(),
        ElemType::F32,
        vec![me, missing],
        ReduceOperation::Sum,
    );
    let err = client.flush().unwrap_err();
    assert!(
        matches!(&err, ServerError::Collective(CollectiveError::UnknownDevice { device, .. }) if *device == missing),
        "{err:?}"
    );
    // A group that passes the checks above but was never initialised (a device and itself
    // twice is the one-device group, which no test initialises).
    client.all_reduce(a, b, ElemType::F32, vec![me, me], ReduceOperation::Sum);
    let err = client.flush().unwrap_err();
    assert!(
        matches!(&err, ServerError::Collective(CollectiveError::NotInitialised { group }) if *group == vec![me]),
        "{err:?}"
    );
}

/// Participants that disagree on the element type or the operation (or the size) all get
/// `ServerError::Collective(CollectiveError::Mismatch)` with the kind of the disagreement; the
/// output and a buffer made before read back unchanged, and the group still reduces afterwards.
pub fn all_reduce_mismatch_fails_every_participant<R: Runtime>(client: ComputeClient<R>) {
    let _serial = serial();
    use compute_core::ServerError;
    use compute_core::collective::{CollectiveError, MismatchKind};

    let Some(ids) =
        devices_or_single_device_check(&client, 2, "all_reduce_mismatch_fails_every_participant")
    else {
        return;
    };
    let mut clients: Vec<ComputeClient<R>> = ids.iter().map(|&d| client_of::<R>(d)).collect();
    for c in &mut clients {
        c.ensure_init_collective(ids.clone());
    }
    // The collective libraries' checked mode (NCCL) is what makes a disagreement an error
    // there; the host-staged backends always check. Each device is driven by its own thread, as
    // the checked mode's header exchange needs.
    let was_checked = compute_core::collective::checked();
    compute_core::collective::set_checked(true);
    let cases = [
        (
            [
                (ElemType::F32, ReduceOperation::Sum),
                (ElemType::I32, ReduceOperation::Max),
            ],
            [16, 16],
            MismatchKind::DType,
        ),
        (
            [
                (ElemType::F32, ReduceOperation::Sum),
                (ElemType::F32, ReduceOperation::Max),
            ],
            [16, 16],
            MismatchKind::Operation,
        ),
        (
            [
                (ElemType::I32, ReduceOperation::Min),
                (ElemType::I32, ReduceOperation::Min),
            ],
            [16, 8],
            MismatchKind::Size,
        ),
    ];
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        std::thread::scope(|scope| {
            let threads: Vec<_> = clients
                .iter_mut()
                .enumerate()
                .map(|(i, c)| {
                    let ids = ids.clone();
                    scope.spawn(move || {
                        let before = c.create(f32_bytes(&[1.5, -2.5, 3.5, 4.5]));
                        for (setup, lens, kind) in cases {
                            let (dtype, op) = setup[i];
                            let src = c.create(compute_core::Bytes::from_elems(vec![7u8; lens[i]]));
                            let dst = c.create(compute_core::Bytes::from_elems(vec![9u8; lens[i]]));
                            c.all_reduce(src, dst.clone(), dtype, ids.clone(), op);
                            c.sync_collective();
                            let err = c.flush().expect_err("a mismatched all_reduce succeeded");
                            assert!(
                                matches!(
                                    &err,
                                    ServerError::Collective(CollectiveError::Mismatch { kind: k, .. })
                                        if *k == kind
                                ),
                                "{} device {i}, {kind} case: {err:?}",
                                R::name()
                            );
                            c.flush().expect("the error is reported once");
                            assert_eq!(
                                c.read_one(dst).unwrap().to_vec(),
                                vec![9u8; lens[i]],
                                "the output of a rejected round was written"
                            );
                        }
                        // The group still reduces, and the buffer made before is intact.
                        let src = c.create(compute_core::Bytes::from_elems(vec![i as i32 + 1; 3]));
                        let dst = c.empty(12);
                        c.all_reduce(src, dst.clone(), ElemType::I32, ids, ReduceOperation::Max);
                        c.sync_collective();
                        c.flush().expect("an agreeing all_reduce after the mismatches");
                        assert_eq!(c.read_one(dst).unwrap().to_elems::<i32>(), vec![2; 3]);
                        assert_eq!(
                            c.read_one(before).unwrap().to_elems::<f32>(),
                            vec![1.5, -2.5, 3.5, 4.5]
                        );
                    })
                })
                .collect();
            for t in threads {
                if let Err(panic) = t.join() {
                    std::panic::resume_unwind(panic);
                }
            }
        })
    }));
    compute_core::collective::set_checked(was_checked);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
/// Two groups issued in different orders on different devices: device 0 issues group A then
/// group B, device 1 issues B then A, device 2 is in B only. With one collective worker per
/// device this deadlocks (each worker's first round waits for a device whose worker is busy with
/// the other group); every backend must run each group on its own.
pub fn two_groups_issued_in_different_orders<R: Runtime>(client: ComputeClient<R>) {
    let _serial = serial();
    let Some(ids) =
        devices_or_single_device_check(&client, 3, "two_groups_issued_in_different_orders")
    else {
        return;
    };
    let a: Vec<DeviceId> = ids[..2].to_vec();
    let b: Vec<DeviceId> = ids.clone();
    let mut clients: Vec<ComputeClient<R>> = ids.iter().map(|&d| client_of::<R>(d)).collect();
    for (i, c) in clients.iter_mut().enumerate() {
        if i < 2 {
            c.ensure_init_collective(a.clone());
        }
        c.ensure_init_collective(b.clone());
    }
    let n = 256;
    let mut outputs = Vec::new();
    for (rank, c) in clients.iter_mut().enumerate() {
        // One source per group: two reads of one buffer from two collective streams are
        // ordered one after the other by the access log, which would chain the groups.
        let src_a = c.create(f32_bytes(&ramp(n, rank as f32 + 1.0)));
        let src_b = c.create(f32_bytes(&ramp(n, rank as f32 + 1.0)));
        let in_a = c.empty(n * 4);
        let in_b = c.empty(n * 4);
        let reduce_a = |c: &mut ComputeClient<R>| {
            c.all_reduce(
                src_a.clone(),
                in_a.clone(),
                ElemType::F32,
                a.clone(),
                ReduceOperation::Sum,
            )
        };
        let reduce_b = |c: &mut ComputeClient<R>| {
            c.all_reduce(
                src_b.clone(),
                in_b.clone(),
                ElemType::F32,
                b.clone(),
                ReduceOperation::Sum,
            )
        };
        match rank {
            0 => {
                reduce_a(c);
                reduce_b(c);
            }
            1 => {
                reduce_b(c);
                reduce_a(c);
            }
            _ => reduce_b(c),
        }
        outputs.push((in_a, in_b));
    }
    for (rank, (c, (in_a, in_b))) in clients.iter().zip(outputs).enumerate() {
        c.sync_collective();
        c.flush().unwrap();
        let got_b = c.read_one(in_b).unwrap().to_elems::<f32>();
        for (i, v) in got_b.iter().enumerate() {
            assert_eq!(*v, i as f32 * 6.0, "group B on device {rank}");
        }
        if rank < 2 {
            let got_a = c.read_one(in_a).unwrap().to_elems::<f32>();
            for (i, v) in got_a.iter().enumerate() {
                assert_eq!(*v, i as f32 * 3.0, "group A on device {rank}");
            }
        }
    }
}

/// An all-reduce into a sub-range of a buffer changes exactly the sub-range's bytes: 1- and
/// 2-byte element types with odd counts, at offsets and ends inside a 4-byte word (a backend
/// whose copies work in whole words must merge the edge words, not zero-fill them); every other
/// byte of the buffer reads back as before.
pub fn all_reduce_into_a_sub_range_changes_exactly_its_bytes<R: Runtime>(client: ComputeClient<R>) {
    let _serial = serial();
    let Some(ids) = devices_or_single_device_check(
        &client,
        2,
        "all_reduce_into_a_sub_range_changes_exactly_its_bytes",
    ) else {
        return;
    };
    let mut clients: Vec<ComputeClient<R>> = ids.iter().map(|&d| client_of::<R>(d)).collect();
    for c in &mut clients {
        c.ensure_init_collective(ids.clone());
    }
    // (element type, byte offset of the output in its 16-byte buffer, element count)
    let cases = [
        (ElemType::U8, 4u64, 3usize),
        (ElemType::U8, 5, 3),
        (ElemType::U8, 1, 2),
        (ElemType::U8, 3, 9),
        (ElemType::F16, 2, 3),
        (ElemType::F16, 6, 3),
    ];
    for (dtype, offset, count) in cases {
        let len = count * dtype.size();
        // Device r contributes element values r + 1 + i: the sum is 3 + 2i on two devices.
        let contribution = |rank: usize| -> Vec<u8> {
            (0..count)
                .flat_map(|i| match dtype {
                    ElemType::F16 => half::f16::from_f32((rank + 1 + i) as f32)
                        .to_le_bytes()
                        .to_vec(),
                    _ => vec![(rank + 1 + i) as u8],
                })
                .collect()
        };
        let mut outputs = Vec::new();
        for (rank, c) in clients.iter_mut().enumerate() {
            let buffer = c.create(compute_core::Bytes::from_elems(vec![0xEEu8; 16]));
            let dst = buffer.clone().range(offset, len as u64).unwrap();
            let src = c.create(compute_core::Bytes::from_elems(contribution(rank)));
            c.all_reduce(src, dst, dtype, ids.clone(), ReduceOperation::Sum);
            outputs.push(buffer);
        }
        let mut want = vec![0xEEu8; 16];
        let sum: Vec<u8> = (0..count)
            .flat_map(|i| match dtype {
                ElemType::F16 => half::f16::from_f32((3 + 2 * i) as f32)
                    .to_le_bytes()
                    .to_vec(),
                _ => vec![(3 + 2 * i) as u8],
            })
            .collect();
        want[offset as usize..offset as usize + len].copy_from_slice(&sum);
        for (rank, (c, buffer)) in clients.iter().zip(outputs).enumerate() {
            c.sync_collective();
            c.flush().unwrap();
            let got = c.read_one(buffer).unwrap().to_vec();
            assert_eq!(
                got, want,
                "{dtype} x{count} at byte {offset} on device {rank}: only the output's bytes change"
            );
        }
    }
}
