//! The SPIR-V emitter.

use compute_core::ServerError;
use compute_core::kernel::KernelDefinition;

use super::{SpirvCaps, SpirvKernel};

/// Compile `kernel` to SPIR-V for a device with `caps`; `checked` adds the bounds checks of
/// `launch` to global memory accesses.
///
/// # Errors
/// [`ServerError::Unsupported`] naming the element type, width or operation the device lacks.
pub fn compile(
    kernel: &KernelDefinition,
    caps: &SpirvCaps,
    checked: bool,
) -> Result<SpirvKernel, ServerError> {
    let _ = (caps, checked);
    Err(ServerError::Unsupported(format!(
        "vulkan: the SPIR-V emitter is being written; kernel `{}` cannot be compiled yet",
        kernel.name()
    )))
}
