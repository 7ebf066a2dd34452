//! Kernel launches: the argument checks, the argument words and descriptor ranges of each buffer
//! binding, and the dispatch recorded into the open batch (or into the running capture), with
//! cached descriptor sets or push descriptors; with them, the other [`ComputeServer`] core calls
//! (`get_resource`, flush, sync).

use std::sync::Arc;

use ash::vk;
use compute_core::backend::ServerKit;
use compute_core::backend::bind::{BindLimits, push_layout_words, write_scalar_words};
use compute_core::future::DynFut;
use compute_core::handle::BufferArgument;
use compute_core::{
    Binding, ComputeServer, CubeCount, ExecutionMode, KernelLaunch, ServerError, StreamId,
};

use crate::batch::stage;
use crate::compiler::pipeline::Pipeline;
use crate::guard::guard_error;
use crate::kernel::VulkanKernel;
use crate::ops::Rec;
use crate::server::{VulkanInfo, VulkanServer, ready};
use crate::storage::{VulkanResource, VulkanStorage};

fn words_as_bytes(words: &[u32]) -> &[u8] {
    bytemuck::cast_slice(words)
}

impl VulkanServer {
    /// The descriptor range a launch binds for a buffer argument, its offset in items and its
    /// length in items.
    fn bind(
        &self,
        resource: VulkanResource,
        item: u64,
        name: &str,
    ) -> Result<(vk::DescriptorBufferInfo, u32, u32), ServerError> {
        // minStorageBufferOffsetAlignment is a power of two (spec), item sizes nearly always
        // are: `bind` masks and shifts on the launch path.
        let limits = BindLimits {
            align: self.bind_align,
            max: u64::from(self.ctx.limits().max_storage_buffer_range),
            limit: "maxStorageBufferRange",
        };
        let range = limits.bind(
            name,
            (resource.offset, resource.size, resource.block_size),
            item,
        )?;
        Ok((
            vk::DescriptorBufferInfo::default()
                .buffer(resource.buffer)
                .offset(range.offset)
                .range(range.size),
            range.base,
            range.len,
        ))
    }

    /// Record (or capture) one dispatch.
    #[allow(clippy::too_many_arguments)]
    fn record_dispatch(
        &mut self,
        stream: StreamId,
        pipeline: &Arc<Pipeline>,
        descriptors: &[vk::DescriptorBufferInfo],
        push: &[u32],
        info: Option<&[u32]>,
        count: DispatchCount,
        keep: Vec<Binding>,
    ) -> Result<(), ServerError> {
        let ctx = &self.ctx;
        if self.descriptors_cache.is_full() {
            let pools = self.descriptors_cache.clear();
            self.recorder.keep_until_done(pools);
        }
        let capture = if self.captures > 0 {
            self.streams
                .get_mut(stream)
                .and_then(|state| state.capture.as_mut())
        } else {
            None
        };
        let (mut rec, linear, graph_keep) = match capture {
            Some(capture) => {
                let count_range = match count {
                    DispatchCount::Dynamic { buffer, offset } => Some((buffer, offset, 12)),
                    DispatchCount::Static(_) => None,
                };
                capture.barrier_for(
                    descriptors
                        .iter()
                        .map(|d| (d.buffer, d.offset, d.range))
                        .chain(count_range),
                );
                capture.keep.push(Box::new(pipeline.clone()));
                capture.keep.push(Box::new(keep));
                (
                    Rec(&mut capture.ops),
                    &mut capture.linear,
                    Some(&mut capture.keep),
                )
            }
            None => {
                self.recorder.barrier_for(count.stages());
                self.recorder.dispatches += 1;
                (Rec(&mut self.recorder.ops), &mut self.recorder.linear, None)
            }
        };
        let push_bytes = pipeline.push_constant_bytes as usize;
        let mut push_stack = [0u8; 256];
        let mut push_heap = Vec::new();
        let push_block = push_block(push, push_bytes, &mut push_stack, &mut push_heap);
        if !pipeline.push_descriptors {
            let mut ranges = core::mem::take(&mut self.ranges);
            ranges.clear();
            ranges.extend(descriptors.iter().map(|d| (d.buffer, d.offset, d.range)));
            let found =
                self.descriptors_cache
                    .get(pipeline.id, pipeline.set_layout_handle, &ranges);
            self.ranges = ranges;
            let (set, pool) = found?;
            let tracked = graph_keep.is_none();
            if let Some(keep) = graph_keep {
                // A graph outlives cache clears: it keeps the pool of its sets.
                keep.push(Box::new(pool.clone()));
            }
            // Graph captures record into their own list, replayed after any command: no state
            // tracking there.
            // The pipeline, the set (its pool is kept until the work completes) and every bound
            // buffer are alive until the commands completed; skipped binds are already bound in
            // the command buffer (same pipeline, hence same layout).
            let bound = &mut self.recorder.bound;
            let same_pipeline = tracked && bound.pipeline == pipeline.pipeline;
            let same_set = same_pipeline && bound.set == set;
            let same_push = same_pipeline && bound.push.as_slice() == push_block;
            if !same_pipeline {
                rec.bind_pipeline(pipeline.pipeline);
            }
            if !descriptors.is_empty() && !same_set {
                rec.bind_set(pipeline.layout, set);
            }
            if !push_block.is_empty() && !same_push {
                rec.push_constants(pipeline.layout, push_block);
            }
            record_count(&mut rec, count);
            if tracked {
                bound.pipeline = pipeline.pipeline;
                bound.set = set;
                if !same_push {
                    bound.push.clear();
                    bound.push.extend_from_slice(push_block);
                }
            }
            return Ok(());
        }
        if graph_keep.is_none() {
            self.recorder.bound.forget();
        }
        let info_descriptor = match info {
            Some(words) => {
                let (buffer, offset) = linear.push(ctx, words_as_bytes(words), self.bind_align)?;
                Some(
                    vk::DescriptorBufferInfo::default()
                        .buffer(buffer)
                        .offset(offset)
                        .range((words.len() as u64 * 4).max(4)),
                )
            }
            None => None,
        };
        // Launches with few buffers (nearly all) build their writes on the stack.
        const STACK_WRITES: usize = 16;
        let total = descriptors.len() + usize::from(info_descriptor.is_some());
        let mut bindings = [0u32; STACK_WRITES];
        let mut infos = [vk::DescriptorBufferInfo::default(); STACK_WRITES];
        let (mut heap_bindings, mut heap_infos) = (Vec::new(), Vec::new());
        let (bindings, infos): (&mut [u32], &mut [vk::DescriptorBufferInfo]) =
            if total <= STACK_WRITES {
                (&mut bindings[..total], &mut infos[..total])
            } else {
                heap_bindings.resize(total, 0);
                heap_infos.resize(total, vk::DescriptorBufferInfo::default());
                (&mut heap_bindings, &mut heap_infos)
            };
        for (k, d) in descriptors.iter().enumerate() {
            bindings[k] = k as u32;
            infos[k] = *d;
        }
        if let Some(d) = info_descriptor {
            bindings[descriptors.len()] = pipeline.info_binding;
            infos[descriptors.len()] = d;
        }
        // The pipeline, its layout and every bound buffer are alive until the commands completed
        // (pipelines are cached, blocks are freed late).
        rec.bind_pipeline(pipeline.pipeline);
        if !bindings.is_empty() {
            rec.push_descriptors(pipeline.layout, bindings, infos);
        }
        if !push_block.is_empty() {
            rec.push_constants(pipeline.layout, push_block);
        }
        record_count(&mut rec, count);
        Ok(())
    }
}

/// The push-constant block: the argument words padded to the pipeline's block size, on the
/// stack when it fits.
fn push_block<'a>(
    push: &'a [u32],
    bytes: usize,
    stack: &'a mut [u8; 256],
    heap: &'a mut Vec<u8>,
) -> &'a [u8] {
    if bytes == 0 {
        return &[];
    }
    let src = words_as_bytes(push);
    let dst: &mut [u8] = if bytes <= stack.len() {
        &mut stack[..bytes]
    } else {
        heap.resize(bytes, 0);
        heap
    };
    let n = src.len().min(bytes);
    dst[..n].copy_from_slice(&src[..n]);
    dst
}

/// Record the dispatch itself (after the pipeline and its descriptors).
fn record_count(rec: &mut Rec<'_>, count: DispatchCount) {
    match count {
        DispatchCount::Static(xyz) => rec.dispatch(xyz),
        DispatchCount::Dynamic { buffer, offset } => rec.dispatch_indirect(buffer, offset),
    }
}

#[derive(Clone, Copy)]
enum DispatchCount {
    Static([u32; 3]),
    Dynamic { buffer: vk::Buffer, offset: u64 },
}

impl DispatchCount {
    /// The stages the dispatch runs in (a dynamic count is read by the indirect stage first).
    fn stages(self) -> u8 {
        match self {
            DispatchCount::Static(_) => stage::COMPUTE,
            DispatchCount::Dynamic { .. } => stage::COMPUTE | stage::INDIRECT,
        }
    }
}

impl ComputeServer for VulkanServer {
    type Kernel = VulkanKernel;
    type Storage = VulkanStorage;
    type Info = VulkanInfo;

    fn info(&self) -> VulkanInfo {
        self.info.clone()
    }

    /// [`ComputeServer::get_resource`](compute_core::ComputeServer::get_resource).
    fn get_resource(
        &mut self,
        binding: Binding,
        _stream: StreamId,
    ) -> Result<VulkanResource, ServerError> {
        let resource = self.resolve(&binding)?;
        let value = self.submit_or_last()?;
        self.ctx.wait(value)?;
        Ok(resource)
    }

    /// [`ComputeServer::launch`](compute_core::ComputeServer::launch).
    ///
    /// # Safety
    /// As [`ComputeServer::launch`](compute_core::ComputeServer::launch).
    unsafe fn launch(
        &mut self,
        launch: KernelLaunch<VulkanKernel>,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        // Owners are checked by `resolve`, binding by binding.
        launch.check(&self.properties.hardware)?;
        let (kernel, count, arguments, mode) = launch.into_parts();
        // A dynamic count is dispatched through the guard: over the limits, nothing runs and
        // the next sync reports it.
        let count = match count {
            CubeCount::Dynamic(binding) => CubeCount::Dynamic(self.guard_count(binding, stream)?),
            other => other,
        };
        let mut keep: Vec<Binding> = Vec::new();
        let capturing = self.captures > 0 && self.capturing(stream);
        let (count, empty) = match count {
            CubeCount::Static(x, y, z) => {
                (DispatchCount::Static([x, y, z]), x == 0 || y == 0 || z == 0)
            }
            CubeCount::Dynamic(binding) => {
                let resource = self.resolve(&binding)?;
                if capturing {
                    keep.push(binding);
                }
                (
                    DispatchCount::Dynamic {
                        buffer: resource.buffer,
                        offset: resource.offset,
                    },
                    false,
                )
            }
        };
        let checked = mode == ExecutionMode::Checked;
        let pipeline = self.pipeline(&kernel, checked)?;
        let args = &pipeline.args;
        let mut words = core::mem::take(&mut self.words);
        words.clear();
        words.resize(args.words as usize, 0);
        write_scalar_words(&mut words, 0, &arguments.scalars, &args.scalar_words);
        let mut descriptors = core::mem::take(&mut self.descriptors);
        descriptors.clear();
        let mut info = core::mem::take(&mut self.info_words);
        info.clear();
        if pipeline.uses_info {
            let header = args.info_header_word as usize;
            info.resize(header + 2 * arguments.buffers.len(), 0);
        }
        for (
            k,
            BufferArgument {
                binding,
                shape,
                strides,
            },
        ) in arguments.buffers.into_iter().enumerate()
        {
            let resource = self.resolve(&binding)?;
            let (descriptor, base, len) =
                self.bind(resource, pipeline.item_sizes[k], &pipeline.name)?;
            let at = args.buffer_words[k] as usize;
            words[at] = base;
            words[at + 1] = len;
            if pipeline.uses_info {
                let header = args.info_header_word as usize + 2 * k;
                info[header] = shape.rank() as u32;
                info[header + 1] = info.len() as u32;
                push_layout_words(&mut info, &shape, &strides);
            }
            descriptors.push(descriptor);
            if capturing {
                keep.push(binding);
            }
        }
        if pipeline.uses_info && !args.in_push_constants {
            info[..words.len()].copy_from_slice(&words);
        }
        let result = if empty {
            Ok(())
        } else {
            let push: &[u32] = if args.in_push_constants { &words } else { &[] };
            let info_ref = pipeline.uses_info.then_some(info.as_slice());
            self.record_dispatch(stream, &pipeline, &descriptors, push, info_ref, count, keep)
        };
        self.words = words;
        self.info_words = info;
        self.descriptors = descriptors;
        result?;
        if !capturing {
            self.after_command()?;
        }
        Ok(())
    }

    fn flush(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.submit()?;
        self.cache.maybe_save();
        self.take_error(stream)
    }

    fn sync(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        if let Err(e) = self.ensure_not_capturing(stream, "sync") {
            return ready(Err(e));
        }
        let guard = self.read_guard_status(stream);
        let value = match self.submit_or_last() {
            Ok(v) => v,
            Err(e) => return ready(Err(e)),
        };
        self.reset_batch_limit();
        self.cache.maybe_save();
        let ctx = self.ctx.clone();
        let (errors, stream_errors) = (self.errors.clone(), self.stream_errors.clone());
        let maximum = self.properties.hardware.max_cube_count;
        Box::pin(async move {
            ctx.wait(value)?;
            if let Some((read, streams)) = guard {
                match read.await {
                    Ok(bytes) => {
                        if let Some(e) = guard_error(&bytes, maximum) {
                            stream_errors.push(&streams, &e);
                        }
                    }
                    // An error queued before, taken by the status read: this sync's.
                    Err(e) => return Err(e),
                }
            }
            stream_errors.take(stream)?;
            compute_core::error::take_result(&mut errors.lock())
        })
    }
}
