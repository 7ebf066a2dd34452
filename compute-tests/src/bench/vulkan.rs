//! Vulkan rows: each against raw ash doing the same work in the same run, on a logical device of
//! its own on the same physical device, created with the same features, running the same SPIR-V
//! (the backend's emitter output for the same kernel, compiled once), so that the ratios isolate
//! the runtime's overhead.

use std::time::Instant;

use compute::vulkan::ash::vk;
use compute::vulkan::{RawDevice, VulkanDevice, VulkanKernel, VulkanRuntime};
use compute_core::kernel::{KernelDefinition, kernel};
use compute_core::{Bytes, ComputeClient, CubeCount, KernelArguments, block_on};

use super::timing::{best_per_call, progress};
use super::{Better, Row};

const BACKEND: &str = "vulkan";

/// Repetitions of the host-cost measurements (each 2000 launches).
const HOST_REPS: usize = 25;

/// Every Vulkan row whose name contains `filter` (none when Vulkan is unavailable here).
pub fn run(filter: &str) -> Vec<Row> {
    if let Err(reason) = compute::vulkan::availability() {
        eprintln!("bench: vulkan unavailable: {reason}");
        return Vec::new();
    }
    let client = ComputeClient::<VulkanRuntime>::load(&VulkanDevice::default());
    let raw = match Raw::new() {
        Ok(raw) => raw,
        Err(e) => {
            eprintln!("bench: raw ash device: {e}");
            return Vec::new();
        }
    };
    let mut rows = Vec::new();
    let wanted = |name: &str| name.contains(filter);
    if wanted("launch") {
        progress("vulkan launch latency and host cost");
        match launch(&client, &raw) {
            Ok(r) => rows.extend(r),
            Err(e) => eprintln!("bench: vulkan launch rows skipped: {e}"),
        }
    }
    if wanted("kept kernel launch") {
        progress("vulkan kept kernel launch, generic vs backend-specific");
        let out = client.empty(4 * 256);
        let kernel: VulkanKernel = super::kept::definition().into();
        let args = super::kept::arguments(&out);
        let mut specific = |n: usize| {
            for _ in 0..n {
                client.launch(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone());
            }
        };
        rows.extend(super::kept::rows("vulkan", &client, &out, &mut specific));
    }
    if wanted("graph") {
        progress("vulkan graph replay vs plain launches");
        rows.extend(super::graph::rows("vulkan", &client));
    }
    if wanted("bandwidth") {
        let size = copy_size(&client);
        progress(&format!(
            "vulkan copy kernel, upload and readback bandwidth ({} MiB)",
            size >> 20
        ));
        match bandwidth(&client, &raw, size) {
            Ok(r) => rows.extend(r),
            Err(e) => eprintln!("bench: vulkan bandwidth rows skipped: {e}"),
        }
    }
    rows
}

/// 1 GiB on a GPU; 64 MiB on a CPU device (lavapipe binds at most 128 MiB and copies on the host).
fn copy_size(client: &ComputeClient<VulkanRuntime>) -> usize {
    let max_page = client.properties().memory.max_page_size as usize;
    let wanted = if client.info().device_type == "CPU" {
        64 << 20
    } else {
        1 << 30
    };
    let mut size = wanted.min(max_page);
    size -= size % (1 << 20);
    size
}

struct Buf {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    ptr: *mut u8,
    size: u64,
}

struct Pipe {
    pipeline: vk::Pipeline,
    layout: vk::PipelineLayout,
    set_layout: vk::DescriptorSetLayout,
    pool: vk::DescriptorPool,
    set: vk::DescriptorSet,
    push: Vec<u8>,
    info: Option<Buf>,
}

/// Raw ash: one logical device, one command buffer and a fence, used from this thread only.
struct Raw {
    dev: RawDevice,
    pool: vk::CommandPool,
    cb: vk::CommandBuffer,
    fence: vk::Fence,
}

type Res<T> = Result<T, String>;

/// The first error of raw calls made inside timing closures.
#[derive(Default)]
struct Failure(std::cell::RefCell<Option<String>>);

impl Failure {
    fn note(&self, r: Res<()>) {
        if let Err(e) = r {
            self.0.borrow_mut().get_or_insert(e);
        }
    }

    fn check(&self) -> Res<()> {
        match self.0.borrow_mut().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

fn vkr(what: &'static str) -> impl Fn(vk::Result) -> String {
    move |e| format!("{what}: {e}")
}

impl Raw {
    fn new() -> Res<Self> {
        let dev = RawDevice::new(VulkanDevice::default()).map_err(|e| e.to_string())?;
        let d = dev.device();
        let info = vk::CommandPoolCreateInfo::default()
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER)
            .queue_family_index(dev.family());
        // SAFETY: raw ash calls on a device only this thread uses; every create info is valid.
        unsafe {
            let pool = d
                .create_command_pool(&info, None)
                .map_err(vkr("create_command_pool"))?;
            let alloc = vk::CommandBufferAllocateInfo::default()
                .command_pool(pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1);
            let cb = d
                .allocate_command_buffers(&alloc)
                .map_err(vkr("allocate_command_buffers"))?[0];
            let fence = d
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .map_err(vkr("create_fence"))?;
            Ok(Self {
                dev,
                pool,
                cb,
                fence,
            })
        }
    }

    fn d(&self) -> &compute::vulkan::ash::Device {
        self.dev.device()
    }

    fn buffer(&self, size: u64, host: bool) -> Res<Buf> {
        let d = self.d();
        let usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST;
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let memory_type = if host {
            self.dev.staging_memory_type()
        } else {
            self.dev.storage_memory_type()
        };
        // SAFETY: valid create infos; the memory type is one the server allocates buffers from.
        unsafe {
            let buffer = d.create_buffer(&info, None).map_err(vkr("create_buffer"))?;
            let req = d.get_buffer_memory_requirements(buffer);
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(req.size)
                .memory_type_index(memory_type);
            let memory = d
                .allocate_memory(&alloc, None)
                .map_err(vkr("allocate_memory"))?;
            d.bind_buffer_memory(buffer, memory, 0)
                .map_err(vkr("bind_buffer_memory"))?;
            let ptr = if host {
                d.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                    .map_err(vkr("map_memory"))?
                    .cast::<u8>()
            } else {
                core::ptr::null_mut()
            };
            Ok(Buf {
                buffer,
                memory,
                ptr,
                size,
            })
        }
    }

    fn free(&self, b: Buf) {
        // SAFETY: the device is idle between bench steps (every submission is waited for).
        unsafe {
            self.d().destroy_buffer(b.buffer, None);
            self.d().free_memory(b.memory, None);
        }
    }

    /// The pipeline of a portable kernel compiled once by the backend's emitter (same SPIR-V),
    /// with whole buffers in a descriptor set written once and the argument words prepared.
    fn pipeline(&self, kernel: &KernelDefinition, buffers: &[&Buf], item: u64) -> Res<Pipe> {
        let compiled = compute::vulkan::compiler::compile(kernel, &self.dev.caps(), false)
            .map_err(|e| e.to_string())?;
        let d = self.d();
        let n = buffers.len() as u32;
        let count = n + u32::from(compiled.uses_info);
        let bindings: Vec<vk::DescriptorSetLayoutBinding> = (0..count)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(if b < n { b } else { compiled.info_binding })
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let mut words = vec![0u32; compiled.args.words as usize];
        for (k, b) in buffers.iter().enumerate() {
            let at = compiled.args.buffer_words[k] as usize;
            words[at + 1] = (b.size / item) as u32;
        }
        let info = if compiled.uses_info {
            let mut info = vec![0u32; compiled.args.info_header_word as usize + 2 * buffers.len()];
            if !compiled.args.in_push_constants {
                info[..words.len()].copy_from_slice(&words);
            }
            let buf = self.buffer((info.len() as u64 * 4).max(4), true)?;
            // SAFETY: the mapping holds at least `info.len()` words.
            unsafe {
                core::ptr::copy_nonoverlapping(info.as_ptr().cast::<u8>(), buf.ptr, info.len() * 4)
            };
            Some(buf)
        } else {
            None
        };
        let mut push: Vec<u8> = bytemuck::cast_slice(&words).to_vec();
        push.resize(compiled.push_constant_bytes as usize, 0);
        // SAFETY: raw ash object creation with valid create infos; the SPIR-V is the emitter's.
        unsafe {
            let set_layout = d
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                    None,
                )
                .map_err(vkr("create_descriptor_set_layout"))?;
            let ranges = [vk::PushConstantRange::default()
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
                .size(compiled.push_constant_bytes)];
            let set_layouts = [set_layout];
            let layout_info = vk::PipelineLayoutCreateInfo::default()
                .set_layouts(&set_layouts)
                .push_constant_ranges(if compiled.push_constant_bytes > 0 {
                    &ranges
                } else {
                    &[]
                });
            let layout = d
                .create_pipeline_layout(&layout_info, None)
                .map_err(vkr("create_pipeline_layout"))?;
            let module = d
                .create_shader_module(
                    &vk::ShaderModuleCreateInfo::default().code(&compiled.words),
                    None,
                )
                .map_err(vkr("create_shader_module"))?;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main");
            let pipeline = d
                .create_compute_pipelines(
                    vk::PipelineCache::null(),
                    &[vk::ComputePipelineCreateInfo::default()
                        .stage(stage)
                        .layout(layout)],
                    None,
                )
                .map_err(|(_, e)| format!("create_compute_pipelines: {e}"))?[0];
            d.destroy_shader_module(module, None);
            let sizes = [vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(count.max(1))];
            let pool = d
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default()
                        .max_sets(1)
                        .pool_sizes(&sizes),
                    None,
                )
                .map_err(vkr("create_descriptor_pool"))?;
            let set = d
                .allocate_descriptor_sets(
                    &vk::DescriptorSetAllocateInfo::default()
                        .descriptor_pool(pool)
                        .set_layouts(&set_layouts),
                )
                .map_err(vkr("allocate_descriptor_sets"))?[0];
            let mut infos: Vec<vk::DescriptorBufferInfo> = buffers
                .iter()
                .map(|b| {
                    vk::DescriptorBufferInfo::default()
                        .buffer(b.buffer)
                        .range(vk::WHOLE_SIZE)
                })
                .collect();
            if let Some(b) = &info {
                infos.push(
                    vk::DescriptorBufferInfo::default()
                        .buffer(b.buffer)
                        .range(vk::WHOLE_SIZE),
                );
            }
            let writes: Vec<vk::WriteDescriptorSet> = infos
                .iter()
                .enumerate()
                .map(|(k, i)| {
                    vk::WriteDescriptorSet::default()
                        .dst_set(set)
                        .dst_binding(if (k as u32) < n {
                            k as u32
                        } else {
                            compiled.info_binding
                        })
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .buffer_info(core::slice::from_ref(i))
                })
                .collect();
            d.update_descriptor_sets(&writes, &[]);
            Ok(Pipe {
                pipeline,
                layout,
                set_layout,
                pool,
                set,
                push,
                info,
            })
        }
    }

    fn drop_pipe(&self, p: Pipe) {
        // SAFETY: the device is idle between bench steps.
        unsafe {
            let d = self.d();
            d.destroy_pipeline(p.pipeline, None);
            d.destroy_pipeline_layout(p.layout, None);
            d.destroy_descriptor_pool(p.pool, None);
            d.destroy_descriptor_set_layout(p.set_layout, None);
        }
        if let Some(b) = p.info {
            self.free(b);
        }
    }

    /// Record with `f` into the command buffer and submit it (fence not waited).
    fn submit(&self, f: impl FnOnce(&compute::vulkan::ash::Device, vk::CommandBuffer)) -> Res<()> {
        let d = self.d();
        // SAFETY: the command buffer is not pending (every submission is waited for before the
        // next); queue access is this thread's only.
        unsafe {
            d.begin_command_buffer(
                self.cb,
                &vk::CommandBufferBeginInfo::default()
                    .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
            )
            .map_err(vkr("begin_command_buffer"))?;
            f(d, self.cb);
            d.end_command_buffer(self.cb)
                .map_err(vkr("end_command_buffer"))?;
            let cbs = [self.cb];
            let submit = vk::SubmitInfo::default().command_buffers(&cbs);
            d.queue_submit(self.dev.queue(), &[submit], self.fence)
                .map_err(vkr("queue_submit"))
        }
    }

    fn wait(&self) -> Res<()> {
        // SAFETY: the fence belongs to this device and was submitted with the last submission.
        unsafe {
            self.d()
                .wait_for_fences(&[self.fence], true, u64::MAX)
                .map_err(vkr("wait_for_fences"))?;
            self.d()
                .reset_fences(&[self.fence])
                .map_err(vkr("reset_fences"))
        }
    }

    fn run(&self, f: impl FnOnce(&compute::vulkan::ash::Device, vk::CommandBuffer)) -> Res<()> {
        self.submit(f)?;
        self.wait()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: the device is idle (every submission was waited for).
        unsafe {
            let _ = self.d().device_wait_idle();
            self.d().destroy_fence(self.fence, None);
            self.d().destroy_command_pool(self.pool, None);
        }
    }
}

/// Record `times` dispatches of `p`: the pipeline, set and push constants bound once, and the same
/// barrier between dispatches as the runtime records between consecutive launches (in-order
/// execution; `vkCmdPipelineBarrier2` where synchronization2 is enabled, as the runtime does).
/// The leanest raw recording of the same work.
fn dispatches(
    d: &compute::vulkan::ash::Device,
    sync2: bool,
    cb: vk::CommandBuffer,
    p: &Pipe,
    x: u32,
    times: usize,
) {
    let barrier2 = [vk::MemoryBarrier2::default()
        .src_stage_mask(vk::PipelineStageFlags2::COMPUTE_SHADER)
        .src_access_mask(vk::AccessFlags2::SHADER_WRITE)
        .dst_stage_mask(vk::PipelineStageFlags2::COMPUTE_SHADER)
        .dst_access_mask(vk::AccessFlags2::SHADER_READ | vk::AccessFlags2::SHADER_WRITE)];
    let dependency = vk::DependencyInfo::default().memory_barriers(&barrier2);
    let barrier = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE)
        .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
    // SAFETY: `cb` is recording; pipeline, layout and set are alive.
    unsafe {
        d.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, p.pipeline);
        d.cmd_bind_descriptor_sets(
            cb,
            vk::PipelineBindPoint::COMPUTE,
            p.layout,
            0,
            &[p.set],
            &[],
        );
        if !p.push.is_empty() {
            d.cmd_push_constants(cb, p.layout, vk::ShaderStageFlags::COMPUTE, 0, &p.push);
        }
        for i in 0..times {
            if i > 0 && sync2 {
                d.cmd_pipeline_barrier2(cb, &dependency);
            } else if i > 0 {
                d.cmd_pipeline_barrier(
                    cb,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::DependencyFlags::empty(),
                    &barrier,
                    &[],
                    &[],
                );
            }
            d.cmd_dispatch(cb, x, 1, 1);
        }
    }
}

/// Record a buffer copy.
fn copy_cmd(
    d: &compute::vulkan::ash::Device,
    cb: vk::CommandBuffer,
    src: vk::Buffer,
    dst: vk::Buffer,
    regions: &[vk::BufferCopy],
) {
    // SAFETY: `cb` is recording (called from `Raw::submit`); the regions lie inside both
    // buffers, which outlive the waited-for submission.
    unsafe { d.cmd_copy_buffer(cb, src, dst, regions) }
}

#[kernel(cube_dim = 64)]
fn bench_store(out: &mut [f32]) {
    out[ABSOLUTE_POS] = 1.0f32;
}

fn store_kernel() -> KernelDefinition {
    bench_store::definition().clone()
}

#[kernel(cube_dim = 256)]
fn bench_copy(input: &[[f32; 4]], out: &mut [[f32; 4]]) {
    let i = ABSOLUTE_POS;
    out[i] = input[i];
}

fn copy_kernel() -> KernelDefinition {
    bench_copy::definition().clone()
}

/// Best of `reps` timings of `timed`, each followed by `after` (untimed): seconds.
fn best_of(reps: usize, mut timed: impl FnMut(), mut after: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        timed();
        best = best.min(start.elapsed().as_secs_f64());
        after();
    }
    best
}

fn launch(client: &ComputeClient<VulkanRuntime>, raw: &Raw) -> Res<Vec<Row>> {
    let definition = store_kernel();
    let kernel: VulkanKernel = definition.clone().into();
    let out = client.empty(64 * 4);
    let args = KernelArguments::new().buffer(out.binding());
    // SAFETY: one cube of 64 units stores into a buffer of exactly 64 f32.
    let launch_once = || unsafe {
        client.launch_unchecked(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone())
    };
    let sync = || block_on(client.sync()).expect("sync");
    launch_once();
    sync();
    let iters = 200;
    let latency = best_per_call(5, iters, || {
        launch_once();
        sync();
    });
    let host_iters = 2_000;
    let throughput = best_per_call(3, 1, || {
        for _ in 0..host_iters {
            launch_once();
        }
        sync();
    }) / host_iters as f64;

    let buffer = raw.buffer(64 * 4, false)?;
    let pipe = raw.pipeline(&definition, &[&buffer], 4)?;
    let sync2 = raw.dev.synchronization2();
    raw.run(|d, cb| dispatches(d, sync2, cb, &pipe, 1, 1))?;
    let failed = Failure::default();
    let raw_latency = best_per_call(5, iters, || {
        failed.note(raw.run(|d, cb| dispatches(d, sync2, cb, &pipe, 1, 1)));
    });
    // Host cost: issuing the launches and submitting them; the device's work is waited for
    // outside the timing. Ours and raw alternate, best of many each, so that load from other
    // processes on a shared machine falls on both alike.
    let (mut host, mut raw_host) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..HOST_REPS {
        host = host.min(best_of(
            1,
            || {
                for _ in 0..host_iters {
                    launch_once();
                }
                client.flush().expect("flush");
            },
            sync,
        ));
        raw_host = raw_host.min(best_of(
            1,
            || failed.note(raw.submit(|d, cb| dispatches(d, sync2, cb, &pipe, 1, host_iters))),
            || failed.note(raw.wait()),
        ));
    }
    let host = host / host_iters as f64;
    let raw_host = raw_host / host_iters as f64;
    let raw_throughput = best_per_call(3, 1, || {
        failed.note(raw.run(|d, cb| dispatches(d, sync2, cb, &pipe, 1, host_iters)));
    }) / host_iters as f64;
    raw.drop_pipe(pipe);
    raw.free(buffer);
    failed.check()?;
    let us = 1e6;
    Ok(vec![
        Row::new(
            BACKEND,
            "launch+sync latency (bench_store, 1 cube of 64)",
            latency * us,
            "us",
            "raw ash, same SPIR-V: record 1 dispatch + submit + fence wait",
            raw_latency * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch host cost (bench_store, 2000 launches + flush, wait untimed)",
            host * us,
            "us",
            "raw ash, same SPIR-V: bind pipeline/set/push once, 2000 x (barrier + dispatch) + submit, wait untimed",
            raw_host * us,
            Better::Lower,
        ),
        Row::new(
            BACKEND,
            "launch throughput (bench_store, 2000 launches + sync)",
            throughput * us,
            "us",
            "raw ash, same SPIR-V: 2000 dispatches + submit + fence wait",
            raw_throughput * us,
            Better::Lower,
        ),
    ])
}

/// Copy kernels (and raw copies) per timed wait in the bandwidth rows.
const COPY_REPS: usize = 20;

fn bandwidth(client: &ComputeClient<VulkanRuntime>, raw: &Raw, size: usize) -> Res<Vec<Row>> {
    let mib = size >> 20;
    let gb = |secs: f64, bytes: usize| bytes as f64 / secs / 1e9;
    let src: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    let failed = Failure::default();

    // Copy kernel: ours against the same SPIR-V dispatched raw, and vkCmdCopyBuffer.
    let ours_copy = ours_copy_time(client, Bytes::from_slice(&src));
    let a = raw.buffer(size as u64, false)?;
    let b = raw.buffer(size as u64, false)?;
    let staging = raw.buffer(size as u64, true)?;
    let raw_count = (size / 16).div_ceil(256) as u32;
    let pipe = raw.pipeline(&copy_kernel(), &[&a, &b], 16)?;
    let sync2 = raw.dev.synchronization2();
    let attempt = |r: Res<()>| failed.note(r);
    attempt(raw.run(|d, cb| dispatches(d, sync2, cb, &pipe, raw_count, 1)));
    let raw_kernel = best_per_call(5, 1, || {
        attempt(raw.run(|d, cb| dispatches(d, sync2, cb, &pipe, raw_count, COPY_REPS)))
    }) / COPY_REPS as f64;
    let whole = [vk::BufferCopy {
        src_offset: 0,
        dst_offset: 0,
        size: size as u64,
    }];
    let raw_copy = best_per_call(5, 1, || {
        attempt(raw.run(|d, cb| {
            for _ in 0..COPY_REPS {
                copy_cmd(d, cb, a.buffer, b.buffer, &whole);
            }
        }))
    }) / COPY_REPS as f64;

    // Upload: write + sync against memcpy into a mapped staging buffer + vkCmdCopyBuffer + wait.
    let handle = client.empty(size);
    let mut ours_upload = f64::INFINITY;
    for _ in 0..5 {
        // The host bytes are built outside the timing (a user with a `Vec` hands it over).
        let bytes = Bytes::from_vec(src.clone());
        let start = Instant::now();
        client.write(&handle, bytes);
        block_on(client.sync()).expect("sync");
        ours_upload = ours_upload.min(start.elapsed().as_secs_f64());
    }
    let raw_upload = best_per_call(5, 1, || {
        // SAFETY: the staging mapping holds `size` bytes; no GPU work uses it now.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), staging.ptr, size) };
        attempt(raw.run(|d, cb| copy_cmd(d, cb, staging.buffer, a.buffer, &whole)))
    });

    // Readback: read_one against vkCmdCopyBuffer to a mapped staging buffer + wait + copy out.
    let ours_readback = best_per_call(5, 1, || {
        let bytes = client.read_one(handle.clone()).expect("read");
        assert_eq!(bytes.len(), size);
    });
    let raw_readback = best_per_call(5, 1, || {
        attempt(raw.run(|d, cb| copy_cmd(d, cb, a.buffer, staging.buffer, &whole)));
        // SAFETY: the copy has completed; the mapping holds `size` bytes.
        let out = unsafe { core::slice::from_raw_parts(staging.ptr, size) }.to_vec();
        assert_eq!(out.len(), size);
    });
    raw.drop_pipe(pipe);
    raw.free(a);
    raw.free(b);
    raw.free(staging);
    drop(handle);
    client.memory_cleanup();
    failed.check()?;
    let mut rows = Vec::new();
    // Twice the size, where the device takes it: the figure must hold past 1 GiB.
    let twice = 2 * size;
    let props = client.properties();
    if size >= 1 << 30
        && props.memory.max_page_size as usize >= twice
        && props
            .memory_total
            .is_some_and(|total| total as usize >= 4 * twice)
    {
        progress(&format!("vulkan copy kernel at {} MiB", twice >> 20));
        let big = ours_copy_time(client, Bytes::zeroed(twice));
        client.memory_cleanup();
        rows.push(Row::new(
            BACKEND,
            &format!(
                "copy kernel {} MiB f32x4 (read+write) vs ours at {mib} MiB",
                twice >> 20
            ),
            gb(big, 2 * twice),
            "GB/s",
            &format!("ours at {mib} MiB, same run"),
            gb(ours_copy, 2 * size),
            Better::Higher,
        ));
    }
    rows.extend([
        Row::new(
            BACKEND,
            &format!("copy kernel {mib} MiB f32x4 (read+write), same kernel raw"),
            gb(ours_copy, 2 * size),
            "GB/s",
            &format!(
                "raw ash, same SPIR-V: {COPY_REPS} dispatches of {mib} MiB (barriers between) + submit + fence wait"
            ),
            gb(raw_kernel, 2 * size),
            Better::Higher,
        ),
        Row::new(
            BACKEND,
            &format!("copy kernel {mib} MiB f32x4 (read+write)"),
            gb(ours_copy, 2 * size),
            "GB/s",
            &format!("raw ash {COPY_REPS} x vkCmdCopyBuffer {mib} MiB + submit + fence wait"),
            gb(raw_copy, 2 * size),
            Better::Higher,
        ),
        Row::new(
            BACKEND,
            &format!("upload {mib} MiB (write + sync)"),
            gb(ours_upload, size),
            "GB/s",
            &format!("raw ash memcpy to mapped staging + vkCmdCopyBuffer {mib} MiB + fence wait"),
            gb(raw_upload, size),
            Better::Higher,
        ),
        Row::new(
            BACKEND,
            &format!("readback {mib} MiB (read_one)"),
            gb(ours_readback, size),
            "GB/s",
            &format!("raw ash vkCmdCopyBuffer {mib} MiB to mapped staging + fence wait + copy out"),
            gb(raw_readback, size),
            Better::Higher,
        ),
    ]);
    Ok(rows)
}

/// Seconds per copy of our copy kernel over `src` (f32x4, read + write).
fn ours_copy_time(client: &ComputeClient<VulkanRuntime>, src: Bytes) -> f64 {
    let kernel: VulkanKernel = copy_kernel().into();
    super::timing::copy_kernel_time(client, kernel, src, COPY_REPS)
}
