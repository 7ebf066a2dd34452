//! Tests that need a GPU: a one-rank NCCL all-reduce, and the generated code checked against the
//! CPU backend (the reference executor of the IR). Without a driver they report a skip
//! (`compute_core::env::report_reduced`) and return.

use compute_core::kernel::{BinaryOp, CmpOp, KernelBuilder, KernelDefinition, UnaryOp};
use compute_core::{
    Bytes, ComputeClient, CubeCount, Device, ElemType, KernelArguments, ReduceOperation, Runtime,
};
use compute_cpu::{CpuDevice, CpuRuntime};
use compute_cuda::{CudaDevice, CudaRuntime};

/// The tests of this file one at a time: an injected release failure
/// ([`compute_cuda::inject_release_failures`]) fails the next free of the process, and the
/// release-error queue answers the next report of any server, so a test beside another could
/// take (or cause) the other's error.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn cuda() -> Option<ComputeClient<CudaRuntime>> {
    match CudaRuntime::availability() {
        Ok(()) => Some(ComputeClient::load(&CudaDevice::default())),
        Err(reason) => {
            compute_core::env::report_reduced(&format!("CUDA unavailable ({reason})"));
            None
        }
    }
}

#[test]
fn one_rank_all_reduce() {
    let _serial = serial();
    let Some(mut client) = cuda() else { return };
    let me = vec![CudaDevice::default().to_id()];
    client.ensure_init_collective(me.clone());
    client.flush().expect("init");
    let src = client.create(Bytes::from_elems(
        (0..1000).map(|i| i as f32).collect::<Vec<_>>(),
    ));
    let sum = client.empty(4000);
    let mean = client.empty(4000);
    client.all_reduce(
        src.clone(),
        sum.clone(),
        ElemType::F32,
        me.clone(),
        ReduceOperation::Sum,
    );
    client.all_reduce(
        src,
        mean.clone(),
        ElemType::F32,
        me.clone(),
        ReduceOperation::Mean,
    );
    let isrc = client.create(Bytes::from_elems(vec![-7i32; 5]));
    let isum = client.empty(20);
    client.all_reduce(isrc, isum.clone(), ElemType::I32, me, ReduceOperation::Sum);
    client.sync_collective();
    let expect: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    assert_eq!(client.read_one(sum).unwrap().to_elems::<f32>(), expect);
    assert_eq!(client.read_one(mean).unwrap().to_elems::<f32>(), expect);
    assert_eq!(
        client.read_one(isum).unwrap().to_elems::<i32>(),
        vec![-7; 5]
    );
    client.flush().unwrap();
}

const N: usize = 512;

/// `out[i * ops + j] = op_j(a[i], b[i])` over integer binary ops and comparisons.
fn int_ops(elem: ElemType) -> (KernelDefinition, usize) {
    use BinaryOp::*;
    let ops = [
        Add, Sub, Mul, Div, Rem, Min, Max, BitAnd, BitOr, BitXor, Shl, Shr,
    ];
    let mut k = KernelBuilder::new("int_ops", [64, 1, 1]);
    let a = k.input("a", elem, 1);
    let b = k.input("b", elem, 1);
    let out = k.output("out", elem, 1);
    let i = k.absolute_pos();
    let x = k.load(a, i);
    let y = k.load(b, i);
    let width = ops.len() + 2;
    let base = k.binary(Mul, i, width as u32);
    for (j, op) in ops.iter().enumerate() {
        let r = k.binary(*op, x, y);
        let at = k.binary(Add, base, j as u32);
        k.store(out, at, r);
    }
    let neg = k.unary(
        if elem.is_signed_int() {
            UnaryOp::Neg
        } else {
            UnaryOp::BitNot
        },
        x,
    );
    let at = k.binary(Add, base, ops.len() as u32);
    k.store(out, at, neg);
    let lt = k.compare(CmpOp::Lt, x, y);
    let sel = k.select(lt, x, y);
    let at = k.binary(Add, base, ops.len() as u32 + 1);
    k.store(out, at, sel);
    (k.build().expect("int ops"), width)
}

/// Float unary ops, casts to integers (saturating) and a range loop with a negative step.
fn float_ops() -> (KernelDefinition, usize) {
    use UnaryOp::*;
    // Erf is left out: the CPU reference hangs on it (reported to the lead).
    let ops = [
        Neg, Abs, Sqrt, Exp, Log, Sin, Cos, Tanh, Floor, Ceil, Round, Recip, Log1p,
    ];
    let mut k = KernelBuilder::new("float_ops", [64, 1, 1]);
    let a = k.input("a", ElemType::F32, 1);
    let out = k.output("out", ElemType::F32, 1);
    let ints = k.output("ints", ElemType::I32, 1);
    let i = k.absolute_pos();
    let x = k.load(a, i);
    let width = ops.len();
    let base = k.binary(BinaryOp::Mul, i, width as u32);
    for (j, op) in ops.iter().enumerate() {
        let r = k.unary(*op, x);
        let at = k.binary(BinaryOp::Add, base, j as u32);
        k.store(out, at, r);
    }
    let ibase = k.binary(BinaryOp::Mul, i, 3u32);
    let c8 = k.cast(x, ElemType::I8);
    let c8 = k.cast(c8, ElemType::I32);
    k.store(ints, ibase, c8);
    let cu = k.cast(x, ElemType::U32);
    let cu = k.bitcast(cu, ElemType::I32);
    let at = k.binary(BinaryOp::Add, ibase, 1u32);
    k.store(ints, at, cu);
    let acc = k.var(0i32);
    k.range(10i32, -5i32, -3i32, |k, j| {
        let v = k.get(acc);
        let v = k.binary(BinaryOp::Add, v, j);
        k.assign(acc, v);
    });
    let v = k.get(acc);
    let at = k.binary(BinaryOp::Add, ibase, 2u32);
    k.store(ints, at, v);
    (k.build().expect("float ops"), width)
}

fn run<R: Runtime>(def: &KernelDefinition, inputs: &[Bytes], outputs: &[usize]) -> Vec<Vec<u8>>
where
    <R::Server as compute_core::ComputeServer>::Kernel: From<KernelDefinition>,
{
    let client = ComputeClient::<R>::load(&R::Device::default());
    let mut args = KernelArguments::new();
    for b in inputs {
        args = args.buffer(client.create(Bytes::from_slice(b)).binding());
    }
    let outs: Vec<_> = outputs
        .iter()
        .map(|&n| client.create(Bytes::zeroed(n)))
        .collect();
    for o in &outs {
        args = args.buffer(o.clone().binding());
    }
    client.launch(def.clone().into(), CubeCount::cover(N, 64), args);
    outs.into_iter()
        .map(|o| client.read_one(o).unwrap().to_vec())
        .collect()
}

#[test]
fn integer_semantics_match_the_cpu() {
    let _serial = serial();
    if cuda().is_none() {
        return;
    }
    let a: Vec<i32> = (0..N as i32)
        .map(|i| (i * 7919) % 2001 - 1000)
        .chain([i32::MIN])
        .take(N)
        .collect();
    let mut b: Vec<i32> = (0..N as i32).map(|i| (i * 31) % 67 - 33).collect();
    b[N - 1] = -1;
    b[3] = 0;
    for elem in [ElemType::I32, ElemType::U32] {
        let (def, width) = int_ops(elem);
        let inputs = [Bytes::from_elem_slice(&a), Bytes::from_elem_slice(&b)];
        let cpu = run::<CpuRuntime>(&def, &inputs, &[N * width * 4]);
        let gpu = run::<CudaRuntime>(&def, &inputs, &[N * width * 4]);
        assert_eq!(cpu, gpu, "{elem}");
    }
    let _ = CpuDevice::default();
}

#[test]
fn float_semantics_match_the_cpu() {
    let _serial = serial();
    if cuda().is_none() {
        return;
    }
    let a: Vec<f32> = (0..N)
        .map(|i| (i as f32 - 256.0) * 0.37)
        .chain([f32::NAN, 1e10, -1e10, 2.5, -2.5])
        .skip(5)
        .collect();
    let (def, width) = float_ops();
    let inputs = [Bytes::from_elem_slice(&a)];
    let cpu = run::<CpuRuntime>(&def, &inputs, &[N * width * 4, N * 3 * 4]);
    let gpu = run::<CudaRuntime>(&def, &inputs, &[N * width * 4, N * 3 * 4]);
    assert_eq!(cpu[1], gpu[1], "casts and range loop");
    let c: Vec<f32> = bytemuck::pod_collect_to_vec(&cpu[0]);
    let g: Vec<f32> = bytemuck::pod_collect_to_vec(&gpu[0]);
    for (i, (x, y)) in c.iter().zip(&g).enumerate() {
        let close =
            (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-5 * x.abs().max(1.0);
        assert!(
            close,
            "op {} of input {}: cpu {x} gpu {y}",
            i % width,
            a[i / width]
        );
    }
}

/// A driver error raised by a free (in the pools, with no caller to return it to) is returned by
/// the next report, once; the call after that is clean. The driver cannot be made to fail a
/// free, so the failure is injected after the real `cuMemFree`.
#[test]
fn a_failed_free_reaches_the_next_report() {
    let _serial = serial();
    let Some(mut client) = cuda() else { return };
    // SAFETY: a fresh stream, used by this test's thread only.
    unsafe { client.set_stream(compute_core::StreamId::fresh()) };
    let h = client.empty(1 << 20);
    compute_core::block_on(client.sync()).expect("sync");
    drop(h);
    compute_core::block_on(client.sync()).expect("sync");
    compute_cuda::inject_release_failures("cuMemFree", 1);
    client.memory_cleanup();
    let err = client
        .flush()
        .expect_err("the failed free is reported by the next flush");
    assert!(
        matches!(&err, compute_core::ServerError::Driver(m) if m.contains("cuMemFree") && m.contains("CUDA_ERROR_INVALID_VALUE")),
        "{err:?}"
    );
    client.flush().expect("reported once");
    let again = client.create(Bytes::from_elems(vec![1.0f32, 2.0]));
    assert_eq!(
        client.read_one(again).unwrap().to_elems::<f32>(),
        vec![1.0, 2.0]
    );
}

/// `staging` really hands out page-locked memory: the driver knows the staged bytes' pages
/// (`cuMemHostGetFlags` succeeds at the first and the last byte), while it refuses the same
/// query on an ordinary heap buffer.
#[test]
fn staging_returns_pinned_memory() {
    let _serial = serial();
    use cudarc::driver::{result, sys};
    let Some(client) = cuda() else { return };
    let host_flags = |ptr: *const u8| -> Result<u32, sys::CUresult> {
        let mut flags = 0u32;
        // SAFETY: `flags` is a valid out-pointer; the driver only inspects the address.
        let r = unsafe { sys::cuMemHostGetFlags(&mut flags, ptr.cast_mut().cast()) };
        if r == sys::CUresult::CUDA_SUCCESS {
            Ok(flags)
        } else {
            Err(r)
        }
    };
    // The query needs a current context on this thread: the device's primary one, which the
    // runtime uses too.
    let device = result::device::get(0).expect("cuDeviceGet");
    // SAFETY: `device` is a valid ordinal; the context is released at the end of the test.
    let ctx = unsafe { result::primary_ctx::retain(device) }.expect("retain");
    // SAFETY: `ctx` was just retained.
    unsafe { result::ctx::set_current(ctx) }.expect("cuCtxSetCurrent");
    for size in [4usize << 10, 1 << 20, 16 << 20] {
        let mut staged = Bytes::from_vec(vec![3u8; size]);
        client.staging([&mut staged].into_iter(), false);
        client.flush().expect("staging");
        assert_eq!(staged.kind(), compute_core::BytesKind::Pinned, "{size} B");
        assert!(
            staged.iter().all(|&b| b == 3),
            "the staged copy keeps its bytes"
        );
        for at in [0, size - 1] {
            // SAFETY: in bounds of `staged`.
            let ptr = unsafe { staged.as_ptr().add(at) };
            // The call succeeds only for page-locked memory the driver allocated or
            // registered; the flags it returns depend on the platform (device-mapped where
            // unified addressing is on), so only success is checked.
            host_flags(ptr).unwrap_or_else(|e| panic!("{size} B at {at}: {e:?}"));
        }
        let h = client.create(staged);
        assert!(client.read_one(h).unwrap().iter().all(|&b| b == 3));
    }
    let pageable = vec![1u8; 1 << 20];
    assert_eq!(
        host_flags(pageable.as_ptr()),
        Err(sys::CUresult::CUDA_ERROR_INVALID_VALUE),
        "an ordinary heap buffer is not page-locked"
    );
    // SAFETY: retained above, once.
    unsafe { result::primary_ctx::release(device) }.expect("release");
}

/// The on-disk module cache: a second process compiles nothing with NVRTC (every kernel comes
/// from the cache the first one filled), while the first process, on an empty cache directory,
/// compiled every kernel. Each side is a fresh process of this test binary.
#[test]
fn a_second_process_compiles_nothing() {
    let _serial = serial();
    const NAME: &str = "a_second_process_compiles_nothing";
    let Some(client) = cuda() else { return };
    if compute_core::env::is_child_test(NAME) {
        for c in 0..3u32 {
            let mut k = KernelBuilder::new(&format!("disk_cache_probe_{c}"), [64, 1, 1]);
            let out = k.output("out", ElemType::U32, 1);
            let i = k.absolute_pos();
            let v = k.add(i, 9_000_000 + c);
            k.store(out, i, v);
            let def = k.build().unwrap();
            let h = client.empty(64 * 4);
            client.launch(
                compute_cuda::CudaKernel::from(def),
                CubeCount::Static(1, 1, 1),
                KernelArguments::new().buffer(h.clone().binding()),
            );
            let got = client.read_one(h).unwrap().to_elems::<u32>();
            assert_eq!(got[63], 63 + 9_000_000 + c);
        }
        let n = compute_cuda::compile_counts();
        println!("compiles: nvrtc={} disk={}", n.nvrtc, n.disk_loads);
        return;
    }
    let dir = compute_core::env::scratch_dir("compute-cuda-cache-test");
    let run = || -> (u64, u64) {
        let n = compute_core::env::child_test_counts(
            NAME,
            &[("COMPUTE_CUDA_CACHE_DIR", dir.as_os_str())],
            "compiles: ",
        )
        .unwrap();
        (n["nvrtc"], n["disk"])
    };
    let first = run();
    let second = run();
    std::fs::remove_dir_all(&dir).ok();
    assert!(first.0 >= 3, "the first process compiled {first:?}");
    assert_eq!(
        second.0, 0,
        "the second process compiled with NVRTC: {second:?}"
    );
    assert_eq!(
        second.1, first.0,
        "every kernel came from the disk: {first:?} then {second:?}"
    );
}

/// `host_memory_usage` counts the server's pinned memory exactly: the small staging ring (8
/// slots of 128 KiB) once a small write used it, the buffer of a read until its future finished
/// (then the caller's, not counted, until it drops back into the pool as a free buffer), bytes
/// `staging` moved into pinned memory only once the caller dropped them; after a sync nothing
/// is in use, and a loop of large writes and reads reaches a plateau.
#[test]
fn host_memory_usage_counts_the_servers_pinned_memory() {
    let _serial = serial();
    if cuda().is_none() {
        return;
    }
    if std::env::var_os("COMPUTE_CUDA_STAGING").is_some() {
        compute_core::env::report_reduced("COMPUTE_CUDA_STAGING set: the figures differ");
        return;
    }
    let client = ComputeClient::<CudaRuntime>::isolated(&CudaDevice::default()).unwrap();
    let sync = || compute_core::block_on(client.sync()).expect("sync");
    let usage = || client.host_memory_usage();
    let figures = |u: compute_core::HostMemoryUsage| (u.bytes_reserved, u.bytes_in_use);
    assert_eq!(
        figures(usage()),
        (0, 0),
        "a fresh server holds no pinned memory"
    );
    let ring = 8 * (128 << 10);
    let small = client.create(Bytes::from_vec(vec![1u8; 4096]));
    sync();
    assert_eq!(
        figures(usage()),
        (ring, 0),
        "the small ring, idle after a sync"
    );
    let pending = client.read_async(vec![small.clone()]);
    let during = usage();
    assert_eq!(during.bytes_reserved, ring + 4096, "{during:?}");
    assert!(
        (4096..=ring + 4096).contains(&during.bytes_in_use),
        "the read's buffer is in use until its future finished: {during:?}"
    );
    let read = compute_core::block_on(pending).expect("read");
    assert_eq!(
        figures(usage()),
        (ring, 0),
        "what the read returned is the caller's"
    );
    drop(read);
    assert_eq!(figures(usage()), (ring + 4096, 0), "dropped: free, kept");
    let mut staged = Bytes::from_vec(vec![2u8; 64 << 10]);
    client.staging([&mut staged].into_iter(), false);
    client.flush().expect("staging");
    assert_eq!(staged.kind(), compute_core::BytesKind::Pinned);
    assert_eq!(
        figures(usage()),
        (ring + 4096, 0),
        "staged bytes are the caller's"
    );
    drop(staged);
    let base = ring + 4096 + (64 << 10);
    assert_eq!(figures(usage()), (base, 0));
    let mut at_two = None;
    for step in 0..10 {
        let h = client.create(Bytes::from_vec(vec![step as u8; 4 << 20]));
        let back = client.read_one(h).expect("read");
        assert!(back.iter().all(|&b| b == step as u8));
        drop(back);
        sync();
        let u = usage();
        assert_eq!(
            u.bytes_in_use, 0,
            "step {step}: nothing in use after a sync: {u:?}"
        );
        assert!(
            u.bytes_reserved >= base + (8 << 20),
            "step {step}: the large ring (at least one 4 MiB slot) and the 4 MiB read buffer: {u:?}"
        );
        match at_two {
            None if step == 1 => at_two = Some(u),
            Some(two) => assert_eq!(u, two, "step {step}: pinned memory grew"),
            None => {}
        }
    }
}

/// Launch parameters of every width arrive exactly: pointers, lengths, a `Meta` and scalars of
/// 1, 2, 4 and 8 bytes in an order that puts padding between them in the C++ signature (checked
/// against the CPU backend's reference executor).
#[test]
fn parameters_of_every_width_arrive_exactly() {
    let _serial = serial();
    let Some(client) = cuda() else { return };
    let mut k = KernelBuilder::new("mixed_params", [1, 1, 1]);
    let t = k.input("t", ElemType::F32, 1);
    let ints = k.output("ints", ElemType::I64, 1);
    let floats = k.output("floats", ElemType::F64, 1);
    let scalars = [
        k.scalar("a", ElemType::I8),
        k.scalar("b", ElemType::F64),
        k.scalar("c", ElemType::U16),
        k.scalar("d", ElemType::Bool),
        k.scalar("e", ElemType::I64),
        k.scalar("f", ElemType::F32),
        k.scalar("g", ElemType::I16),
        k.scalar("h", ElemType::U8),
    ];
    for (i, s) in scalars.into_iter().enumerate() {
        let wide = k.cast(s, ElemType::I64);
        k.store(ints, i as u32, wide);
        let f = k.cast(s, ElemType::F64);
        k.store(floats, i as u32, f);
    }
    let rank = k.rank(t);
    let rank = k.cast(rank, ElemType::I64);
    k.store(ints, 8u32, rank);
    for d in 0..3u32 {
        let n = k.shape(t, d);
        let n = k.cast(n, ElemType::I64);
        k.store(ints, 9 + d, n);
        let s = k.stride(t, d);
        let s = k.cast(s, ElemType::I64);
        k.store(ints, 12 + d, s);
    }
    let len = k.len(t);
    let len = k.cast(len, ElemType::I64);
    k.store(ints, 15u32, len);
    let def = k.build().expect("mixed_params");
    fn launch_on<R: Runtime>(
        client: &ComputeClient<R>,
        def: &KernelDefinition,
    ) -> (Vec<i64>, Vec<f64>)
    where
        <R::Server as compute_core::ComputeServer>::Kernel: From<KernelDefinition>,
    {
        let t = client.create(Bytes::from_elems(vec![0.0f32; 24]));
        let ints = client.create(Bytes::zeroed(16 * 8));
        let floats = client.create(Bytes::zeroed(8 * 8));
        let args = KernelArguments::new()
            .tensor(t.binding(), [2, 3, 4], [12, 4, 1])
            .buffer(ints.clone().binding())
            .buffer(floats.clone().binding())
            .scalar(-5i8)
            .scalar(-1536.25f64)
            .scalar(65_000u16)
            .scalar(true)
            .scalar(i64::MIN + 3)
            .scalar(-2.5f32)
            .scalar(-30_000i16)
            .scalar(250u8);
        client.launch(def.clone().into(), CubeCount::Static(1, 1, 1), args);
        (
            client.read_one(ints).unwrap().to_elems::<i64>(),
            client.read_one(floats).unwrap().to_elems::<f64>(),
        )
    }
    let got = launch_on(&client, &def);
    let cpu = ComputeClient::<CpuRuntime>::load(&CpuDevice::default());
    let want = launch_on(&cpu, &def);
    assert_eq!(
        &want.0,
        &[
            -5,
            -1536,
            65_000,
            1,
            i64::MIN + 3,
            -2,
            -30_000,
            250,
            3,
            2,
            3,
            4,
            12,
            4,
            1,
            24
        ],
        "the reference itself"
    );
    assert_eq!(got, want);
}
