//! Kernel launches: the pipeline cache (IR compiled to WGSL, one pipeline per kernel and
//! bounds-check mode), the bindings and launch info of a launch, the launch checks, and the guard
//! of indirect launches (a dynamic cube count over the device's limits, recorded on the device
//! and read back by the next sync or read); with them, the other [`ComputeServer`] core calls
//! (`get_resource`, flush, sync).

use std::sync::Arc;

use compute_core::backend::ServerKit;
use compute_core::backend::bind::{BindLimits, push_layout_words, write_scalar_words};
use compute_core::future::DynFut;
use compute_core::handle::BufferArgument;
use compute_core::{
    Binding, ComputeServer, CubeCount, ExecutionMode, KernelArguments, KernelLaunch, ServerError,
    StreamId,
};

use crate::batch::{BoundBuffer, Command, Dispatch, DispatchCount, GUARD_STATUS_BYTES, Pipeline};
use crate::compiler::{self, HEADER_WORDS};
use crate::kernel::WgpuKernel;
use crate::poller::gone;
use crate::server::{WgpuInfo, WgpuServer};
use crate::storage::{WgpuResource, WgpuStorage};
use crate::transfer::Staging;

/// The error of the over-limit count the guard recorded in `staging` (a copy of its status,
/// mapped by `mapped`), if it recorded one.
pub(crate) async fn guard_error(
    staging: Staging,
    mapped: compute_core::future::Receiver<Result<(), wgpu::BufferAsyncError>>,
    maximum: [u32; 3],
) -> Result<Option<ServerError>, ServerError> {
    mapped
        .await
        .ok_or_else(gone)?
        .map_err(|e| ServerError::Driver(format!("mapping the indirect guard status: {e}")))?;
    let status: [u32; 4] = {
        let view = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| ServerError::Driver(format!("reading the indirect guard status: {e}")))?;
        bytemuck::pod_read_unaligned(&view[..16])
    };
    staging.unmap();
    Ok((status[0] != 0).then(|| {
        compute_core::error::LaunchError::CubeCountTooLarge {
            count: [status[1], status[2], status[3]],
            maximum,
        }
        .into()
    }))
}

/// A copy of the guard status being read back, and the streams whose indirect launches it
/// covers.
pub(crate) struct GuardRead {
    staging: Staging,
    mapped: compute_core::future::Receiver<Result<(), wgpu::BufferAsyncError>>,
    streams: Vec<StreamId>,
}

impl GuardRead {
    /// Map the staged copy (after the submission that fills it).
    pub(crate) fn map((staging, streams): (Staging, Vec<StreamId>)) -> Self {
        let mapped = crate::transfer::map_read(&staging);
        GuardRead {
            staging,
            mapped,
            streams,
        }
    }

    /// Once the batch completed: the over-limit error the guard recorded, if any, kept for each
    /// stream whose indirect launches the copy covers (its next flush, sync or read reports it),
    /// not for whichever stream happened to read the status.
    pub(crate) async fn deliver(
        self,
        maximum: [u32; 3],
        errors: &compute_core::backend::StreamErrors,
    ) -> Result<(), ServerError> {
        if let Some(e) = guard_error(self.staging, self.mapped, maximum).await? {
            errors.push(&self.streams, &e);
        }
        Ok(())
    }
}

impl WgpuServer {
    /// When an indirect launch was recorded since the last look: record a copy of the guard's
    /// status into a readback buffer and clear it, to be read once the batch completed (see
    /// [`guard_error`]).
    pub(crate) fn stage_guard_status(&mut self) -> Option<(Staging, Vec<StreamId>)> {
        if self.guard_streams.is_empty() {
            return None;
        }
        let streams = self.guard_streams.take();
        let staging =
            self.readback_buffer("compute-wgpu guard status readback", GUARD_STATUS_BYTES);
        self.push(Command::Copy {
            src: self.guard_status.clone(),
            src_offset: 0,
            dst: staging.buffer().clone(),
            dst_offset: 0,
            size: GUARD_STATUS_BYTES,
        });
        self.push(Command::Clear {
            buffer: self.guard_status.clone(),
            offset: 0,
            size: GUARD_STATUS_BYTES,
        });
        Some((staging, streams))
    }

    pub(crate) fn pipeline(
        &mut self,
        kernel: &WgpuKernel,
        checked: bool,
    ) -> Result<Arc<Pipeline>, ServerError> {
        if let Some(found) = self.pipelines.get(kernel.id(), checked) {
            return Ok(found);
        }
        let def = kernel.definition();
        def.validate(&self.streams.properties().hardware)?;
        let compiled = compiler::compile(def, self.caps, checked)?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(def.name()),
                source: wgpu::ShaderSource::Wgsl(compiled.source.as_str().into()),
            });
        let count = def.buffers().len() as u32;
        let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..=count)
            .map(|binding| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage {
                        read_only: binding == count,
                    },
                    // The launch info sits in one buffer shared by every launch.
                    has_dynamic_offset: binding == count,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let layout = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(def.name()),
                entries: &entries,
            });
        let pipeline_layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(def.name()),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(def.name()),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions::default(),
                cache: None,
            });
        if let Some(error) = compute_core::block_on(scope.pop()) {
            return Err(ServerError::Compilation(format!(
                "kernel `{}` on wgpu: {error}\n--- generated WGSL ---\n{}",
                def.name(),
                compiled.source
            )));
        }
        let id = self.next_pipeline;
        self.next_pipeline += 1;
        let pipeline = Arc::new(Pipeline {
            id,
            name: def.name().to_string(),
            pipeline,
            layout,
            info: compiled.info,
            item_sizes: compiled.buffer_item_sizes,
        });
        self.pipelines
            .insert(kernel.id(), checked, pipeline.clone());
        Ok(pipeline)
    }

    /// The range a launch binds for a buffer argument, and its header words.
    pub(crate) fn bind(
        &self,
        resource: WgpuResource,
        item: u64,
        name: &str,
    ) -> Result<(BoundBuffer, u32, u32), ServerError> {
        // Both are powers of two (WebGPU's offset alignment, items of 1-8 byte elements times
        // 1-16 components): `bind` masks and shifts, no division on the launch path. Offsets
        // are aligned to at least a word, so the buffer's whole words are what may be bound.
        let limits = BindLimits {
            align: u64::from(self.info.limits.min_storage_buffer_offset_alignment).max(4),
            max: self.info.limits.max_storage_buffer_binding_size,
            limit: "max_storage_buffer_binding_size",
        };
        let block = resource.buffer.size() / 4 * 4;
        let range = limits.bind(name, (resource.offset, resource.size, block), item)?;
        Ok((
            BoundBuffer {
                buffer: resource.buffer,
                offset: range.offset,
                size: range.size,
            },
            range.base,
            range.len,
        ))
    }

    /// Append the info words and bound buffers of a launch of `pipeline` to the batch's arenas;
    /// the bindings go to `keep`, if given.
    pub(crate) fn build_launch(
        &mut self,
        def: &compute_core::kernel::KernelDefinition,
        pipeline: &Pipeline,
        arguments: KernelArguments,
        mut keep: Option<&mut Vec<Binding>>,
    ) -> Result<(), ServerError> {
        let layout = &pipeline.info;
        let start = self.batch.words.len();
        self.batch
            .words
            .resize(start + layout.fixed_words as usize, 0u32);
        write_scalar_words(
            &mut self.batch.words,
            start,
            &arguments.scalars,
            &layout.scalar_offsets,
        );
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
            let (bound, base, len) = self.bind(resource, pipeline.item_sizes[k], def.name())?;
            let header = start + (layout.header_offset + HEADER_WORDS * k as u32) as usize;
            let words = &mut self.batch.words;
            let meta = (words.len() - start) as u32;
            words[header] = base;
            words[header + 1] = len;
            words[header + 2] = shape.rank() as u32;
            words[header + 3] = meta;
            push_layout_words(words, &shape, &strides);
            self.batch.buffers.push(bound);
            if let Some(keep) = keep.as_deref_mut() {
                keep.push(binding);
            }
        }
        Ok(())
    }
}

impl ComputeServer for WgpuServer {
    type Kernel = WgpuKernel;
    type Storage = WgpuStorage;
    type Info = WgpuInfo;

    fn info(&self) -> WgpuInfo {
        self.info.clone()
    }

    /// `get_resource`: the resource behind `binding`, once every submission so far completed.
    fn get_resource(
        &mut self,
        binding: Binding,
        _stream: StreamId,
    ) -> Result<WgpuResource, ServerError> {
        let resource = self.resolve(&binding)?;
        let index = self.submit_always()?;
        self.wait_for(index)?;
        Ok(resource)
    }

    /// `launch`: check the arguments and the count, and record the launch into the batch (or
    /// into the stream's capture).
    ///
    /// # Safety
    /// The contract of [`ComputeServer::launch`](compute_core::ComputeServer::launch).
    unsafe fn launch(
        &mut self,
        launch: KernelLaunch<WgpuKernel>,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        launch.check(&self.streams.properties().hardware)?;
        let (kernel, count, arguments, mode) = launch.into_parts();
        let def = kernel.definition();
        // Only a graph keeps the bindings (its launches outlive the caller's handles). A batch
        // does not need them: a slice freed and reused after this launch is written by work
        // issued later, which the one queue runs after this launch.
        let capturing = self.stream(stream)?.capture.is_some();
        let mut bindings: Vec<Binding> = Vec::new();
        let (count, empty) = match count {
            CubeCount::Static(x, y, z) => {
                (DispatchCount::Static([x, y, z]), x == 0 || y == 0 || z == 0)
            }
            CubeCount::Dynamic(binding) => {
                let resource = self.resolve(&binding)?;
                bindings.push(binding);
                // Recorded now or by a graph's replay: the guard's status is read from the next
                // sync or read on (a replay sets this again).
                if !capturing {
                    self.guard_streams.mark(stream);
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
        // The info words and bound buffers go straight into the batch's arenas (taken back on
        // an error, moved into a graph's launch when capturing).
        let words = self.batch.words.len();
        let bound = self.batch.buffers.len();
        let built = self.build_launch(
            def,
            &pipeline,
            arguments,
            capturing.then_some(&mut bindings),
        );
        if let Err(e) = built {
            self.batch.words.truncate(words);
            self.batch.buffers.truncate(bound);
            return Err(e);
        }
        if capturing {
            let dispatch = Arc::new(Dispatch {
                pipeline,
                buffers: self.batch.buffers.drain(bound..).collect(),
                info: self.batch.words.drain(words..).collect(),
                count,
                _bindings: bindings,
            });
            if let Some(capture) = &mut self.stream(stream)?.capture
                && !empty
            {
                capture.push(dispatch);
            }
            return Ok(());
        }
        if empty {
            self.batch.words.truncate(words);
            self.batch.buffers.truncate(bound);
            return Ok(());
        }
        self.batch.push_launch(pipeline, words, bound, count);
        self.submit_if_full()
    }

    fn flush(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.submit()?;
        self.take_error(stream)
    }
    fn sync(&mut self, stream: StreamId) -> DynFut<Result<(), ServerError>> {
        self.sync_stream(stream)
    }
}
