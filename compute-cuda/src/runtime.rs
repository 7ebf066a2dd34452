//! The CUDA [`Runtime`].

use std::sync::Arc;

use compute_core::memory::MemoryDeviceProperties;
use compute_core::{
    DeviceProperties, ElemType, Features, HardwareProperties, Runtime, ServerError, TimingMethod,
};
use cudarc::driver::{result, sys};

use crate::device::{CUDA_DEVICE_TYPE, CudaDevice};
use crate::driver::{self, Context};
use crate::server::CudaServer;
use crate::storage::CUDA_ALIGNMENT;

/// Row alignment of pitched tensors: one 128-byte cache line.
pub const CUDA_PITCH_ALIGNMENT: usize = 128;

/// The CUDA backend: every GPU the driver reports.
#[derive(Debug, Clone, Copy)]
pub struct CudaRuntime;

pub(crate) fn properties(context: &Context) -> DeviceProperties {
    use sys::CUdevice_attribute as A;
    let attr = |a| context.attribute(a);
    let name = result::device::get_name(context.device).unwrap_or_else(|_| "CUDA device".into());
    // SAFETY: the device is valid.
    let total = unsafe { result::device::total_mem(context.device) }
        .ok()
        .map(|t| t as u64);
    let shared = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .max(attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
    let warp = attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE).max(1) as u32;
    DeviceProperties {
        name,
        backend: "cuda".into(),
        memory: MemoryDeviceProperties {
            // Rounded down to the alignment the pools pad requests to.
            max_page_size: total.unwrap_or(1 << 34) / CUDA_ALIGNMENT * CUDA_ALIGNMENT,
            alignment: CUDA_ALIGNMENT,
        },
        memory_total: total,
        hardware: HardwareProperties {
            plane_size_min: warp,
            plane_size_max: warp,
            max_units_per_cube: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) as u32,
            max_cube_dim: [
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X) as u32,
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y) as u32,
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z) as u32,
            ],
            max_cube_count: [
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X) as u32,
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y) as u32,
                attr(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z) as u32,
            ],
            max_shared_memory_bytes: shared as u64,
            num_compute_units: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) as u32,
            max_load_bytes: 16,
            max_private_bytes_per_unit: 512 * 1024,
        },
        features: Features {
            elem_types: ElemType::ALL.to_vec(),
            plane_ops: true,
            atomics: true,
            graphs: true,
            device_timestamps: true,
            collectives: driver::nccl_available(),
        },
        timing: TimingMethod::Device,
        pitch_alignment: Some(CUDA_PITCH_ALIGNMENT),
    }
}

impl Runtime for CudaRuntime {
    type Server = CudaServer;
    type Device = CudaDevice;
    const DEVICE_TYPE: u16 = CUDA_DEVICE_TYPE;

    fn name() -> &'static str {
        "cuda"
    }

    fn availability() -> Result<(), String> {
        driver::init()?;
        if driver::device_count() == 0 {
            return Err("the CUDA driver reports no device".into());
        }
        if !driver::nvrtc_available() {
            return Err("libnvrtc not found (kernels cannot be compiled)".into());
        }
        Ok(())
    }

    fn create_server(device: &CudaDevice) -> Result<CudaServer, ServerError> {
        let context = Arc::new(Context::retain(device.index)?);
        let properties = properties(&context);
        CudaServer::new(*device, context, properties)
    }

    fn device_count() -> u32 {
        driver::device_count()
    }
}
