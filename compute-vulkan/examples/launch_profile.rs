//! Where the host time of a launch goes, 2000 launches of one cube each, in microseconds per
//! launch (best of `REPS` runs): the backend's enqueue loop and flush, then raw ash variants of
//! the same SPIR-V that each change one thing of the bench's raw baseline (barrier flags,
//! rebinding, command pool reset, timeline-semaphore submit, several submissions), so that a gap
//! between the runtime and the baseline can be traced to the driver call that causes it.
//!
//! `REPS=200 cargo run --release -p compute-vulkan --example launch_profile`

use std::time::Instant;

use ash::vk;
use compute_core::kernel::{KernelBuilder, KernelDefinition};
use compute_core::{ComputeClient, CubeCount, ElemType, KernelArguments, block_on};
use compute_vulkan::{RawDevice, VulkanDevice, VulkanKernel, VulkanRuntime, ash};

const LAUNCHES: usize = 2000;

type Res<T> = Result<T, String>;

fn store_kernel() -> KernelDefinition {
    let mut k = KernelBuilder::new("bench_store", [64, 1, 1]);
    let out = k.output("out", ElemType::F32, 1);
    let i = k.absolute_pos();
    k.store(out, i, 1.0f32);
    k.build().expect("store kernel")
}

fn ours(reps: usize) {
    let kernel: VulkanKernel = store_kernel().into();
    let client = ComputeClient::<VulkanRuntime>::load(&VulkanDevice::default());
    let out = client.empty(64 * 4);
    let args = KernelArguments::new().buffer(out.binding());
    let (mut enqueue, mut flush) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        let start = Instant::now();
        for _ in 0..LAUNCHES {
            // SAFETY: one cube of 64 units stores into a buffer of exactly 64 f32.
            unsafe {
                client.launch_unchecked(kernel.clone(), CubeCount::Static(1, 1, 1), args.clone())
            };
        }
        let enqueued = start.elapsed().as_secs_f64();
        client.flush().expect("flush");
        let flushed = start.elapsed().as_secs_f64();
        enqueue = enqueue.min(enqueued);
        flush = flush.min(flushed - enqueued);
        block_on(client.sync()).expect("sync");
    }
    let us = 1e6 / LAUNCHES as f64;
    println!(
        "compute-vulkan: enqueue {:.3}  flush {:.3}  total {:.3} us/launch",
        enqueue * us,
        flush * us,
        (enqueue + flush) * us
    );
}

/// What one raw variant changes from the bench's baseline.
#[derive(Clone, Copy, Default)]
struct Variant {
    /// A barrier on every stage the runtime uses (compute, transfer, indirect), as the runtime
    /// records where it cannot see the neighbouring commands, instead of compute only.
    wide_barrier: bool,
    /// Rebind pipeline and set before every dispatch.
    rebind: bool,
    /// A transient pool reset with vkResetCommandPool before recording.
    pool_reset: bool,
    /// Signal a timeline semaphore instead of a fence.
    timeline: bool,
    /// Split into submissions of 64, 128, ... dispatches, each its own pool.
    growing_batches: bool,
}

struct Raw {
    dev: RawDevice,
    pipeline: vk::Pipeline,
    layout: vk::PipelineLayout,
    set: vk::DescriptorSet,
    push: Vec<u8>,
    /// Command buffers per variant (each frees only what it recorded itself).
    cmds: Vec<Vec<(vk::CommandPool, vk::CommandBuffer)>>,
    fence: vk::Fence,
    timeline: vk::Semaphore,
    value: u64,
}

fn vkr(what: &'static str) -> impl Fn(vk::Result) -> String {
    move |e| format!("{what}: {e}")
}

impl Raw {
    fn new() -> Res<Self> {
        let dev = RawDevice::new(VulkanDevice::default()).map_err(|e| e.to_string())?;
        let compiled = compute_vulkan::spirv::compile(&store_kernel(), &dev.caps(), false)
            .map_err(|e| e.to_string())?;
        if compiled.uses_info {
            return Err("the store kernel unexpectedly reads launch info".into());
        }
        // The argument words: buffer 0 at element 0, 64 elements long.
        let mut words = vec![0u32; compiled.args.words as usize];
        words[compiled.args.buffer_words[0] as usize + 1] = 64;
        let mut push: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        push.resize(compiled.push_constant_bytes as usize, 0);
        let d = dev.device();
        // SAFETY: raw object creation with valid create infos on a device only this thread uses.
        unsafe {
            let buffer = d
                .create_buffer(
                    &vk::BufferCreateInfo::default()
                        .size(256)
                        .usage(vk::BufferUsageFlags::STORAGE_BUFFER),
                    None,
                )
                .map_err(vkr("create_buffer"))?;
            let req = d.get_buffer_memory_requirements(buffer);
            let memory = d
                .allocate_memory(
                    &vk::MemoryAllocateInfo::default()
                        .allocation_size(req.size)
                        .memory_type_index(dev.storage_memory_type()),
                    None,
                )
                .map_err(vkr("allocate_memory"))?;
            d.bind_buffer_memory(buffer, memory, 0)
                .map_err(vkr("bind_buffer_memory"))?;
            let binding = [vk::DescriptorSetLayoutBinding::default()
                .binding(0)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)];
            let set_layout = d
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&binding),
                    None,
                )
                .map_err(vkr("create_descriptor_set_layout"))?;
            let set_layouts = [set_layout];
            let ranges = [vk::PushConstantRange::default()
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
                .size(push.len() as u32)];
            let layout = d
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default()
                        .set_layouts(&set_layouts)
                        .push_constant_ranges(if push.is_empty() { &[] } else { &ranges }),
                    None,
                )
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
            let sizes = [vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(1)];
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
            let info = [vk::DescriptorBufferInfo::default()
                .buffer(buffer)
                .range(vk::WHOLE_SIZE)];
            d.update_descriptor_sets(
                &[vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(0)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(&info)],
                &[],
            );
            let fence = d
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .map_err(vkr("create_fence"))?;
            let mut kind = vk::SemaphoreTypeCreateInfo::default()
                .semaphore_type(vk::SemaphoreType::TIMELINE)
                .initial_value(0);
            let timeline = d
                .create_semaphore(
                    &vk::SemaphoreCreateInfo::default().push_next(&mut kind),
                    None,
                )
                .map_err(vkr("create_semaphore"))?;
            Ok(Self {
                dev,
                pipeline,
                layout,
                set,
                push,
                cmds: Vec::new(),
                fence,
                timeline,
                value: 0,
            })
        }
    }

    /// The `k`-th command buffer (created on first use, in a transient pool when asked).
    fn cmd(
        &mut self,
        variant: usize,
        k: usize,
        transient: bool,
    ) -> Res<(vk::CommandPool, vk::CommandBuffer)> {
        while self.cmds.len() <= variant {
            self.cmds.push(Vec::new());
        }
        while self.cmds[variant].len() <= k {
            let d = self.dev.device();
            let flags = if transient {
                vk::CommandPoolCreateFlags::TRANSIENT
            } else {
                vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER
            };
            // SAFETY: valid create infos.
            unsafe {
                let pool = d
                    .create_command_pool(
                        &vk::CommandPoolCreateInfo::default()
                            .flags(flags)
                            .queue_family_index(self.dev.family()),
                        None,
                    )
                    .map_err(vkr("create_command_pool"))?;
                let cb = d
                    .allocate_command_buffers(
                        &vk::CommandBufferAllocateInfo::default()
                            .command_pool(pool)
                            .level(vk::CommandBufferLevel::PRIMARY)
                            .command_buffer_count(1),
                    )
                    .map_err(vkr("allocate_command_buffers"))?[0];
                self.cmds[variant].push((pool, cb));
            }
        }
        Ok(self.cmds[variant][k])
    }

    /// Record and submit `LAUNCHES` dispatches as `v` says (timed by the caller), then wait.
    fn issue(&mut self, variant: usize, v: Variant) -> Res<()> {
        let sizes: Vec<usize> = if v.growing_batches {
            let mut left = LAUNCHES;
            let mut size = 64;
            let mut out = Vec::new();
            while left > 0 {
                out.push(size.min(left));
                left -= size.min(left);
                size = (size * 2).min(2048);
            }
            out
        } else {
            vec![LAUNCHES]
        };
        let transient = v.pool_reset || v.growing_batches;
        for (k, &n) in sizes.iter().enumerate() {
            let (pool, cb) = self.cmd(variant, k, transient)?;
            let d = self.dev.device();
            // SAFETY: the command buffer is not pending (every issue is waited for before the
            // next); pipeline, layout and set are alive; the queue is this thread's only.
            unsafe {
                if transient {
                    d.reset_command_pool(pool, vk::CommandPoolResetFlags::empty())
                        .map_err(vkr("reset_command_pool"))?;
                }
                d.begin_command_buffer(
                    cb,
                    &vk::CommandBufferBeginInfo::default()
                        .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                )
                .map_err(vkr("begin_command_buffer"))?;
                record(d, self, cb, n, v);
                d.end_command_buffer(cb)
                    .map_err(vkr("end_command_buffer"))?;
                let cbs = [cb];
                let last = k + 1 == sizes.len();
                if v.timeline {
                    self.value += 1;
                    let values = [self.value];
                    let sems = [self.timeline];
                    let mut t =
                        vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
                    let submit = vk::SubmitInfo::default()
                        .command_buffers(&cbs)
                        .signal_semaphores(&sems)
                        .push_next(&mut t);
                    d.queue_submit(self.dev.queue(), &[submit], vk::Fence::null())
                        .map_err(vkr("queue_submit"))?;
                } else {
                    let fence = if last { self.fence } else { vk::Fence::null() };
                    let submit = vk::SubmitInfo::default().command_buffers(&cbs);
                    d.queue_submit(self.dev.queue(), &[submit], fence)
                        .map_err(vkr("queue_submit"))?;
                }
            }
        }
        Ok(())
    }

    fn wait(&self, v: Variant) -> Res<()> {
        let d = self.dev.device();
        // SAFETY: waits on this device's own fence / timeline semaphore.
        unsafe {
            if v.timeline {
                let sems = [self.timeline];
                let values = [self.value];
                d.wait_semaphores(
                    &vk::SemaphoreWaitInfo::default()
                        .semaphores(&sems)
                        .values(&values),
                    u64::MAX,
                )
                .map_err(vkr("wait_semaphores"))
            } else {
                d.wait_for_fences(&[self.fence], true, u64::MAX)
                    .map_err(vkr("wait_for_fences"))?;
                d.reset_fences(&[self.fence]).map_err(vkr("reset_fences"))
            }
        }
    }
}

/// `n` dispatches with a barrier between consecutive ones, as `v` says.
fn record(d: &ash::Device, raw: &Raw, cb: vk::CommandBuffer, n: usize, v: Variant) {
    let (src_stage, dst_stage, dst_access) = if v.wide_barrier {
        (
            vk::PipelineStageFlags2::COMPUTE_SHADER | vk::PipelineStageFlags2::TRANSFER,
            vk::PipelineStageFlags2::COMPUTE_SHADER
                | vk::PipelineStageFlags2::TRANSFER
                | vk::PipelineStageFlags2::DRAW_INDIRECT,
            vk::AccessFlags2::INDIRECT_COMMAND_READ,
        )
    } else {
        (
            vk::PipelineStageFlags2::COMPUTE_SHADER,
            vk::PipelineStageFlags2::COMPUTE_SHADER,
            vk::AccessFlags2::empty(),
        )
    };
    let b2 = [vk::MemoryBarrier2::default()
        .src_stage_mask(src_stage)
        .src_access_mask(vk::AccessFlags2::SHADER_WRITE | vk::AccessFlags2::TRANSFER_WRITE)
        .dst_stage_mask(dst_stage)
        .dst_access_mask(
            vk::AccessFlags2::SHADER_READ
                | vk::AccessFlags2::SHADER_WRITE
                | vk::AccessFlags2::TRANSFER_READ
                | vk::AccessFlags2::TRANSFER_WRITE
                | dst_access,
        )];
    let dependency = vk::DependencyInfo::default().memory_barriers(&b2);
    let b1 = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE)
        .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
    let bind = || {
        // SAFETY: `cb` is recording; pipeline, layout and set are alive.
        unsafe {
            d.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, raw.pipeline);
            d.cmd_bind_descriptor_sets(
                cb,
                vk::PipelineBindPoint::COMPUTE,
                raw.layout,
                0,
                &[raw.set],
                &[],
            );
            if !raw.push.is_empty() {
                d.cmd_push_constants(cb, raw.layout, vk::ShaderStageFlags::COMPUTE, 0, &raw.push);
            }
        }
    };
    bind();
    for i in 0..n {
        // SAFETY: as above.
        unsafe {
            if i > 0 {
                if raw.dev.synchronization2() {
                    d.cmd_pipeline_barrier2(cb, &dependency);
                } else {
                    d.cmd_pipeline_barrier(
                        cb,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::DependencyFlags::empty(),
                        &b1,
                        &[],
                        &[],
                    );
                }
                if v.rebind {
                    bind();
                }
            }
            d.cmd_dispatch(cb, 1, 1, 1);
        }
    }
}

fn raw(reps: usize) -> Res<()> {
    let mut raw = Raw::new()?;
    let base = Variant::default();
    let variants = [
        ("raw ash (bench baseline)", base),
        (
            "  + barrier on every stage",
            Variant {
                wide_barrier: true,
                ..base
            },
        ),
        (
            "  + rebind every dispatch",
            Variant {
                rebind: true,
                ..base
            },
        ),
        (
            "  + transient pool reset",
            Variant {
                pool_reset: true,
                ..base
            },
        ),
        (
            "  + timeline semaphore",
            Variant {
                timeline: true,
                ..base
            },
        ),
        (
            "  + growing batches",
            Variant {
                growing_batches: true,
                ..base
            },
        ),
        (
            "  all of the runtime's choices",
            Variant {
                wide_barrier: false,
                rebind: false,
                pool_reset: true,
                timeline: true,
                growing_batches: true,
            },
        ),
    ];
    let us = 1e6 / LAUNCHES as f64;
    let mut best = vec![f64::INFINITY; variants.len()];
    // Interleaved, so that load from other processes falls on every variant alike.
    for _ in 0..reps {
        for (k, (_, v)) in variants.iter().enumerate() {
            let start = Instant::now();
            raw.issue(k, *v)?;
            best[k] = best[k].min(start.elapsed().as_secs_f64());
            raw.wait(*v)?;
        }
    }
    for ((name, _), t) in variants.iter().zip(best) {
        println!("{name:32} total {:.3} us/launch", t * us);
    }
    Ok(())
}

fn main() {
    if let Err(reason) = compute_vulkan::availability() {
        eprintln!("launch_profile: vulkan unavailable: {reason}");
        return;
    }
    let reps = std::env::var("REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(50usize);
    ours(reps);
    if std::env::var_os("OURS_ONLY").is_none()
        && let Err(e) = raw(reps)
    {
        eprintln!("launch_profile: raw ash: {e}");
    }
}
