//! Loading the driver, its errors, and the primary context every server call makes current.

use std::sync::OnceLock;

use compute_core::ServerError;
use cudarc::driver::{DriverError, result, sys};

/// Whether `libcuda` can be loaded, checked without letting cudarc panic.
pub fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library; no symbol is called.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Whether `libnvrtc` can be loaded (kernels cannot be compiled without it).
pub fn nvrtc_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library; no symbol is called.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// Whether `libnccl` can be loaded (collectives need it).
pub(crate) fn nccl_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library; no symbol is called.
    *PRESENT.get_or_init(|| unsafe { cudarc::nccl::sys::is_culib_present() })
}

/// Load and initialise the driver once; the reason when it cannot be.
pub(crate) fn init() -> Result<(), String> {
    static INIT: OnceLock<Result<(), String>> = OnceLock::new();
    INIT.get_or_init(|| {
        if !driver_available() {
            return Err("libcuda.so.1 not found".into());
        }
        result::init().map_err(|e| format!("cuInit failed: {}", describe(e)))
    })
    .clone()
}

/// Number of CUDA devices, 0 when the driver is unavailable.
pub(crate) fn device_count() -> u32 {
    if init().is_err() {
        return 0;
    }
    result::device::get_count().map_or(0, |n| n.max(0) as u32)
}

/// `CUDA_ERROR_NAME: description`.
pub(crate) fn describe(error: DriverError) -> String {
    let name = error
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", error.0));
    let text = error
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{name}: {text}")
}

/// Errors the driver raised while releasing something (a free, a destroy, an unload), which
/// happens in `Drop` or in the pools with no caller to return them to. They are recorded here and
/// returned by the next `flush`, `sync` or read of any CUDA server of this process, as cudarc's
/// `record_err` does: never discarded.
static RELEASE_ERRORS: spin::Mutex<std::collections::VecDeque<ServerError>> =
    spin::Mutex::new(std::collections::VecDeque::new());

/// Failures to inject into the next releases of one call (for tests: the driver cannot be made
/// to fail a free on demand): the call's name and how many.
static INJECTED_RELEASE_FAILURES: spin::Mutex<Option<(String, u32)>> = spin::Mutex::new(None);

/// Record the outcome of a release (`what` names the call). An error is kept for the next report.
pub(crate) fn released(what: &str, outcome: Result<(), DriverError>) {
    let injected = {
        let mut slot = INJECTED_RELEASE_FAILURES.lock();
        match slot.as_mut() {
            Some((call, n)) if call == what && *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    };
    let outcome = if injected {
        outcome.and(Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)))
    } else {
        outcome
    };
    if let Err(e) = outcome {
        RELEASE_ERRORS.lock().push_back(driver_error(what, e));
    }
}

/// Record an error of a release that is not a driver call (NVRTC's program destroy).
pub(crate) fn record_release_error(error: ServerError) {
    RELEASE_ERRORS.lock().push_back(error);
}

/// Record the status of a raw `sys` release call.
pub(crate) fn released_raw(what: &str, status: sys::CUresult) {
    released(what, status.result());
}

/// The first release error recorded since the last report (the rest are discarded and counted,
/// as `compute_core::error::take_first` does for every error queue).
pub(crate) fn take_release_error() -> Result<(), ServerError> {
    compute_core::error::take_result(&mut RELEASE_ERRORS.lock())
}

/// Make the next `count` releases through the driver call `call` (`cuMemFree`,
/// `cuEventDestroy`, ...) report `CUDA_ERROR_INVALID_VALUE` after the real call, to test that
/// such errors reach the caller. Not for production use.
#[doc(hidden)]
pub fn inject_release_failures(call: &str, count: u32) {
    *INJECTED_RELEASE_FAILURES.lock() = Some((call.to_owned(), count));
}

/// A driver error as the runtime reports it, with what was being done.
pub(crate) fn driver_error(what: &str, error: DriverError) -> ServerError {
    let message = format!("{what}: {}", describe(error));
    match error.0 {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => ServerError::OutOfMemory {
            requested: 0,
            reason: message,
        },
        sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        | sys::CUresult::CUDA_ERROR_LAUNCH_FAILED
        | sys::CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | sys::CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
        | sys::CUresult::CUDA_ERROR_LAUNCH_TIMEOUT
        | sys::CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
        | sys::CUresult::CUDA_ERROR_ASSERT => ServerError::Execution(message),
        sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        | sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        | sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED
        | sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
        | sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => {
            compute_core::CaptureError::Driver {
                call: what.into(),
                message: describe(error),
            }
            .into()
        }
        _ => ServerError::Driver(message),
    }
}

/// Extension turning `Result<T, DriverError>` into `Result<T, ServerError>`.
pub(crate) trait Check<T> {
    /// Map the error with [`driver_error`].
    fn check(self, what: &str) -> Result<T, ServerError>;
}

impl<T> Check<T> for Result<T, DriverError> {
    fn check(self, what: &str) -> Result<T, ServerError> {
        self.map_err(|e| driver_error(what, e))
    }
}

/// A raw driver handle that may move between threads (the driver API is thread safe).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Raw<T>(pub T);

// SAFETY: CUDA driver handles (contexts, streams, events, modules) may be used from any thread;
// the server serialises mutation through its lock.
unsafe impl<T> Send for Raw<T> {}
// SAFETY: as above; shared access only copies the handle value.
unsafe impl<T> Sync for Raw<T> {}

/// The retained primary context of one device. Released on drop.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) device: sys::CUdevice,
    pub(crate) ctx: Raw<sys::CUcontext>,
}

impl Context {
    /// Retain the primary context of the device with driver ordinal `ordinal`.
    pub(crate) fn retain(ordinal: u32) -> Result<Self, ServerError> {
        init().map_err(ServerError::Unavailable)?;
        let count = device_count();
        if ordinal >= count {
            return Err(ServerError::DeviceNotFound {
                backend: "cuda",
                index: ordinal as usize,
                count: count as usize,
                help: "",
            });
        }
        let device = result::device::get(ordinal as i32).check("cuDeviceGet")?;
        // SAFETY: `device` is a valid ordinal returned by the driver.
        let ctx =
            unsafe { result::primary_ctx::retain(device) }.check("cuDevicePrimaryCtxRetain")?;
        let context = Self {
            device,
            ctx: Raw(ctx),
        };
        context.bind()?;
        Ok(context)
    }

    /// Make the context current on the calling thread (cheap when it already is).
    pub(crate) fn bind(&self) -> Result<(), ServerError> {
        let raw = self.ctx.0 as usize;
        if CURRENT.with(|c| c.get()) == raw {
            return Ok(());
        }
        // SAFETY: the context is retained for as long as `self` lives.
        unsafe { result::ctx::set_current(self.ctx.0) }.check("cuCtxSetCurrent")?;
        CURRENT.with(|c| c.set(raw));
        Ok(())
    }

    /// An attribute of the device.
    pub(crate) fn attribute(&self, attribute: sys::CUdevice_attribute) -> i64 {
        // SAFETY: `device` is valid; the attribute enum comes from the bindings.
        unsafe { result::device::get_attribute(self.device, attribute) }.map_or(0, i64::from)
    }
}

thread_local! {
    /// The context [`Context::bind`] made current on this thread (0: unknown).
    static CURRENT: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
}

/// Forget which context is current on this thread: after a call that may have made another
/// one current (NCCL selects each communicator's device inside a group call), the next
/// [`Context::bind`] sets it again.
pub(crate) fn forget_current_context() {
    CURRENT.with(|c| c.set(0));
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: retained in `retain`; released once here.
        released("cuDevicePrimaryCtxRelease", unsafe {
            result::primary_ctx::release(self.device)
        });
    }
}

/// The driver version, e.g. 13000; 0 when the driver cannot say (the version is only reported,
/// nothing depends on it).
pub(crate) fn driver_version() -> i32 {
    let mut version = 0;
    // SAFETY: writes one int.
    match unsafe { sys::cuDriverGetVersion(&mut version) }.result() {
        Ok(()) => version,
        Err(_) => 0,
    }
}
