//! wgpu devices: the adapters of the process-wide instance, the logical devices over them, and
//! the properties a logical device reports.

use std::sync::OnceLock;

use compute_core::memory::MemoryDeviceProperties;
use compute_core::{
    Device, DeviceId, DeviceProperties, Features, HardwareProperties, TimingMethod,
};

use crate::compiler::ShaderCapabilities;

/// The device type id of every wgpu device (ASCII `w`).
///
/// Distinct from the other backends' ids on purpose: compute-core's host rendezvous for
/// collectives is keyed by [`DeviceId`] alone, so equal ids of two runtimes in one process would
/// meet in the same rendezvous rounds.
pub const WGPU_DEVICE_TYPE: u16 = 0x77;

/// Fewest logical devices exposed when there are adapters at all, so that transfers between
/// clients and collectives can run on a machine with a single adapter.
pub const MIN_LOGICAL_DEVICES: u32 = 4;

/// A logical wgpu device. Device `i` runs on adapter `i % adapter_count`, each with its own
/// `wgpu::Device` and queue (see [`device_count`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WgpuDevice {
    /// Index of the logical device.
    pub index: u32,
}

impl WgpuDevice {
    /// The logical device with the given index.
    pub const fn new(index: u32) -> Self {
        Self { index }
    }
}

impl Device for WgpuDevice {
    fn to_id(&self) -> DeviceId {
        DeviceId::new(WGPU_DEVICE_TYPE, self.index)
    }

    fn from_id(id: DeviceId) -> Self {
        Self { index: id.index_id }
    }
}

struct Adapters {
    instance: wgpu::Instance,
    adapters: Vec<wgpu::Adapter>,
}

static ADAPTERS: OnceLock<Result<Adapters, String>> = OnceLock::new();

/// The backends to enumerate: `WGPU_BACKEND` (e.g. `vulkan`) when set, else every compiled one.
pub fn backends() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all())
        & wgpu::Instance::enabled_backend_features()
}

fn discover() -> Result<Adapters, String> {
    let backends = backends();
    if backends.is_empty() {
        return Err(format!(
            "no wgpu backend selected (WGPU_BACKEND={:?}; this build has {:?})",
            std::env::var("WGPU_BACKEND").unwrap_or_default(),
            wgpu::Instance::enabled_backend_features()
        ));
    }
    let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle();
    descriptor.backends = backends;
    descriptor.flags = wgpu::InstanceFlags::empty();
    // Instance creation loads the driver libraries; a broken driver must not take the process down.
    let instance = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wgpu::Instance::new(descriptor)
    }))
    .map_err(|_| "creating the wgpu instance panicked".to_string())?;
    let adapters = compute_core::block_on(instance.enumerate_adapters(backends));
    if adapters.is_empty() {
        return Err(format!(
            "wgpu found no adapter for backends {backends:?} (is a Vulkan driver installed? \
             on Debian: mesa-vulkan-drivers libvulkan1)"
        ));
    }
    Ok(Adapters { instance, adapters })
}

fn adapters() -> Result<&'static Adapters, String> {
    ADAPTERS
        .get_or_init(discover)
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether wgpu has at least one adapter here; the reason if not.
pub fn availability() -> Result<(), String> {
    adapters().map(|_| ())
}

/// Number of adapters wgpu found (0 when unavailable).
pub fn adapter_count() -> u32 {
    adapters().map_or(0, |a| a.adapters.len() as u32)
}

/// Number of logical devices: `COMPUTE_WGPU_DEVICES` when set to a positive number, else the
/// number of adapters, at least [`MIN_LOGICAL_DEVICES`]; 0 when wgpu has no adapter.
pub fn device_count() -> u32 {
    let adapters = adapter_count();
    if adapters == 0 {
        return 0;
    }
    compute_core::env::positive::<u32>("COMPUTE_WGPU_DEVICES")
        .unwrap_or(adapters.max(MIN_LOGICAL_DEVICES))
}

/// The adapter a logical device runs on, and the instance it belongs to.
pub(crate) fn adapter_of(device: WgpuDevice) -> Result<(wgpu::Instance, wgpu::Adapter), String> {
    let all = adapters()?;
    let count = device_count();
    if device.index >= count {
        return Err(format!(
            "wgpu device {} does not exist ({count} logical devices over {} adapters; set COMPUTE_WGPU_DEVICES for more)",
            device.index,
            all.adapters.len()
        ));
    }
    let adapter = all.adapters[(device.index as usize) % all.adapters.len()].clone();
    Ok((all.instance.clone(), adapter))
}

/// A fresh `wgpu::Device` and queue on the adapter of `device`, requested like the server's
/// (the adapter's limits and non-experimental features): for interop and raw-wgpu baselines.
///
/// # Errors
/// The reason when the device does not exist or wgpu refuses the request.
pub fn raw_device(device: WgpuDevice) -> Result<(wgpu::Device, wgpu::Queue), String> {
    let (_instance, adapter) = adapter_of(device)?;
    let request = adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("compute-wgpu raw"),
        required_features: adapter.features() - wgpu::Features::all_experimental_mask(),
        required_limits: adapter.limits(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    });
    compute_core::block_on(request).map_err(|e| e.to_string())
}

/// The properties of logical device `index` on `adapter`, requested with `limits`.
pub(crate) fn properties(
    index: WgpuDevice,
    adapter: &wgpu::AdapterInfo,
    limits: &wgpu::Limits,
    caps: ShaderCapabilities,
    timestamps: bool,
    alignment: u64,
) -> DeviceProperties {
    // Rounded down to the slice alignment: every size up to it allocates (the pools pad a
    // request to the alignment, and a padded request must still fit one buffer).
    let max_page = limits
        .max_buffer_size
        .min(limits.max_storage_buffer_binding_size)
        / alignment
        * alignment;
    DeviceProperties {
        name: format!(
            "wgpu:{} {} ({:?})",
            index.index, adapter.name, adapter.backend
        ),
        backend: "wgpu".into(),
        memory: MemoryDeviceProperties {
            max_page_size: max_page,
            alignment,
        },
        memory_total: None,
        hardware: HardwareProperties {
            plane_size_min: adapter.subgroup_min_size,
            plane_size_max: adapter.subgroup_max_size,
            max_units_per_cube: limits.max_compute_invocations_per_workgroup,
            max_cube_dim: [
                limits.max_compute_workgroup_size_x,
                limits.max_compute_workgroup_size_y,
                limits.max_compute_workgroup_size_z,
            ],
            max_cube_count: [limits.max_compute_workgroups_per_dimension; 3],
            max_shared_memory_bytes: u64::from(limits.max_compute_workgroup_storage_size),
            num_compute_units: 1,
            max_load_bytes: 16,
            max_private_bytes_per_unit:
                compute_core::properties::DEFAULT_MAX_PRIVATE_BYTES_PER_UNIT,
        },
        features: Features {
            elem_types: caps.elem_types(),
            plane_ops: caps.subgroups,
            atomics: true,
            graphs: true,
            device_timestamps: timestamps,
            collectives: true,
        },
        timing: TimingMethod::with_timestamps(timestamps),
        pitch_alignment: None,
    }
}
