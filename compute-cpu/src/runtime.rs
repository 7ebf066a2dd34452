//! The CPU [`Runtime`].

use compute_core::memory::MemoryDeviceProperties;
use compute_core::{
    DeviceProperties, ElemType, Features, HardwareProperties, Runtime, ServerError, TimingMethod,
};

use crate::device::{CPU_DEVICE_TYPE, CpuDevice, device_count, host_memory_bytes};
use crate::server::CpuServer;

/// Row alignment of pitched tensors on the CPU: one AVX2 vector.
pub const CPU_PITCH_ALIGNMENT: usize = 32;

/// The CPU backend: always available, with [`device_count`] logical devices.
#[derive(Debug, Clone, Copy)]
pub struct CpuRuntime;

fn properties(device: CpuDevice) -> DeviceProperties {
    let total = host_memory_bytes();
    // Rounded down to the alignment the pools pad requests to.
    let max_page =
        total.unwrap_or(16 << 30) / crate::storage::CPU_ALIGNMENT * crate::storage::CPU_ALIGNMENT;
    DeviceProperties {
        // The executor and the instruction-set features in use, e.g.
        // `cpu:0 (jit; x86_64 avx2 fma sse4.1)`.
        name: format!(
            "cpu:{} ({}; {})",
            device.index,
            if crate::compiler::jit::enabled() {
                "jit"
            } else {
                "interpreter"
            },
            crate::compiler::jit::features().describe()
        ),
        backend: "cpu".into(),
        memory: MemoryDeviceProperties {
            max_page_size: max_page,
            alignment: crate::storage::CPU_ALIGNMENT,
        },
        memory_total: total,
        hardware: HardwareProperties {
            plane_size_min: crate::compiler::PLANE_SIZE,
            plane_size_max: crate::compiler::PLANE_SIZE,
            max_units_per_cube: crate::compiler::MAX_UNITS_PER_CUBE,
            max_cube_dim: [crate::compiler::MAX_UNITS_PER_CUBE; 3],
            max_cube_count: [u32::MAX; 3],
            max_shared_memory_bytes: crate::compiler::MAX_SHARED_MEMORY_BYTES,
            num_compute_units: rayon::current_num_threads() as u32,
            max_load_bytes: 64,
            max_private_bytes_per_unit:
                compute_core::properties::DEFAULT_MAX_PRIVATE_BYTES_PER_UNIT,
        },
        features: Features {
            elem_types: ElemType::ALL.to_vec(),
            plane_ops: true,
            atomics: true,
            graphs: true,
            device_timestamps: false,
            collectives: true,
        },
        timing: TimingMethod::Host,
        pitch_alignment: Some(CPU_PITCH_ALIGNMENT),
    }
}

impl Runtime for CpuRuntime {
    type Server = CpuServer;
    type Device = CpuDevice;
    const DEVICE_TYPE: u16 = CPU_DEVICE_TYPE;

    fn name() -> &'static str {
        "cpu"
    }

    fn availability() -> Result<(), String> {
        Ok(())
    }

    fn create_server(device: &CpuDevice) -> Result<CpuServer, ServerError> {
        let count = device_count();
        if device.index >= count {
            return Err(ServerError::DeviceNotFound {
                backend: "cpu",
                index: device.index as usize,
                count: count as usize,
                help: "; set COMPUTE_CPU_DEVICES for more",
            });
        }
        Ok(CpuServer::new(*device, properties(*device)))
    }

    fn device_count() -> u32 {
        device_count()
    }
}
