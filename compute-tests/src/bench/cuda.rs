//! CUDA rows: each against raw cudarc (its thin `result` layer over the driver) doing the same
//! work in the same run, on the same device and context.

use std::ffi::CString;

use compute::cuda::cudarc::driver::{result, sys};
use compute::cuda::cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use compute::cuda::{CudaDevice, CudaKernel, CudaRuntime};
use compute_core::kernel::{KernelDefinition, kernel};
use compute_core::{Bytes, ComputeClient, CubeCount, KernelArguments, StreamId, block_on};

use super::timing::{best_alternating, best_per_call, best_prepared, progress};
use super::{Better, Row};

const BACKEND: &str = "cuda";

type Client = ComputeClient<CudaRuntime>;

/// Every CUDA row whose name contains `filter`.
pub fn run(filter: &str) -> Vec<Row> {
    // SAFETY: NVLink multicast stays off for every NCCL use in this process (set before NCCL loads).
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
    if let Err(reason) = <CudaRuntime as compute_core::Runtime>::availability() {
        eprintln!("bench: cuda unavailable: {reason}");
        return Vec::new();
    }
    let mut client = Client::load(&CudaDevice::default());
    // SAFETY: the bench thread is the only user of this stream.
    unsafe { client.set_stream(StreamId::fresh()) };
    let raw = Raw::new(&client);
    let mut rows = Vec::new();
    let wanted = |name: &str| filter.is_empty() || name.contains(filter);
    if wanted("launch") {
        progress("cuda launch host cost and latency");
        rows.extend(launch(&client, &raw));
    }
    if wanted("kept kernel launch") {
        progress("cuda kept kernel launch, generic vs backend-specific");
        let out = client.empty(4 * 256);
        let kernel: CudaKernel = super::kept::definition().into();
        let args = super::kept::arguments(&out);
        let mut specific = |n: usize| {
            for _ in 0..n {
                client.launch(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone());
            }
        };
        rows.extend(super::kept::rows("cuda", &client, &out, &mut specific));
    }
    if wanted("graph") {
        progress("cuda graph replay");
        rows.extend(graph(&client, &raw));
        rows.extend(super::graph::rows(BACKEND, &client));
    }
    if wanted("bandwidth") {
        progress("cuda transfer bandwidth");
        rows.extend(transfers(&client, &raw));
        progress("cuda copy kernel bandwidth");
        rows.push(copy_kernel(&client, &raw));
    }
    if wanted("alloc") {
        progress("cuda allocation fast path");
        rows.push(allocation(&client, &raw));
    }
    rows
}

/// The raw baseline: a stream of its own, modules loaded straight from NVRTC's PTX.
struct Raw {
    stream: sys::CUstream,
    arch: &'static str,
}

impl Raw {
    fn new(client: &Client) -> Self {
        // Make the device's primary context current on this thread (the client's server did).
        block_on(client.sync()).expect("sync");
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .expect("cuStreamCreate");
        let (major, minor) = client.info().compute_capability;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        Self { stream, arch }
    }

    /// The generated CUDA C++ of `kernel` (the checked form the client launches), compiled to PTX
    /// by NVRTC and loaded: the same code our launches run.
    fn function(&self, kernel: &KernelDefinition) -> sys::CUfunction {
        let generated = compute::cuda::codegen::generate(kernel, true).expect("codegen");
        let opts = CompileOptions {
            arch: Some(self.arch),
            options: vec!["--std=c++17".into(), "--fmad=false".into()],
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(&generated.source, opts).expect("nvrtc");
        let src = CString::new(ptx.to_src()).expect("ptx text");
        // SAFETY: a NUL-terminated PTX image produced by NVRTC.
        let module = unsafe { result::module::load_data(src.as_ptr().cast()) }.expect("load");
        // SAFETY: the module was just loaded and lives for the whole bench.
        unsafe {
            result::module::get_function(
                module,
                CString::new(compute::cuda::codegen::ENTRY).expect("name"),
            )
        }
        .expect("function")
    }

    fn sync(&self) {
        // SAFETY: the stream is alive.
        unsafe { result::stream::synchronize(self.stream) }.expect("sync");
    }
}

fn fill_kernel() -> KernelDefinition {
    crate::kernels::fill_f32()
}

#[kernel(cube_dim = 256)]
fn bench_copy_f32x4(input: &[[f32; 4]], out: &mut [[f32; 4]]) {
    let i = ABSOLUTE_POS;
    out[i] = input[i];
}

fn copy_def() -> KernelDefinition {
    bench_copy_f32x4::definition().clone()
}

/// Launch `f` (a `fill_f32`-shaped kernel: buffer, length, f32 scalar) on the raw stream.
fn raw_fill(raw: &Raw, f: sys::CUfunction, ptr: u64, len: u64, cubes: u32) {
    let mut p = ptr;
    let mut n = len;
    let mut value = 1.0f32;
    let mut params: [*mut core::ffi::c_void; 3] = [
        (&mut p as *mut u64).cast(),
        (&mut n as *mut u64).cast(),
        (&mut value as *mut f32).cast(),
    ];
    // SAFETY: the parameters match the kernel's signature and point to live locals; `ptr` is a
    // live device range of `len` f32.
    unsafe { result::launch_kernel(f, (cubes, 1, 1), (256, 1, 1), 0, raw.stream, &mut params) }
        .expect("launch");
}

/// [`raw_fill`] with the parameters in one packed buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER`) at
/// the offsets the driver reports for `f`: the form compute-cuda's launches use.
fn raw_fill_packed(raw: &Raw, f: sys::CUfunction, value_at: usize, ptr: u64, len: u64, cubes: u32) {
    let mut buf = [0u64; 4];
    let size = 4;
    buf[0] = ptr;
    buf[1] = len;
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
    bytes[value_at..value_at + 4].copy_from_slice(&1.0f32.to_le_bytes());
    let mut total = value_at + size;
    let mut extra = [
        sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut core::ffi::c_void,
        buf.as_mut_ptr().cast(),
        sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut core::ffi::c_void,
        (&mut total as *mut usize).cast(),
        sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut core::ffi::c_void,
    ];
    // SAFETY: the packed buffer holds the kernel's parameters at the driver's offsets; `ptr` is
    // a live device range of `len` f32.
    unsafe {
        sys::cuLaunchKernel(
            f,
            cubes,
            1,
            1,
            256,
            1,
            1,
            0,
            raw.stream,
            core::ptr::null_mut(),
            extra.as_mut_ptr(),
        )
    }
    .result()
    .expect("launch");
}

fn device_ptr(client: &Client, handle: &compute_core::Handle) -> u64 {
    client
        .get_resource(handle.clone())
        .expect("resource")
        .resource()
        .ptr
}

fn launch(client: &Client, raw: &Raw) -> Vec<Row> {
    let def = fill_kernel();
    let kernel: CudaKernel = def.clone().into();
    let out = client.empty(4 * 256);
    let args = KernelArguments::new()
        .buffer(out.clone().binding())
        .scalar(1.0f32);
    let once = || client.launch(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone());
    once();
    block_on(client.sync()).expect("sync");
    let f = raw.function(&def);
    let ptr = device_ptr(client, &out);
    raw_fill(raw, f, ptr, 256, 1);
    raw.sync();
    let n = 20_000;
    // Ours and raw alternate, best of 7 each, so that drift of the machine (clock, other
    // tenants) falls on both alike.
    let (mut host, mut raw_host) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..7 {
        host = host.min(best_per_call(1, 1, || {
            for _ in 0..n {
                once();
            }
            block_on(client.sync()).expect("sync");
        }));
        raw_host = raw_host.min(best_per_call(1, 1, || {
            for _ in 0..n {
                raw_fill(raw, f, ptr, 256, 1);
            }
            raw.sync();
        }));
    }
    // The driver's two parameter forms side by side (raw, alternating), and the split of our
    // cost: a raw launch plus our zero-cube launch per iteration is what ours would cost if its
    // binding resolve, parameter packing and bookkeeping were free.
    let (mut value_at, mut size) = (0usize, 0usize);
    // SAFETY: parameter 2 (the f32 scalar) exists in the fill kernel; both outputs are locals.
    unsafe { sys::cuFuncGetParamInfo(f, 2, &mut value_at, &mut size) }
        .result()
        .expect("cuFuncGetParamInfo");
    assert_eq!(size, 4, "the fill kernel's scalar is an f32");
    let (mut raw_packed, mut raw_plus_front) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        raw_packed = raw_packed.min(best_per_call(1, 1, || {
            for _ in 0..n {
                raw_fill_packed(raw, f, value_at, ptr, 256, 1);
            }
            raw.sync();
        }));
        raw_plus_front = raw_plus_front.min(best_per_call(1, 1, || {
            for _ in 0..n {
                client.launch(kernel.clone(), CubeCount::Static(0, 1, 1), args.clone());
                raw_fill(raw, f, ptr, 256, 1);
            }
            raw.sync();
        }));
    }
    let (raw_packed, raw_plus_front) = (raw_packed / n as f64, raw_plus_front / n as f64);
    let (host, raw_host) = (host / n as f64, raw_host / n as f64);
    // Ablation of the host cost above raw: what the caller's loop pays apart from the launch
    // (the kernel and argument clones it hands over), and a launch that stops before the
    // driver (zero cubes: the client, the lock, the checks and the compiled-kernel lookup, then
    // no binding resolve, no parameters, no `cuLaunchKernel`, no bookkeeping).
    let clones = best_per_call(5, n, || drop((kernel.clone(), args.clone())));
    let front = best_per_call(5, n, || {
        client.launch(kernel.clone(), CubeCount::Static(0, 1, 1), args.clone())
    });
    let latency = best_per_call(5, 2000, || {
        once();
        block_on(client.sync()).expect("sync");
    });
    let raw_latency = best_per_call(5, 2000, || {
        raw_fill(raw, f, ptr, 256, 1);
        raw.sync();
    });
    let us = 1e6;
    vec![
        Row::new(
            BACKEND,
            "launch host cost (cached kernel, incl. drain)",
            host * us,
            "us",
            "raw cudarc result::launch_kernel, same PTX, alternating, best of 7",
            raw_host * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch host cost ablation: the caller's kernel + arguments clone",
            clones * us,
            "us",
            "raw cudarc result::launch_kernel host cost",
            raw_host * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch host cost ablation: zero-cube launch (all but resolve, params, driver, marks)",
            front * us,
            "us",
            "raw cudarc result::launch_kernel host cost",
            raw_host * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch host cost ablation: raw launch with one packed parameter buffer",
            raw_packed * us,
            "us",
            "raw cudarc result::launch_kernel host cost (a pointer per parameter)",
            raw_host * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch host cost ablation: raw launch + our zero-cube launch",
            raw_plus_front * us,
            "us",
            "raw cudarc result::launch_kernel host cost",
            raw_host * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch+sync latency",
            latency * us,
            "us",
            "raw cudarc launch + cuStreamSynchronize",
            raw_latency * us,
            Better::Lower,
        ),
    ]
}

fn graph(client: &Client, raw: &Raw) -> Vec<Row> {
    let mut capture = client.clone();
    // SAFETY: a fresh stream used by this thread only.
    unsafe { capture.set_stream(StreamId::fresh()) };
    let def = fill_kernel();
    let kernel: CudaKernel = def.clone().into();
    capture.graph_prepare().expect("graph_prepare");
    let out = capture.empty(4 * 256);
    let args = KernelArguments::new()
        .buffer(out.clone().binding())
        .scalar(1.0f32);
    let kernels = 64;
    let record = || {
        for _ in 0..kernels {
            capture.launch(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone());
        }
    };
    record();
    block_on(capture.sync()).expect("sync");
    capture.start_capture().expect("start_capture");
    record();
    let graph = capture.stop_capture().expect("stop_capture");
    graph.replay().expect("replay");
    block_on(capture.sync()).expect("sync");
    let replays = 200;
    let ours = best_per_call(5, 1, || {
        for _ in 0..replays {
            graph.replay().expect("replay");
        }
        block_on(capture.sync()).expect("sync");
    }) / (replays * kernels) as f64;
    let f = raw.function(&def);
    let ptr = device_ptr(&capture, &out);
    let direct = best_per_call(5, 1, || {
        for _ in 0..replays * kernels {
            raw_fill(raw, f, ptr, 256, 1);
        }
        raw.sync();
    }) / (replays * kernels) as f64;
    // The same 64 launches captured raw (cuStreamBeginCapture on the raw stream), replayed
    // with cuGraphLaunch.
    let check = |r: sys::CUresult, what: &str| {
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "{what}");
    };
    let mut raw_graph: sys::CUgraph = core::ptr::null_mut();
    let mut exec: sys::CUgraphExec = core::ptr::null_mut();
    // SAFETY: the raw stream is idle and owned by the bench; the capture records the launches
    // `raw_fill` issues on it, into `raw_graph`.
    check(
        unsafe {
            sys::cuStreamBeginCapture_v2(
                raw.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        },
        "cuStreamBeginCapture",
    );
    for _ in 0..kernels {
        raw_fill(raw, f, ptr, 256, 1);
    }
    // SAFETY: ends the capture begun above; `raw_graph` receives the graph.
    check(
        unsafe { sys::cuStreamEndCapture(raw.stream, &mut raw_graph) },
        "cuStreamEndCapture",
    );
    // SAFETY: `raw_graph` is the graph just captured; `exec` receives its instance.
    check(
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, raw_graph, 0) },
        "cuGraphInstantiate",
    );
    let raw_replay = best_per_call(5, 1, || {
        for _ in 0..replays {
            // SAFETY: `exec` is a live instance; the raw stream is the bench's.
            check(
                unsafe { sys::cuGraphLaunch(exec, raw.stream) },
                "cuGraphLaunch",
            );
        }
        raw.sync();
    }) / (replays * kernels) as f64;
    // SAFETY: the stream was synced: neither is in use; each is destroyed once.
    unsafe {
        check(sys::cuGraphExecDestroy(exec), "cuGraphExecDestroy");
        check(sys::cuGraphDestroy(raw_graph), "cuGraphDestroy");
    }
    drop(graph);
    vec![
        Row::new(
            BACKEND,
            "graph replay per kernel (64-kernel graph)",
            ours * 1e6,
            "us",
            "raw cudarc launches of the same kernels",
            direct * 1e6,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "graph replay + sync per kernel (64-kernel graph) vs raw CUDA graph",
            ours * 1e6,
            "us",
            "the same launches captured raw, cuGraphLaunch x200 + sync",
            raw_replay * 1e6,
            Better::Lower,
        ),
    ]
}

fn transfers(client: &Client, raw: &Raw) -> Vec<Row> {
    let mut rows = Vec::new();
    for &size in &[4usize << 10, 1 << 20, 64 << 20, 1 << 30] {
        let reps = if size >= 1 << 30 {
            3
        } else if size >= 64 << 20 {
            10
        } else if size >= 1 << 20 {
            200
        } else {
            2000
        };
        let handle = client.empty(size);
        let mut pinned = Bytes::from_vec(vec![7u8; size]);
        client.staging([&mut pinned].into_iter(), false);
        let pageable = Bytes::from_vec(vec![5u8; size]);
        let dst_ptr = device_ptr(client, &handle);
        let pinned_ptr = pinned.as_ptr();
        let label = human(size);
        // Ours, pinned: the staged bytes go straight to the device.
        let h2d = |bytes: &Bytes, pinned: bool| {
            let copy =
                Bytes::from_host_buffer(Box::new(Borrowed(bytes.as_ptr(), bytes.len(), pinned)));
            client.write(&handle, copy);
        };
        let mut host_dst = Bytes::from_vec(vec![0u8; size]);
        client.staging([&mut host_dst].into_iter(), false);
        let host_dst_ptr = host_dst.as_ptr().cast_mut();
        let pageable_ptr = pageable.as_ptr();
        // Each closure runs `reps` transfers and waits for them; they alternate, best of 5.
        let sync = || block_on(client.sync()).expect("sync");
        let mut ours_pinned = || {
            for _ in 0..reps {
                h2d(&pinned, true);
            }
            sync();
        };
        let mut ours_pageable = || {
            for _ in 0..reps {
                h2d(&pageable, false);
            }
            sync();
        };
        let raw_copy = |src: *const u8| {
            for _ in 0..reps {
                // SAFETY: `src` holds `size` bytes the bench keeps alive (pinned or pageable; a
                // pageable copy returns once the driver staged them); `dst_ptr` is a live range
                // of `size` bytes; the copies complete before `raw.sync()` returns.
                let slice = unsafe { core::slice::from_raw_parts(src, size) };
                // SAFETY: as above.
                unsafe { result::memcpy_htod_async(dst_ptr, slice, raw.stream) }.expect("htod");
            }
            raw.sync();
        };
        let mut raw_pinned = || raw_copy(pinned_ptr);
        let mut raw_pageable = || raw_copy(pageable_ptr);
        let mut ours_d2h = || {
            for _ in 0..reps {
                drop(client.read_one(handle.clone()).expect("read"));
            }
        };
        let mut raw_d2h = || {
            for _ in 0..reps {
                // SAFETY: `host_dst_ptr` holds `size` pinned bytes, written only by this copy.
                let slice = unsafe { core::slice::from_raw_parts_mut(host_dst_ptr, size) };
                // SAFETY: as above; the source is a live device range of `size` bytes.
                unsafe { result::memcpy_dtoh_async(slice, dst_ptr, raw.stream) }.expect("dtoh");
                raw.sync();
            }
        };
        // Warm up (pinned staging buffers, the driver's own staging), then measure.
        ours_pageable();
        ours_d2h();
        let best = best_alternating(
            5,
            &mut [
                &mut ours_pinned,
                &mut raw_pinned,
                &mut ours_pageable,
                &mut raw_pageable,
                &mut ours_d2h,
                &mut raw_d2h,
            ],
        );
        let [
            ours_pinned,
            raw_h2d,
            ours_pageable,
            raw_pageable,
            ours_d2h,
            raw_d2h,
        ] = [best[0], best[1], best[2], best[3], best[4], best[5]].map(|t| t / reps as f64);
        // The physical limit of staging pageable bytes: a pageable write is a host copy into
        // pinned memory plus the pinned DMA, overlapped at best, so it runs at most at the slower
        // of the two. The host copy is measured as the staging does it: on compute-core's copy
        // team, piece by piece into one pinned buffer of at most 8 MiB (which stays in the
        // last-level cache; a copy into 1 GiB of pinned memory is bound by DRAM writes instead).
        let ring = size.min(8 << 20);
        let stage = |src: &[u8]| {
            // SAFETY: `host_dst_ptr` holds `size >= ring` pinned bytes nothing else uses now.
            let dst = unsafe { core::slice::from_raw_parts_mut(host_dst_ptr, ring) };
            for piece in src.chunks(ring) {
                let part = piece
                    .len()
                    .div_ceil(compute_core::copy::copy_threads() * 2)
                    .max(256 << 10);
                compute_core::copy::copy_parallel(&mut dst[..piece.len()], piece, part);
            }
        };
        let host_copy = best_per_call(3, 1, || {
            for _ in 0..reps {
                stage(&pageable[..]);
            }
        }) / reps as f64;
        // The caller's cost of a pageable write, apart from the DMA: a few writes that the
        // staging ring holds at once (4 slots of 1 MiB, or 16 small writes packed in one small
        // slot), so none waits for a slot, timed up to their return. A write larger than the
        // ring waits for its own first pieces' DMA.
        let burst = ((4usize << 20) / size).clamp(1, 16);
        let mut caller = f64::INFINITY;
        for _ in 0..5 {
            sync();
            let start = std::time::Instant::now();
            for _ in 0..burst {
                h2d(&pageable, false);
            }
            caller = caller.min(start.elapsed().as_secs_f64() / burst as f64);
            sync();
        }
        let gbs = |secs: f64| size as f64 / secs / 1e9;
        let limit = gbs(host_copy).min(gbs(raw_h2d));
        rows.push(Row::new(
            BACKEND,
            &format!("H2D bandwidth {label} pageable (vs physical limit)"),
            gbs(ours_pageable),
            "GB/s",
            &format!(
                "min(host copy pageable -> pinned piece on {} threads {:.1} GB/s, pinned DMA)",
                compute_core::copy::copy_threads(),
                gbs(host_copy)
            ),
            limit,
            Better::Higher,
        ));
        rows.push(Row::new(
            BACKEND,
            &format!("H2D {label} pageable: caller time per write ({burst} writes, no wait)"),
            caller * 1e6,
            "us",
            "raw cudarc pinned cuMemcpyHtoDAsync DMA time per copy",
            raw_h2d * 1e6,
            Better::Lower,
        ));
        rows.push(Row::new(
            BACKEND,
            &format!("H2D bandwidth {label} pinned"),
            gbs(ours_pinned),
            "GB/s",
            "raw cudarc pinned cuMemcpyHtoDAsync",
            gbs(raw_h2d),
            Better::Higher,
        ));
        rows.push(Row::new(
            BACKEND,
            &format!("H2D bandwidth {label} pageable"),
            gbs(ours_pageable),
            "GB/s",
            "raw cudarc pinned cuMemcpyHtoDAsync",
            gbs(raw_h2d),
            Better::Higher,
        ));
        rows.push(Row::new(
            BACKEND,
            &format!("H2D bandwidth {label} pageable (driver staging)"),
            gbs(ours_pageable),
            "GB/s",
            "raw cudarc cuMemcpyHtoDAsync from the same pageable bytes",
            gbs(raw_pageable),
            Better::Higher,
        ));
        rows.push(Row::new(
            BACKEND,
            &format!("D2H bandwidth {label} (read into pinned)"),
            gbs(ours_d2h),
            "GB/s",
            "raw cudarc pinned cuMemcpyDtoHAsync + sync",
            gbs(raw_d2h),
            Better::Higher,
        ));
        if size >= 64 << 20 {
            // The upload paths that allocate: `create_from_slice` of a borrowed slice (the
            // host bytes are copied before it returns) and `create` of owned bytes.
            let host = vec![9u8; size];
            let from_slice = best_per_call(3, 1, || {
                for _ in 0..reps {
                    drop(client.create_from_slice(&host));
                }
                sync();
            }) / reps as f64;
            // The owned bytes are made before the clock starts: the row times `create`, not
            // the caller's clone.
            let owned = best_prepared(
                3,
                || (0..reps).map(|_| host.clone()).collect::<Vec<_>>(),
                |copies| {
                    for copy in copies {
                        drop(client.create(Bytes::from_vec(copy)));
                    }
                    sync();
                },
            ) / reps as f64;
            // Ablation: `create_from_slice` of bytes not in the host's caches (a fresh copy per
            // call, as `create(Bytes)` gets), kept past the clock.
            let mut kept = Vec::new();
            let cold = best_prepared(
                3,
                || (0..reps).map(|_| host.clone()).collect::<Vec<_>>(),
                |copies| {
                    for copy in &copies {
                        drop(client.create_from_slice(copy));
                    }
                    sync();
                    kept.push(copies);
                },
            ) / reps as f64;
            rows.push(Row::new(
                BACKEND,
                &format!("upload {label} ablation: create_from_slice of uncached bytes"),
                gbs(cold),
                "GB/s",
                "raw cudarc pinned cuMemcpyHtoDAsync",
                gbs(raw_h2d),
                Better::Higher,
            ));
            // Ablation: what freeing the owned bytes costs where they are dropped (the write
            // hands them to the release thread instead; as a rate, to set against the DMA).
            let free = best_prepared(3, || host.clone(), drop);
            rows.push(Row::new(
                BACKEND,
                &format!("upload {label} ablation: freeing owned bytes on the caller"),
                gbs(free),
                "GB/s",
                "raw cudarc pinned cuMemcpyHtoDAsync",
                gbs(raw_h2d),
                Better::Higher,
            ));
            // The physical limit of an upload from bytes not in the host's caches: the host copy
            // of fresh copies (as `create(Bytes)` gets them) on the copy team, piece by piece into
            // the same pinned buffer of at most 8 MiB as above, without any DMA; an upload runs at
            // most at the slower of it and the pinned DMA.
            let cold_copy = best_prepared(
                3,
                || (0..reps).map(|_| host.clone()).collect::<Vec<_>>(),
                |copies| {
                    for copy in &copies {
                        stage(copy);
                    }
                    kept.push(copies);
                },
            ) / reps as f64;
            drop(kept);
            rows.push(Row::new(
                BACKEND,
                &format!("upload {label} create(Bytes) (vs physical limit)"),
                gbs(owned),
                "GB/s",
                &format!(
                    "min(host copy of uncached bytes -> pinned piece on {} threads {:.1} GB/s, \
                     pinned DMA)",
                    compute_core::copy::copy_threads(),
                    gbs(cold_copy)
                ),
                gbs(cold_copy).min(gbs(raw_h2d)),
                Better::Higher,
            ));
            for (path, secs) in [("create_from_slice", from_slice), ("create(Bytes)", owned)] {
                rows.push(Row::new(
                    BACKEND,
                    &format!("upload {label} {path}"),
                    gbs(secs),
                    "GB/s",
                    "raw cudarc pinned cuMemcpyHtoDAsync",
                    gbs(raw_h2d),
                    Better::Higher,
                ));
            }
        }
        drop(host_dst);
        drop(pinned);
    }
    rows
}

/// Host bytes borrowed from pinned memory the bench keeps alive (reported as pinned).
struct Borrowed(*const u8, usize, bool);

// SAFETY: the pointed-to buffer outlives every use (the bench syncs before dropping it).
unsafe impl Send for Borrowed {}
// SAFETY: as above; only read.
unsafe impl Sync for Borrowed {}

impl compute_core::HostBuffer for Borrowed {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: the buffer holds `len` bytes and outlives this value (see the Send impl).
        unsafe { core::slice::from_raw_parts(self.0, self.1) }
    }
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        unreachable!("the bench never writes through a borrowed buffer")
    }
    fn is_pinned(&self) -> bool {
        self.2
    }
}

fn copy_kernel(client: &Client, raw: &Raw) -> Row {
    let bytes = 1usize << 30;
    let elems = bytes / 4;
    let def = copy_def();
    let kernel: CudaKernel = def.clone().into();
    let input = client.empty(bytes);
    let out = client.empty(bytes);
    let cubes = (elems / 4).div_ceil(256) as u32;
    let args = KernelArguments::new()
        .buffer(input.clone().binding())
        .buffer(out.clone().binding());
    let launch = || client.launch(kernel.clone(), CubeCount::Static(cubes, 1, 1), args.clone());
    launch();
    block_on(client.sync()).expect("sync");
    let reps = 20;
    let ours = best_per_call(3, 1, || {
        for _ in 0..reps {
            launch();
        }
        block_on(client.sync()).expect("sync");
    }) / reps as f64;
    let f = raw.function(&def);
    let (pi, po) = (device_ptr(client, &input), device_ptr(client, &out));
    let raw_launch = || {
        let (mut a, mut b) = (pi, po);
        let (mut la, mut lb) = ((elems / 4) as u64, (elems / 4) as u64);
        let mut params: [*mut core::ffi::c_void; 4] = [
            (&mut a as *mut u64).cast(),
            (&mut la as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut lb as *mut u64).cast(),
        ];
        // SAFETY: parameters match the copy kernel's signature; both ranges hold `bytes` bytes.
        unsafe { result::launch_kernel(f, (cubes, 1, 1), (256, 1, 1), 0, raw.stream, &mut params) }
            .expect("launch");
    };
    raw_launch();
    raw.sync();
    let direct = best_per_call(3, 1, || {
        for _ in 0..reps {
            raw_launch();
        }
        raw.sync();
    }) / reps as f64;
    let tbs = |secs: f64| 2.0 * bytes as f64 / secs / 1e12;
    Row::new(
        BACKEND,
        "copy kernel bandwidth 1 GiB f32x4 (read+write)",
        tbs(ours),
        "TB/s",
        "raw cudarc launch of the same PTX",
        tbs(direct),
        Better::Higher,
    )
}

fn allocation(client: &Client, raw: &Raw) -> Row {
    let size = 4096;
    let iters = 50_000;
    drop(client.empty(size));
    block_on(client.sync()).expect("sync");
    let ours = best_per_call(5, iters, || drop(client.empty(size)));
    let driver = best_per_call(5, iters, || {
        // SAFETY: a stream-ordered allocation freed right after on the same stream.
        let ptr = unsafe { result::malloc_async(raw.stream, size) }.expect("cuMemAllocAsync");
        // SAFETY: allocated just above on this stream, unused.
        unsafe { result::free_async(ptr, raw.stream) }.expect("cuMemFreeAsync");
    });
    raw.sync();
    Row::new(
        BACKEND,
        "alloc fast path (4 KiB reserve+free)",
        1.0 / ours,
        "pairs/s",
        "cuMemAllocAsync+cuMemFreeAsync",
        1.0 / driver,
        Better::Higher,
    )
}

fn human(size: usize) -> String {
    if size >= 1 << 30 {
        format!("{} GiB", size >> 30)
    } else if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}
