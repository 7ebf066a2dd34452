//! Compute pipelines from compiled SPIR-V, the persistent `VkPipelineCache` on disk, and the
//! server's pipeline lookup (compiled and created at a kernel's first launch in each mode).

use std::path::PathBuf;
use std::sync::Arc;

use ash::vk;
use compute_core::ServerError;

use crate::compiler::{ArgLayout, SpirvKernel};
use crate::context::Context;
use crate::kernel::VulkanKernel;
use crate::server::VulkanServer;

/// Environment variable naming the directory of the on-disk pipeline cache (`off` disables it).
pub const CACHE_DIR_ENV: &str = "COMPUTE_VULKAN_CACHE_DIR";

static CREATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static CACHE_HITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static WITH_FEEDBACK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn count_created(flags: Option<vk::PipelineCreationFeedbackFlags>) {
    use std::sync::atomic::Ordering::Relaxed;
    CREATED.fetch_add(1, Relaxed);
    if let Some(flags) = flags
        && flags.contains(vk::PipelineCreationFeedbackFlags::VALID)
    {
        WITH_FEEDBACK.fetch_add(1, Relaxed);
        if flags.contains(vk::PipelineCreationFeedbackFlags::APPLICATION_PIPELINE_CACHE_HIT) {
            CACHE_HITS.fetch_add(1, Relaxed);
        }
    }
}

/// Pipeline creations of this process, as the driver reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PipelineCounts {
    /// Compute pipelines created.
    pub created: u64,
    /// Of those, the ones whose creation feedback the driver filled in (Vulkan 1.3 devices).
    pub with_feedback: u64,
    /// Of those, the ones the driver found in the pipeline cache (loaded from
    /// [`CACHE_DIR_ENV`]'s directory, or created earlier in the process): no shader compile.
    pub cache_hits: u64,
}

/// The pipeline creations of this process so far, over every device.
pub fn pipeline_counts() -> PipelineCounts {
    use std::sync::atomic::Ordering::Relaxed;
    PipelineCounts {
        created: CREATED.load(Relaxed),
        with_feedback: WITH_FEEDBACK.load(Relaxed),
        cache_hits: CACHE_HITS.load(Relaxed),
    }
}

/// A compute pipeline and its layouts (descriptor set 0 is a push descriptor set).
pub(crate) struct Pipeline {
    ctx: Arc<Context>,
    pub(crate) pipeline: vk::Pipeline,
    pub(crate) layout: vk::PipelineLayout,
    set_layout: vk::DescriptorSetLayout,
    pub(crate) name: String,
    pub(crate) args: ArgLayout,
    pub(crate) uses_info: bool,
    pub(crate) info_binding: u32,
    pub(crate) item_sizes: Vec<u64>,
    pub(crate) push_constant_bytes: u32,
    /// Whether set 0 is a push descriptor set (else launches bind cached descriptor sets).
    pub(crate) push_descriptors: bool,
    /// The set layout, for allocating cached sets.
    pub(crate) set_layout_handle: vk::DescriptorSetLayout,
    /// Process-unique id (the descriptor cache key).
    pub(crate) id: u64,
}

impl Pipeline {
    /// Build the pipeline of `compiled` (entry point `main`).
    pub(crate) fn new(
        ctx: &Arc<Context>,
        cache: vk::PipelineCache,
        name: &str,
        compiled: SpirvKernel,
        push_descriptors: bool,
    ) -> Result<Self, ServerError> {
        let device = &ctx.device;
        let buffers = compiled.buffer_item_sizes.len() as u32;
        let mut bindings: Vec<vk::DescriptorSetLayoutBinding> = (0..buffers)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        if compiled.uses_info {
            bindings.push(
                vk::DescriptorSetLayoutBinding::default()
                    .binding(compiled.info_binding)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE),
            );
        }
        let failed = |what: &str, e: vk::Result| {
            ServerError::Compilation(format!("kernel `{name}`: {what} failed: {e}"))
        };
        let set_info = vk::DescriptorSetLayoutCreateInfo::default()
            .flags(if push_descriptors {
                vk::DescriptorSetLayoutCreateFlags::PUSH_DESCRIPTOR_KHR
            } else {
                vk::DescriptorSetLayoutCreateFlags::empty()
            })
            .bindings(&bindings);
        // SAFETY: a valid create info; with the push flag only when the device has
        // VK_KHR_push_descriptor (the server's choice).
        let set_layout = unsafe { device.create_descriptor_set_layout(&set_info, None) }
            .map_err(|e| failed("vkCreateDescriptorSetLayout", e))?;
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(compiled.push_constant_bytes)];
        let set_layouts = [set_layout];
        let layout_info = vk::PipelineLayoutCreateInfo::default()
            .set_layouts(&set_layouts)
            .push_constant_ranges(if compiled.push_constant_bytes > 0 {
                &ranges
            } else {
                &[]
            });
        // SAFETY: a valid create info over the set layout just made.
        let layout = match unsafe { device.create_pipeline_layout(&layout_info, None) } {
            Ok(l) => l,
            Err(e) => {
                // SAFETY: unused.
                unsafe { device.destroy_descriptor_set_layout(set_layout, None) };
                return Err(failed("vkCreatePipelineLayout", e));
            }
        };
        let destroy_layouts = || {
            // SAFETY: unused.
            unsafe {
                device.destroy_pipeline_layout(layout, None);
                device.destroy_descriptor_set_layout(set_layout, None);
            }
        };
        let module_info = vk::ShaderModuleCreateInfo::default().code(&compiled.words);
        // SAFETY: the words are a SPIR-V module from our compiler.
        let module = match unsafe { device.create_shader_module(&module_info, None) } {
            Ok(m) => m,
            Err(e) => {
                destroy_layouts();
                return Err(failed("vkCreateShaderModule", e));
            }
        };
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        let mut feedback = vk::PipelineCreationFeedback::default();
        let mut feedback_info = vk::PipelineCreationFeedbackCreateInfo::default()
            .pipeline_creation_feedback(&mut feedback);
        let mut create = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout);
        if ctx.creation_feedback {
            create = create.push_next(&mut feedback_info);
        }
        let info = [create];
        // SAFETY: valid create infos (the feedback struct is core in Vulkan 1.3, the only case
        // it is chained); the module is not needed after creation.
        let created = unsafe { device.create_compute_pipelines(cache, &info, None) };
        if created.is_ok() {
            count_created(ctx.creation_feedback.then_some(feedback.flags));
        }
        // SAFETY: pipelines do not reference their module after creation.
        unsafe { device.destroy_shader_module(module, None) };
        let pipeline = match created {
            Ok(p) => p[0],
            Err((_, e)) => {
                destroy_layouts();
                return Err(failed("vkCreateComputePipelines", e));
            }
        };
        Ok(Self {
            ctx: ctx.clone(),
            pipeline,
            layout,
            set_layout,
            name: name.to_string(),
            args: compiled.args,
            uses_info: compiled.uses_info,
            info_binding: compiled.info_binding,
            item_sizes: compiled.buffer_item_sizes,
            push_constant_bytes: compiled.push_constant_bytes,
            push_descriptors,
            set_layout_handle: set_layout,
            id: {
                static NEXT: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(1);
                NEXT.fetch_add(1, core::sync::atomic::Ordering::Relaxed)
            },
        })
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // SAFETY: pipelines are dropped with the server (after it waited for the device) or with
        // the last graph that recorded them, once its replays have completed.
        unsafe {
            self.ctx.device.destroy_pipeline(self.pipeline, None);
            self.ctx.device.destroy_pipeline_layout(self.layout, None);
            self.ctx
                .device
                .destroy_descriptor_set_layout(self.set_layout, None);
        }
    }
}

/// The device's `VkPipelineCache`, loaded from and saved to disk.
pub(crate) struct PipelineCache {
    ctx: Arc<Context>,
    pub(crate) cache: vk::PipelineCache,
    path: Option<PathBuf>,
    /// Pipelines were created since the last save.
    dirty: bool,
    last_save: Option<std::time::Instant>,
}

/// Least time between two saves of the cache file.
const SAVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

fn cache_dir() -> Option<PathBuf> {
    compute_core::env::cache_dir(CACHE_DIR_ENV, "compute-vulkan")
}

/// Whether `data` starts with a pipeline cache header of this device (a foreign or corrupt file
/// is ignored rather than handed to the driver).
fn header_matches(data: &[u8], props: &vk::PhysicalDeviceProperties) -> bool {
    if data.len() < 32 {
        return false;
    }
    let word = |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
    word(0) >= 32
        && word(4) == vk::PipelineCacheHeaderVersion::ONE.as_raw() as u32
        && word(8) == props.vendor_id
        && word(12) == props.device_id
        && data[16..32] == props.pipeline_cache_uuid
}

impl PipelineCache {
    /// The cache of `ctx`'s device, primed from disk when a valid file exists.
    pub(crate) fn open(ctx: &Arc<Context>) -> Result<Self, ServerError> {
        let props = &ctx.properties;
        let uuid: String = ctx.device_uuid.iter().map(|b| format!("{b:02x}")).collect();
        let path = cache_dir().map(|d| d.join(format!("{uuid}-{:08x}.bin", props.driver_version)));
        let data = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .filter(|d| header_matches(d, props))
            .unwrap_or_default();
        let create = |initial: &[u8]| {
            let info = vk::PipelineCacheCreateInfo::default().initial_data(initial);
            // SAFETY: the initial data is empty or carries this device's cache header.
            unsafe { ctx.device.create_pipeline_cache(&info, None) }
        };
        let cache = match create(&data) {
            Ok(c) => c,
            Err(_) => create(&[])
                .map_err(|e| ServerError::Driver(format!("vkCreatePipelineCache failed: {e}")))?,
        };
        Ok(Self {
            ctx: ctx.clone(),
            cache,
            path,
            dirty: false,
            last_save: None,
        })
    }

    /// Note that a pipeline was created through the cache.
    pub(crate) fn created(&mut self) {
        self.dirty = true;
    }

    /// Save when pipelines were created since the last save and the last save is not recent
    /// (servers live in a process-wide registry and are rarely dropped, so saving only on drop
    /// would lose the cache).
    pub(crate) fn maybe_save(&mut self) {
        if !self.dirty || self.last_save.is_some_and(|t| t.elapsed() < SAVE_INTERVAL) {
            return;
        }
        self.save();
        self.dirty = false;
        self.last_save = Some(std::time::Instant::now());
    }

    /// Write the cache to disk (atomically: a temporary file renamed over the old one).
    pub(crate) fn save(&self) {
        let Some(path) = &self.path else { return };
        // SAFETY: the cache belongs to this device.
        let Ok(data) = (unsafe { self.ctx.device.get_pipeline_cache_data(self.cache) }) else {
            return;
        };
        if data.is_empty() {
            return;
        }
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &data).is_ok() && std::fs::rename(&tmp, path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

impl Drop for PipelineCache {
    fn drop(&mut self) {
        self.save();
        // SAFETY: no pipeline creation is in progress (the server owns the cache).
        unsafe { self.ctx.device.destroy_pipeline_cache(self.cache, None) };
    }
}

impl VulkanServer {
    pub(crate) fn pipeline(
        &mut self,
        kernel: &VulkanKernel,
        checked: bool,
    ) -> Result<Arc<Pipeline>, ServerError> {
        if let Some(found) = self.pipelines.get(kernel.id(), checked) {
            return Ok(found);
        }
        let def = kernel.definition();
        def.validate(&self.properties.hardware)?;
        let compiled = super::compile(def, &self.ctx.caps, checked)?;
        // Launch info changes every launch: pushed. Everything else binds cached sets.
        let push = compiled.uses_info;
        if push && self.ctx.push_descriptor.is_none() {
            return Err(ServerError::Unsupported(format!(
                "vulkan: kernel `{}` reads launch metadata, which needs VK_KHR_push_descriptor (this device lacks it)",
                def.name()
            )));
        }
        if compiled.push_constant_bytes > self.ctx.limits().max_push_constants_size {
            return Err(ServerError::Compilation(format!(
                "kernel `{}` needs {} bytes of push constants, the device has {}",
                def.name(),
                compiled.push_constant_bytes,
                self.ctx.limits().max_push_constants_size
            )));
        }
        let pipeline = Arc::new(Pipeline::new(
            &self.ctx,
            self.cache.cache,
            def.name(),
            compiled,
            push,
        )?);
        self.cache.created();
        self.pipelines
            .insert(kernel.id(), checked, pipeline.clone());
        Ok(pipeline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props() -> vk::PhysicalDeviceProperties {
        let mut p = vk::PhysicalDeviceProperties {
            vendor_id: 0x10de,
            device_id: 0x2335,
            ..Default::default()
        };
        p.pipeline_cache_uuid = [7; 16];
        p
    }

    fn header(p: &vk::PhysicalDeviceProperties) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend(32u32.to_le_bytes());
        h.extend((vk::PipelineCacheHeaderVersion::ONE.as_raw() as u32).to_le_bytes());
        h.extend(p.vendor_id.to_le_bytes());
        h.extend(p.device_id.to_le_bytes());
        h.extend(p.pipeline_cache_uuid);
        h
    }

    #[test]
    fn cache_header_of_this_device_is_accepted() {
        let p = props();
        let mut data = header(&p);
        data.extend([1, 2, 3]);
        assert!(header_matches(&data, &p));
    }

    #[test]
    fn foreign_or_corrupt_cache_is_ignored() {
        let p = props();
        assert!(!header_matches(b"garbage", &p));
        assert!(!header_matches(&[], &p));
        let mut other = header(&p);
        other[16] ^= 1;
        assert!(!header_matches(&other, &p), "another driver build's UUID");
        let mut vendor = header(&p);
        vendor[8] ^= 1;
        assert!(!header_matches(&vendor, &p));
    }
}
