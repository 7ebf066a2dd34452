//! One logical Vulkan device, shared (`Arc`) by the server, its futures and its worker: the
//! `VkDevice`, its queue and timeline semaphore, the memory types chosen for the device kind, the
//! limits, and the features enabled at creation (which are the [`SpirvCaps`] kernels compile for).

use std::ffi::CStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use ash::vk;
use compute_core::ServerError;

use crate::compiler::SpirvCaps;
use crate::device::Instance;

/// Usages of every storage block: bound to kernels, copied from and to, read as dispatch counts.
pub(crate) const STORAGE_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw()
        | vk::BufferUsageFlags::INDIRECT_BUFFER.as_raw(),
);

/// Usages of host-visible staging buffers: copy source and target, and the info buffer of
/// launches (bound as a storage buffer).
pub(crate) const STAGING_USAGE: vk::BufferUsageFlags = vk::BufferUsageFlags::from_raw(
    vk::BufferUsageFlags::STORAGE_BUFFER.as_raw()
        | vk::BufferUsageFlags::TRANSFER_SRC.as_raw()
        | vk::BufferUsageFlags::TRANSFER_DST.as_raw(),
);

/// Staging buffers kept for reuse, at most this many bytes in all (enough for repeated 1 GiB
/// transfers; `memory_cleanup` on an idle device releases them).
const STAGING_POOL_BYTES: u64 = 2 << 30;

fn vk_err(what: &str) -> impl Fn(vk::Result) -> ServerError + '_ {
    move |e| ServerError::Driver(format!("{what} failed: {e}"))
}

/// A host-visible buffer with its memory, mapped for its whole life.
#[derive(Debug)]
pub(crate) struct RawStaging {
    pub(crate) buffer: vk::Buffer,
    pub(crate) memory: vk::DeviceMemory,
    pub(crate) ptr: *mut u8,
    pub(crate) size: u64,
}

// SAFETY: the mapping is plain host memory owned by this value; access is synchronised by its
// owner (one owner at a time, moved between threads).
unsafe impl Send for RawStaging {}

struct QueueState {
    queue: vk::Queue,
    /// The value the next reservation gets.
    next: u64,
    /// The highest value submitted (or abandoned): submissions happen in value order.
    submitted: u64,
}

/// A logical device and what the server needs to know about it.
pub(crate) struct Context {
    pub(crate) device: ash::Device,
    pub(crate) push_descriptor: Option<ash::khr::push_descriptor::Device>,
    /// Whether `synchronization2` is enabled (barriers use `vkCmdPipelineBarrier2`, which
    /// drivers record without converting).
    pub(crate) sync2: bool,
    queue: Mutex<QueueState>,
    /// Signalled when `submitted` moves (a submission waits for the values before its own).
    turn: std::sync::Condvar,
    pub(crate) timeline: vk::Semaphore,
    /// Queue family of the queue.
    pub(crate) family: u32,
    pub(crate) properties: vk::PhysicalDeviceProperties,
    pub(crate) device_uuid: [u8; 16],
    /// Memory type of storage blocks, and whether it is host visible (unified memory).
    pub(crate) storage_type: u32,
    pub(crate) storage_host_visible: bool,
    pub(crate) staging_type: u32,
    pub(crate) max_memory_allocation_size: u64,
    pub(crate) max_buffer_size: u64,
    pub(crate) timestamp_valid_bits: u32,
    pub(crate) caps: SpirvCaps,
    pub(crate) subgroup_size: (u32, u32),
    pub(crate) memory_total: u64,
    /// Whether pipeline creation reports feedback (Vulkan 1.3 core): whether the driver found
    /// the pipeline in the application's pipeline cache.
    pub(crate) creation_feedback: bool,
    staging_pool: Mutex<Vec<RawStaging>>,
    /// Bytes of every live staging buffer [`Context::take_staging`] allocated (handed out or
    /// pooled), and of those, the ones handed out and not yet returned: atomics, since buffers
    /// come back on whichever thread drops them (the server's, the recycler, a read's future,
    /// the collective worker).
    staging_bytes: AtomicU64,
    staging_out: AtomicU64,
    /// The highest timeline value a wait of this process saw completed.
    known_completed: std::sync::atomic::AtomicU64,
}

fn has_extension(list: &[vk::ExtensionProperties], name: &CStr) -> bool {
    list.iter()
        .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
}

fn on(b: vk::Bool32) -> bool {
    b == vk::TRUE
}

impl Context {
    /// Create a logical device on `physical` with one compute queue, every kernel-relevant
    /// feature the device has, push descriptors and atomic floats where present.
    pub(crate) fn new(
        instance: &'static Instance,
        physical: vk::PhysicalDevice,
    ) -> Result<Self, ServerError> {
        let vki = &instance.instance;
        // SAFETY: `physical` was enumerated from `vki`.
        let extensions = unsafe { vki.enumerate_device_extension_properties(physical) }
            .map_err(vk_err("vkEnumerateDeviceExtensionProperties"))?;
        let has_push = has_extension(&extensions, ash::khr::push_descriptor::NAME);
        let has_atomic_float = has_extension(&extensions, ash::ext::shader_atomic_float::NAME);

        // SAFETY: as above.
        let properties = unsafe { vki.get_physical_device_properties(physical) };
        let api = properties.api_version.min(instance.api_version);
        let v13 = api >= vk::API_VERSION_1_3;

        let mut p11 = vk::PhysicalDeviceVulkan11Properties::default();
        let mut p13 = vk::PhysicalDeviceVulkan13Properties::default();
        let mut maint3 = vk::PhysicalDeviceMaintenance3Properties::default();
        {
            let mut props2 = vk::PhysicalDeviceProperties2::default()
                .push_next(&mut p11)
                .push_next(&mut maint3);
            if v13 {
                props2 = props2.push_next(&mut p13);
            }
            // SAFETY: the chain holds structs this API version knows.
            unsafe { vki.get_physical_device_properties2(physical, &mut props2) };
        }
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut fatomic = vk::PhysicalDeviceShaderAtomicFloatFeaturesEXT::default();
        let core = {
            let mut features2 = vk::PhysicalDeviceFeatures2::default()
                .push_next(&mut f11)
                .push_next(&mut f12);
            if v13 {
                features2 = features2.push_next(&mut f13);
            }
            if has_atomic_float {
                features2 = features2.push_next(&mut fatomic);
            }
            // SAFETY: as above; the extension struct only when the extension exists.
            unsafe { vki.get_physical_device_features2(physical, &mut features2) };
            features2.features
        };
        if !on(f12.timeline_semaphore) {
            return Err(ServerError::Unavailable(
                "the Vulkan device has no timeline semaphores".into(),
            ));
        }

        // What we enable: only what kernels and the runtime use (robustBufferAccess stays off;
        // bounds checks are the compiler's).
        let en_core = vk::PhysicalDeviceFeatures::default()
            .shader_float64(on(core.shader_float64))
            .shader_int64(on(core.shader_int64))
            .shader_int16(on(core.shader_int16));
        let mut en11 = vk::PhysicalDeviceVulkan11Features::default()
            .storage_buffer16_bit_access(on(f11.storage_buffer16_bit_access))
            .uniform_and_storage_buffer16_bit_access(
                on(f11.uniform_and_storage_buffer16_bit_access),
            )
            .storage_push_constant16(on(f11.storage_push_constant16))
            .variable_pointers_storage_buffer(on(f11.variable_pointers_storage_buffer))
            .variable_pointers(on(f11.variable_pointers));
        let mut en12 = vk::PhysicalDeviceVulkan12Features::default()
            .storage_buffer8_bit_access(on(f12.storage_buffer8_bit_access))
            .uniform_and_storage_buffer8_bit_access(on(f12.uniform_and_storage_buffer8_bit_access))
            .storage_push_constant8(on(f12.storage_push_constant8))
            .shader_buffer_int64_atomics(on(f12.shader_buffer_int64_atomics))
            .shader_shared_int64_atomics(on(f12.shader_shared_int64_atomics))
            .shader_float16(on(f12.shader_float16))
            .shader_int8(on(f12.shader_int8))
            .scalar_block_layout(on(f12.scalar_block_layout))
            .shader_subgroup_extended_types(on(f12.shader_subgroup_extended_types))
            .host_query_reset(on(f12.host_query_reset))
            .timeline_semaphore(true)
            .vulkan_memory_model(on(f12.vulkan_memory_model))
            .vulkan_memory_model_device_scope(on(f12.vulkan_memory_model_device_scope))
            .subgroup_broadcast_dynamic_id(on(f12.subgroup_broadcast_dynamic_id));
        let mut en13 = vk::PhysicalDeviceVulkan13Features::default()
            .subgroup_size_control(on(f13.subgroup_size_control))
            .compute_full_subgroups(on(f13.compute_full_subgroups))
            .maintenance4(on(f13.maintenance4))
            .synchronization2(on(f13.synchronization2));
        let mut enatomic = vk::PhysicalDeviceShaderAtomicFloatFeaturesEXT::default()
            .shader_buffer_float32_atomics(on(fatomic.shader_buffer_float32_atomics))
            .shader_buffer_float32_atomic_add(on(fatomic.shader_buffer_float32_atomic_add))
            .shader_shared_float32_atomics(on(fatomic.shader_shared_float32_atomics))
            .shader_shared_float32_atomic_add(on(fatomic.shader_shared_float32_atomic_add))
            .shader_buffer_float64_atomics(on(fatomic.shader_buffer_float64_atomics))
            .shader_buffer_float64_atomic_add(on(fatomic.shader_buffer_float64_atomic_add));

        // SAFETY: as above.
        let families = unsafe { vki.get_physical_device_queue_family_properties(physical) };
        let compute: Vec<(u32, &vk::QueueFamilyProperties)> = families
            .iter()
            .enumerate()
            .filter(|(_, f)| f.queue_flags.contains(vk::QueueFlags::COMPUTE) && f.queue_count > 0)
            .map(|(i, f)| (i as u32, f))
            .collect();
        let (family, family_props) = compute
            .iter()
            .find(|(_, f)| f.timestamp_valid_bits > 0)
            .or_else(|| compute.first())
            .copied()
            .ok_or_else(|| {
                ServerError::Unavailable("the Vulkan device has no compute queue".into())
            })?;
        let timestamp_valid_bits = family_props.timestamp_valid_bits;

        let priorities = [1.0f32];
        let queue_info = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        let mut ext_names = Vec::new();
        if has_push {
            ext_names.push(ash::khr::push_descriptor::NAME.as_ptr());
        }
        if has_atomic_float {
            ext_names.push(ash::ext::shader_atomic_float::NAME.as_ptr());
        }
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_info)
            .enabled_extension_names(&ext_names)
            .enabled_features(&en_core)
            .push_next(&mut en11)
            .push_next(&mut en12);
        if v13 {
            info = info.push_next(&mut en13);
        }
        if has_atomic_float {
            info = info.push_next(&mut enatomic);
        }
        // SAFETY: every feature enabled was reported supported; pointers refer to locals.
        let device = unsafe { vki.create_device(physical, &info, None) }
            .map_err(|e| ServerError::Unavailable(format!("vkCreateDevice failed: {e}")))?;
        // SAFETY: family `family` has one queue, created above.
        let queue = unsafe { device.get_device_queue(family, 0) };
        let mut timeline_info = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let sem_info = vk::SemaphoreCreateInfo::default().push_next(&mut timeline_info);
        // SAFETY: the device has timeline semaphores enabled.
        let timeline = match unsafe { device.create_semaphore(&sem_info, None) } {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: nothing else uses the device yet.
                unsafe { device.destroy_device(None) };
                return Err(ServerError::Driver(format!(
                    "vkCreateSemaphore failed: {e}"
                )));
            }
        };
        let push_descriptor =
            has_push.then(|| ash::khr::push_descriptor::Device::new(vki, &device));

        // SAFETY: as above.
        let memory = unsafe { vki.get_physical_device_memory_properties(physical) };
        let cpu_like = matches!(
            properties.device_type,
            vk::PhysicalDeviceType::CPU | vk::PhysicalDeviceType::INTEGRATED_GPU
        );
        let storage_bits = memory_type_bits(&device, STORAGE_USAGE)?;
        let staging_bits = memory_type_bits(&device, STAGING_USAGE)?;
        let pick = |bits: u32, want: &[vk::MemoryPropertyFlags], avoid: vk::MemoryPropertyFlags| {
            for &flags in want {
                for pass in 0..2 {
                    for i in 0..memory.memory_type_count {
                        let t = memory.memory_types[i as usize];
                        if bits & (1 << i) == 0 || !t.property_flags.contains(flags) {
                            continue;
                        }
                        if pass == 0 && t.property_flags.intersects(avoid) {
                            continue;
                        }
                        return Some(i);
                    }
                }
            }
            None
        };
        let local = vk::MemoryPropertyFlags::DEVICE_LOCAL;
        let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let storage_type = if cpu_like {
            pick(
                storage_bits,
                &[local | host, host, local],
                vk::MemoryPropertyFlags::empty(),
            )
        } else {
            // A discrete GPU: device-local memory, preferably not the host-visible window.
            pick(
                storage_bits,
                &[local],
                vk::MemoryPropertyFlags::HOST_VISIBLE,
            )
        };
        let staging_type = pick(
            staging_bits,
            &[host | vk::MemoryPropertyFlags::HOST_CACHED, host],
            if cpu_like {
                vk::MemoryPropertyFlags::empty()
            } else {
                local
            },
        );
        let (Some(storage_type), Some(staging_type)) = (storage_type, staging_type) else {
            // SAFETY: nothing else uses the device yet.
            unsafe {
                device.destroy_semaphore(timeline, None);
                device.destroy_device(None);
            }
            return Err(ServerError::Unavailable(
                "the Vulkan device has no suitable memory type for storage or staging".into(),
            ));
        };
        let storage_host_visible = memory.memory_types[storage_type as usize]
            .property_flags
            .contains(host);
        let memory_total = (0..memory.memory_heap_count)
            .map(|i| memory.memory_heaps[i as usize])
            .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .map(|h| h.size)
            .sum();

        let subgroup_ops = vk::SubgroupFeatureFlags::BASIC
            | vk::SubgroupFeatureFlags::ARITHMETIC
            | vk::SubgroupFeatureFlags::BALLOT
            | vk::SubgroupFeatureFlags::SHUFFLE;
        let subgroups = p11
            .subgroup_supported_stages
            .contains(vk::ShaderStageFlags::COMPUTE)
            && p11.subgroup_supported_operations.contains(subgroup_ops);
        let version = if v13 {
            (1, 6)
        } else if api >= vk::API_VERSION_1_2 {
            (1, 5)
        } else {
            (1, 3)
        };
        let caps = SpirvCaps {
            version,
            float16: on(f12.shader_float16),
            float64: on(core.shader_float64),
            int8: on(f12.shader_int8),
            int16: on(core.shader_int16),
            int64: on(core.shader_int64),
            storage8: on(f12.storage_buffer8_bit_access),
            storage16: on(f11.storage_buffer16_bit_access),
            subgroups,
            int64_atomics_buffer: on(f12.shader_buffer_int64_atomics),
            int64_atomics_shared: on(f12.shader_shared_int64_atomics),
            float32_atomic_add_buffer: on(fatomic.shader_buffer_float32_atomic_add),
            float32_atomic_add_shared: on(fatomic.shader_shared_float32_atomic_add),
            max_push_constant_bytes: properties.limits.max_push_constants_size,
        };
        let subgroup_size = if v13 && p13.min_subgroup_size > 0 {
            (p13.min_subgroup_size, p13.max_subgroup_size)
        } else {
            (p11.subgroup_size, p11.subgroup_size)
        };
        let max_buffer_size = if v13 && p13.max_buffer_size > 0 {
            p13.max_buffer_size
        } else {
            u64::MAX
        };
        let max_memory_allocation_size = if p11.max_memory_allocation_size > 0 {
            p11.max_memory_allocation_size
        } else {
            maint3.max_memory_allocation_size
        };
        Ok(Self {
            creation_feedback: v13,
            device,
            push_descriptor,
            sync2: on(f13.synchronization2),
            queue: Mutex::new(QueueState {
                queue,
                next: 1,
                submitted: 0,
            }),
            turn: std::sync::Condvar::new(),
            timeline,
            family,
            properties,
            device_uuid: p11.device_uuid,
            storage_type,
            storage_host_visible,
            staging_type,
            max_memory_allocation_size,
            max_buffer_size,
            timestamp_valid_bits,
            caps,
            subgroup_size,
            memory_total,
            staging_pool: Mutex::new(Vec::new()),
            staging_bytes: AtomicU64::new(0),
            staging_out: AtomicU64::new(0),
            known_completed: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The device's limits.
    pub(crate) fn limits(&self) -> &vk::PhysicalDeviceLimits {
        &self.properties.limits
    }

    /// The device's name.
    pub(crate) fn name(&self) -> String {
        self.properties
            .device_name_as_c_str()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Submit `commands` in order; the submission signals the timeline with the returned value.
    ///
    /// Every submission goes through here or [`Context::submit_reserved`], so timeline values
    /// follow queue order.
    pub(crate) fn submit(&self, commands: &[vk::CommandBuffer]) -> Result<u64, ServerError> {
        let value = self.reserve();
        self.submit_reserved(commands, value).map(|()| value)
    }

    /// Reserve the next timeline value for a submission made later with
    /// [`Context::submit_reserved`] (or given up with [`Context::abandon`]). Host waits for it
    /// may start at once.
    pub(crate) fn reserve(&self) -> u64 {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let value = q.next;
        q.next += 1;
        value
    }

    /// The queue, once every value below `value` was submitted or abandoned.
    fn turn_of(&self, value: u64) -> std::sync::MutexGuard<'_, QueueState> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        while q.submitted + 1 < value {
            q = self.turn.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        q
    }

    /// Submit `commands` signalling the reserved `value`, after the submissions of the values
    /// before it. On failure the value is abandoned (see [`Context::abandon`]).
    pub(crate) fn submit_reserved(
        &self,
        commands: &[vk::CommandBuffer],
        value: u64,
    ) -> Result<(), ServerError> {
        let mut q = self.turn_of(value);
        let values = [value];
        let semaphores = [self.timeline];
        let mut timeline =
            vk::TimelineSemaphoreSubmitInfo::default().signal_semaphore_values(&values);
        let submit = vk::SubmitInfo::default()
            .command_buffers(commands)
            .signal_semaphores(&semaphores)
            .push_next(&mut timeline);
        // SAFETY: the queue is externally synchronised by the mutex; the command buffers are
        // executable and stay alive until `value` completes (their owners' contract).
        let submitted = unsafe {
            self.device
                .queue_submit(q.queue, &[submit], vk::Fence::null())
        }
        .map_err(vk_err("vkQueueSubmit"));
        if submitted.is_err() {
            drop(q);
            self.abandon(value);
            return submitted;
        }
        q.submitted = value;
        drop(q);
        self.turn.notify_all();
        Ok(())
    }

    /// Give up the reserved `value`: nothing runs for it, and its waiters are released (the
    /// host signals it once the submissions before it completed).
    pub(crate) fn abandon(&self, value: u64) {
        // Every value before this one was submitted (or abandoned), and none after it can be
        // until it is marked below: signal it first, once the values before it completed (a
        // signal must not overtake them).
        drop(self.turn_of(value));
        if let Err(e) = self.wait(value - 1) {
            // The caller returns the error that made it give the value up; this one follows it.
            compute_core::error::report_unreturned(
                "vulkan: waiting before an abandoned submission",
                &e,
            );
        }
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(self.timeline)
            .value(value);
        // SAFETY: the timeline semaphore of this device; `value` is above every value signalled
        // so far (the ones before it completed, later ones wait for this one to be marked).
        if let Err(e) = unsafe { self.device.signal_semaphore(&info) } {
            compute_core::error::report_unreturned(
                "vulkan: vkSignalSemaphore of an abandoned submission",
                &e,
            );
        }
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.submitted < value {
            q.submitted = value;
        }
        drop(q);
        self.turn.notify_all();
    }

    /// The value of the latest submission (0 before the first).
    pub(crate) fn last_submitted(&self) -> u64 {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).next - 1
    }

    /// The latest completed timeline value.
    pub(crate) fn completed(&self) -> Result<u64, ServerError> {
        // SAFETY: the semaphore is a timeline semaphore of this device.
        unsafe { self.device.get_semaphore_counter_value(self.timeline) }
            .map_err(vk_err("vkGetSemaphoreCounterValue"))
    }

    /// Block (in the driver, not spinning) until the submission with `value` has completed.
    pub(crate) fn wait(&self, value: u64) -> Result<(), ServerError> {
        if value == 0 || value <= self.known_completed() {
            return Ok(());
        }
        // A value reserved but not yet submitted (the submit thread is recording it) is waited
        // for here first: drivers emulating timelines (lavapipe) wait for unsubmitted values in
        // a slow path.
        drop(self.turn_of(value + 1));
        let semaphores = [self.timeline];
        let values = [value];
        let info = vk::SemaphoreWaitInfo::default()
            .semaphores(&semaphores)
            .values(&values);
        // SAFETY: waiting on our timeline semaphore from any thread is allowed.
        unsafe { self.device.wait_semaphores(&info, u64::MAX) }
            .map_err(vk_err("vkWaitSemaphores"))?;
        self.known_completed
            .fetch_max(value, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// The highest value a wait saw completed: free to ask, unlike the driver (lavapipe's counter
    /// query waits for its queue thread).
    pub(crate) fn known_completed(&self) -> u64 {
        self.known_completed
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Allocate a buffer of `size` bytes with its own memory of type `memory_type`, mapped when
    /// `map` is set.
    pub(crate) fn alloc_buffer(
        &self,
        size: u64,
        usage: vk::BufferUsageFlags,
        memory_type: u32,
        map: bool,
    ) -> Result<(vk::Buffer, vk::DeviceMemory, *mut u8), ServerError> {
        let oom = |reason: String| ServerError::OutOfMemory {
            requested: size,
            reason,
        };
        if size > self.max_buffer_size {
            return Err(oom(format!(
                "larger than the Vulkan device's maxBufferSize ({} bytes)",
                self.max_buffer_size
            )));
        }
        let info = vk::BufferCreateInfo::default()
            .size(size.max(4))
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        // SAFETY: a valid create info.
        let buffer = unsafe { self.device.create_buffer(&info, None) }
            .map_err(|e| oom(format!("vkCreateBuffer failed: {e}")))?;
        // SAFETY: `buffer` was just created on this device.
        let req = unsafe { self.device.get_buffer_memory_requirements(buffer) };
        let destroy = || {
            // SAFETY: the buffer is unused.
            unsafe { self.device.destroy_buffer(buffer, None) }
        };
        if req.size > self.max_memory_allocation_size {
            destroy();
            return Err(oom(format!(
                "larger than the Vulkan device's maxMemoryAllocationSize ({} bytes)",
                self.max_memory_allocation_size
            )));
        }
        if req.memory_type_bits & (1 << memory_type) == 0 {
            destroy();
            return Err(ServerError::Driver(format!(
                "memory type {memory_type} cannot back a buffer with usage {:#x}",
                usage.as_raw()
            )));
        }
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(req.size)
            .memory_type_index(memory_type);
        // SAFETY: a valid allocate info for a type of this device.
        let memory = match unsafe { self.device.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(e) => {
                destroy();
                return Err(oom(format!(
                    "vkAllocateMemory of {} bytes failed: {e}",
                    req.size
                )));
            }
        };
        let free = || {
            // SAFETY: buffer and memory are unused.
            unsafe {
                self.device.destroy_buffer(buffer, None);
                self.device.free_memory(memory, None);
            }
        };
        // SAFETY: the memory is fresh and large enough for the buffer.
        if let Err(e) = unsafe { self.device.bind_buffer_memory(buffer, memory, 0) } {
            free();
            return Err(ServerError::Driver(format!(
                "vkBindBufferMemory failed: {e}"
            )));
        }
        let ptr = if map {
            // SAFETY: the memory is host visible (the caller's contract) and not mapped yet.
            match unsafe {
                self.device
                    .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
            } {
                Ok(p) => p.cast::<u8>(),
                Err(e) => {
                    free();
                    return Err(oom(format!("vkMapMemory failed: {e}")));
                }
            }
        } else {
            core::ptr::null_mut()
        };
        Ok((buffer, memory, ptr))
    }

    /// Destroy a buffer and free its memory.
    ///
    /// # Safety
    /// No pending GPU work may use them.
    pub(crate) unsafe fn free_buffer(&self, buffer: vk::Buffer, memory: vk::DeviceMemory) {
        // SAFETY: the caller's contract; freeing memory unmaps it.
        unsafe {
            self.device.destroy_buffer(buffer, None);
            self.device.free_memory(memory, None);
        }
    }

    /// A mapped staging buffer of at least `size` bytes, reused from the pool when one fits.
    pub(crate) fn take_staging(&self, size: u64) -> Result<RawStaging, ServerError> {
        {
            let mut pool = self.staging_pool.lock().unwrap_or_else(|p| p.into_inner());
            let best = pool
                .iter()
                .enumerate()
                .filter(|(_, s)| s.size >= size && s.size <= size.saturating_mul(4).max(1 << 16))
                .min_by_key(|(_, s)| s.size)
                .map(|(i, _)| i);
            if let Some(i) = best {
                let staging = pool.swap_remove(i);
                self.staging_out.fetch_add(staging.size, Ordering::AcqRel);
                return Ok(staging);
            }
        }
        let size = size.max(1 << 16).next_power_of_two();
        let (buffer, memory, ptr) =
            self.alloc_buffer(size, STAGING_USAGE, self.staging_type, true)?;
        self.staging_bytes.fetch_add(size, Ordering::AcqRel);
        self.staging_out.fetch_add(size, Ordering::AcqRel);
        Ok(RawStaging {
            buffer,
            memory,
            ptr,
            size,
        })
    }

    /// Return a staging buffer no pending work uses any more.
    pub(crate) fn return_staging(&self, staging: RawStaging) {
        let mut pool = self.staging_pool.lock().unwrap_or_else(|p| p.into_inner());
        self.staging_out.fetch_sub(staging.size, Ordering::AcqRel);
        let held: u64 = pool.iter().map(|s| s.size).sum();
        if held + staging.size <= STAGING_POOL_BYTES {
            pool.push(staging);
        } else {
            drop(pool);
            // SAFETY: the caller's contract: no pending work uses it.
            unsafe { self.free_buffer(staging.buffer, staging.memory) };
            self.staging_bytes.fetch_sub(staging.size, Ordering::AcqRel);
        }
    }

    /// Release every pooled staging buffer.
    pub(crate) fn trim_staging(&self) {
        let pooled =
            core::mem::take(&mut *self.staging_pool.lock().unwrap_or_else(|p| p.into_inner()));
        for s in pooled {
            // SAFETY: pooled buffers are unused.
            unsafe { self.free_buffer(s.buffer, s.memory) };
            self.staging_bytes.fetch_sub(s.size, Ordering::AcqRel);
        }
    }

    /// Host-visible staging memory of this device, as `(reserved, in use)` bytes: `reserved` is
    /// every staging buffer [`Context::take_staging`] allocated and not freed yet (handed out or
    /// pooled for reuse), `in use` the part handed out and not returned yet (held by the open
    /// batch, a submission not yet recycled, a pending read, a collective round or a graph).
    /// Sizes are the buffers' capacities (powers of two of at least 64 KiB), not the bytes
    /// transferred.
    pub(crate) fn staging_usage(&self) -> (u64, u64) {
        // Read `out` first: a buffer returned and freed between the loads leaves `out` above
        // `reserved` for a moment, which the `min` hides.
        let out = self.staging_out.load(Ordering::Acquire);
        let reserved = self.staging_bytes.load(Ordering::Acquire);
        (reserved, out.min(reserved))
    }
}

fn memory_type_bits(device: &ash::Device, usage: vk::BufferUsageFlags) -> Result<u32, ServerError> {
    let info = vk::BufferCreateInfo::default()
        .size(4096)
        .usage(usage)
        .sharing_mode(vk::SharingMode::EXCLUSIVE);
    // SAFETY: a valid create info; the probe buffer is destroyed right after the query.
    unsafe {
        let buffer = device
            .create_buffer(&info, None)
            .map_err(vk_err("vkCreateBuffer"))?;
        let req = device.get_buffer_memory_requirements(buffer);
        device.destroy_buffer(buffer, None);
        Ok(req.memory_type_bits)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.trim_staging();
        // SAFETY: every other owner of the device (server, futures, workers) held an `Arc` to this
        // context and is gone; waiting idle makes sure no submitted work still runs.
        unsafe {
            if let Err(e) = self.device.device_wait_idle() {
                compute_core::error::report_unreturned(
                    "vulkan: vkDeviceWaitIdle at device drop",
                    &e,
                );
            }
            self.device.destroy_semaphore(self.timeline, None);
            self.device.destroy_device(None);
        }
    }
}
