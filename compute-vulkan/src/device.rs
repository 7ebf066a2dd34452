//! Vulkan devices: the process-wide instance (loader opened at run time), its physical devices,
//! and the optional Khronos validation layer.

use std::ffi::{CStr, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use ash::vk;
use compute_core::{Device, DeviceId};

/// The device type id of every Vulkan device (ASCII `v`).
///
/// Distinct from the other backends' ids: compute-core's host rendezvous for collectives is keyed
/// by [`DeviceId`] alone.
pub const VULKAN_DEVICE_TYPE: u16 = 0x76;

/// Environment variable that enables `VK_LAYER_KHRONOS_validation` with a debug messenger.
pub const VALIDATION_ENV: &str = "COMPUTE_VULKAN_VALIDATION";

/// Environment variable that overrides the number of devices (logical devices over the physical
/// ones, round robin), so that multi-device paths can be exercised on a single GPU.
pub const DEVICES_ENV: &str = "COMPUTE_VULKAN_DEVICES";

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// A Vulkan device: device `i` is physical device `i` (see [`device_count`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VulkanDevice {
    /// Index of the device.
    pub index: u32,
}

impl VulkanDevice {
    /// The device with the given index.
    pub const fn new(index: u32) -> Self {
        Self { index }
    }
}

impl Device for VulkanDevice {
    fn to_id(&self) -> DeviceId {
        DeviceId::new(VULKAN_DEVICE_TYPE, self.index)
    }

    fn from_id(id: DeviceId) -> Self {
        Self { index: id.index_id }
    }
}

/// The process-wide Vulkan instance. Never destroyed: servers and futures may outlive any scope.
pub(crate) struct Instance {
    pub(crate) entry: ash::Entry,
    pub(crate) instance: ash::Instance,
    pub(crate) physical: Vec<vk::PhysicalDevice>,
    /// Instance API version requested (and supported).
    pub(crate) api_version: u32,
    _messenger: Option<(ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
}

static INSTANCE: OnceLock<Result<Instance, String>> = OnceLock::new();
static VALIDATION_MESSAGES: AtomicU64 = AtomicU64::new(0);

/// Warnings and errors reported by the validation layer so far in this process (0 when
/// [`VALIDATION_ENV`] is not set).
pub fn validation_message_count() -> u64 {
    VALIDATION_MESSAGES.load(Ordering::SeqCst)
}

/// Whether this process runs with the Khronos validation layer.
pub fn validation_enabled() -> bool {
    compute_core::env::flag(VALIDATION_ENV, false)
}

unsafe extern "system" fn on_validation_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    kind: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    VALIDATION_MESSAGES.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the layer passes a valid callback data pointer (or null) for the call's duration.
    let message = unsafe { data.as_ref() }
        // SAFETY: the message is a NUL-terminated string owned by the layer during the call.
        .and_then(|d| unsafe { d.message_as_c_str() })
        .map(|m| m.to_string_lossy().into_owned())
        .unwrap_or_default();
    let level = if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        "error"
    } else {
        "warning"
    };
    eprintln!(
        "[vulkan validation {level}, type {:#x}] {message}",
        kind.as_raw()
    );
    vk::FALSE
}

fn create_instance() -> Result<Instance, String> {
    // SAFETY: loading the Vulkan loader library runs its initialisers; that is the documented way
    // of using it, and a missing library is an error, not UB.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| {
        format!(
            "cannot load the Vulkan loader ({e}); install libvulkan1 and a driver (Debian: mesa-vulkan-drivers libvulkan1)"
        )
    })?;
    // SAFETY: a plain query of the loader.
    let version = unsafe { entry.try_enumerate_instance_version() }
        .map_err(|e| format!("vkEnumerateInstanceVersion failed: {e}"))?
        .unwrap_or(vk::API_VERSION_1_0);
    if version < vk::API_VERSION_1_2 {
        return Err(format!(
            "the Vulkan loader offers version {}.{}, compute-vulkan needs 1.2 (timeline semaphores)",
            vk::api_version_major(version),
            vk::api_version_minor(version)
        ));
    }
    let api_version = version.min(vk::API_VERSION_1_3);
    let validation = validation_enabled();
    let mut layers = Vec::new();
    let mut extensions = Vec::new();
    if validation {
        // SAFETY: a plain query of the loader.
        let available = unsafe { entry.enumerate_instance_layer_properties() }
            .map_err(|e| format!("vkEnumerateInstanceLayerProperties failed: {e}"))?;
        let found = available
            .iter()
            .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == VALIDATION_LAYER));
        if !found {
            return Err(format!(
                "{VALIDATION_ENV} is set but {} is not installed",
                VALIDATION_LAYER.to_string_lossy()
            ));
        }
        layers.push(VALIDATION_LAYER.as_ptr());
        extensions.push(ash::ext::debug_utils::NAME.as_ptr());
    }
    let app = vk::ApplicationInfo::default()
        .application_name(c"compute-vulkan")
        .engine_name(c"compute-vulkan")
        .api_version(api_version);
    let mut messenger_info = vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(on_validation_message));
    let mut info = vk::InstanceCreateInfo::default()
        .application_info(&app)
        .enabled_layer_names(&layers)
        .enabled_extension_names(&extensions);
    if validation {
        // Also reports problems of vkCreateInstance / vkDestroyInstance themselves.
        info = info.push_next(&mut messenger_info);
    }
    // SAFETY: every pointer in `info` refers to locals that outlive the call.
    let instance = unsafe { entry.create_instance(&info, None) }
        .map_err(|e| format!("vkCreateInstance failed: {e}"))?;
    let messenger = if validation {
        let utils = ash::ext::debug_utils::Instance::new(&entry, &instance);
        // SAFETY: the instance was created with VK_EXT_debug_utils; the callback is 'static.
        let handle = unsafe { utils.create_debug_utils_messenger(&messenger_info, None) }
            .map_err(|e| format!("vkCreateDebugUtilsMessengerEXT failed: {e}"))?;
        Some((utils, handle))
    } else {
        None
    };
    // SAFETY: the instance is valid.
    let physical = unsafe { instance.enumerate_physical_devices() }
        .map_err(|e| format!("vkEnumeratePhysicalDevices failed: {e}"))?;
    let physical: Vec<vk::PhysicalDevice> = physical
        .into_iter()
        .filter(|&p| {
            // SAFETY: `p` was just enumerated from this instance.
            let props = unsafe { instance.get_physical_device_properties(p) };
            props.api_version >= vk::API_VERSION_1_2
        })
        .collect();
    if physical.is_empty() {
        return Err(
            "the Vulkan loader found no physical device supporting Vulkan 1.2 (is a driver installed? on Debian: mesa-vulkan-drivers)"
                .into(),
        );
    }
    Ok(Instance {
        entry,
        instance,
        physical,
        api_version,
        _messenger: messenger,
    })
}

/// The process-wide instance, created on first use.
pub(crate) fn instance() -> Result<&'static Instance, String> {
    INSTANCE
        .get_or_init(create_instance)
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether a Vulkan loader, a driver and a device are present; the reason if not.
pub fn availability() -> Result<(), String> {
    instance().map(|_| ())
}

/// Number of physical devices (0 when Vulkan is unavailable).
pub fn physical_device_count() -> u32 {
    instance().map_or(0, |i| i.physical.len() as u32)
}

/// Number of devices: one per physical device, or `COMPUTE_VULKAN_DEVICES` when set to a positive
/// number (logical devices over the physical ones, round robin); 0 when Vulkan is unavailable.
pub fn device_count() -> u32 {
    let physical = physical_device_count();
    if physical == 0 {
        return 0;
    }
    compute_core::env::positive::<u32>(DEVICES_ENV).unwrap_or(physical)
}

/// The physical device behind `device`.
pub(crate) fn physical_of(
    device: VulkanDevice,
) -> Result<(&'static Instance, vk::PhysicalDevice), String> {
    let instance = instance()?;
    let count = device_count();
    if device.index >= count {
        return Err(format!(
            "vulkan device {} does not exist ({count} devices over {} physical devices)",
            device.index,
            instance.physical.len()
        ));
    }
    let physical = instance.physical[device.index as usize % instance.physical.len()];
    Ok((instance, physical))
}

/// The loader, the process-wide instance and the physical device behind `device`: for interop
/// and raw-ash baselines.
///
/// # Errors
/// The reason when Vulkan is unavailable or the device does not exist.
pub fn raw_instance(
    device: VulkanDevice,
) -> Result<
    (
        &'static ash::Entry,
        &'static ash::Instance,
        vk::PhysicalDevice,
    ),
    String,
> {
    let (instance, physical) = physical_of(device)?;
    Ok((&instance.entry, &instance.instance, physical))
}
