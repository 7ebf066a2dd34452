//! NVRTC compilation of generated CUDA C++, and the on-disk module cache.
//!
//! A compiled kernel is a CUBIN for the device's exact architecture. On disk it is kept under
//! [`cache_dir`], named by kernel id, checked/unchecked, architecture, driver version and code
//! generator version, so a second process start loads it without invoking NVRTC. The CUDA C++
//! itself comes from [`codegen`].

pub mod codegen;

use std::ffi::CString;
use std::path::PathBuf;

use compute_core::ServerError;
use compute_core::kernel::{KernelDefinition, KernelId};
use cudarc::driver::{result, sys};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use codegen::{CODEGEN_VERSION, ENTRY, ParamLayout};

use crate::driver::{Check, Raw};

/// Shared memory a kernel may use without opting in, in bytes.
const DEFAULT_SHARED_LIMIT: usize = 48 << 10;

/// A kernel loaded into the device's context, ready to launch.
#[derive(Debug)]
pub struct CompiledKernel {
    module: Raw<sys::CUmodule>,
    pub(crate) function: Raw<sys::CUfunction>,
    /// The parameters the function takes.
    pub layout: ParamLayout,
    /// Units per cube.
    pub cube_dim: [u32; 3],
    /// Whether the module came from the disk cache.
    pub from_disk: bool,
}

impl Drop for CompiledKernel {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by `compile` and no launch can start after the drop.
        crate::driver::released("cuModuleUnload", unsafe {
            result::module::unload(self.module.0)
        });
    }
}

/// Where compiled modules are kept: `$COMPUTE_CUDA_CACHE_DIR` (empty or `off` disables it), else
/// `$XDG_CACHE_HOME/compute-cuda`, else `$HOME/.cache/compute-cuda`.
pub fn cache_dir() -> Option<PathBuf> {
    compute_core::env::cache_dir("COMPUTE_CUDA_CACHE_DIR", "compute-cuda")
}

static NVRTC_COMPILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static DISK_LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The kernel compiles of this process, over every device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CompileCounts {
    /// Kernels compiled by NVRTC.
    pub nvrtc: u64,
    /// Kernels loaded from the disk cache ([`cache_dir`]) without invoking NVRTC.
    pub disk_loads: u64,
}

/// How many kernels this process compiled with NVRTC and loaded from the disk cache so far.
pub fn compile_counts() -> CompileCounts {
    use std::sync::atomic::Ordering::Relaxed;
    CompileCounts {
        nvrtc: NVRTC_COMPILES.load(Relaxed),
        disk_loads: DISK_LOADS.load(Relaxed),
    }
}

/// What a compile depends on besides the kernel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub(crate) major: i64,
    pub(crate) minor: i64,
    pub(crate) driver: i32,
}

fn cache_path(id: KernelId, checked: bool, target: Target) -> Option<PathBuf> {
    let mode = if checked { "c" } else { "u" };
    cache_dir().map(|dir| {
        dir.join(format!(
            "{id}-{mode}-sm{}{}-drv{}-g{CODEGEN_VERSION}.cubin",
            target.major, target.minor, target.driver
        ))
    })
}

/// Compile (or load from disk) `definition` for `target`; the context must be current.
pub(crate) fn compile(
    definition: &KernelDefinition,
    id: KernelId,
    checked: bool,
    target: Target,
) -> Result<CompiledKernel, ServerError> {
    let generated = codegen::generate(definition, checked)?;
    let path = cache_path(id, checked, target);
    let cached = path.as_ref().and_then(|p| std::fs::read(p).ok());
    let (image, from_disk) = match cached {
        Some(image) => (image, true),
        None => {
            let image = nvrtc_compile(definition.name(), &generated.source, target)?;
            if let Some(path) = &path {
                store(path, &image);
            }
            (image, false)
        }
    };
    let (module, function) = match load(&image) {
        Ok(loaded) => {
            if from_disk {
                DISK_LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            loaded
        }
        // A stale or truncated cache entry: compile afresh.
        Err(_) if from_disk => {
            let image = nvrtc_compile(definition.name(), &generated.source, target)?;
            if let Some(path) = &path {
                store(path, &image);
            }
            load(&image)?
        }
        Err(e) => return Err(e),
    };
    let kernel = CompiledKernel {
        module: Raw(module),
        function: Raw(function),
        layout: generated.layout,
        cube_dim: definition.cube_dim(),
        from_disk,
    };
    if kernel.layout.shared_bytes > DEFAULT_SHARED_LIMIT {
        // SAFETY: `function` belongs to the module just loaded.
        unsafe {
            sys::cuFuncSetAttribute(
                function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                kernel.layout.shared_bytes as i32,
            )
        }
        .result()
        .check("cuFuncSetAttribute(max dynamic shared memory)")?;
    }
    Ok(kernel)
}

/// Write `image` to `path` atomically (a temporary file renamed), ignoring failures: the cache is
/// an optimisation.
fn store(path: &std::path::Path, image: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, image).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn load(image: &[u8]) -> Result<(sys::CUmodule, sys::CUfunction), ServerError> {
    // SAFETY: `image` is a complete CUBIN produced by NVRTC (or read back from the cache, where a
    // corrupt file makes the driver return an error, not crash).
    let module =
        unsafe { result::module::load_data(image.as_ptr().cast()) }.check("cuModuleLoadData")?;
    let entry = CString::new(ENTRY).unwrap_or_else(|_| unreachable!("the entry name has no NUL"));
    // SAFETY: `module` was just loaded.
    match unsafe { result::module::get_function(module, entry) } {
        Ok(function) => Ok((module, function)),
        Err(e) => {
            // SAFETY: loaded above, unused.
            crate::driver::released("cuModuleUnload", unsafe { result::module::unload(module) });
            Err(crate::driver::driver_error("cuModuleGetFunction", e))
        }
    }
}

/// NVRTC: generated source -> CUBIN for `sm_XY`; a failure carries the compiler log.
fn nvrtc_compile(name: &str, source: &str, target: Target) -> Result<Vec<u8>, ServerError> {
    NVRTC_COMPILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if !crate::driver::nvrtc_available() {
        return Err(ServerError::Unavailable(
            "libnvrtc not found: CUDA kernels cannot be compiled".into(),
        ));
    }
    let src = CString::new(source)
        .map_err(|_| ServerError::Compilation("generated source contains a NUL byte".into()))?;
    let file = CString::new(format!("{}.cu", sanitize(name)))
        .map_err(|_| ServerError::Compilation("kernel name contains a NUL byte".into()))?;
    let nvrtc_err = |what: &str, e: nvrtc::NvrtcError| {
        ServerError::Compilation(format!("{what} for kernel `{name}`: {e:?}"))
    };
    let program =
        nvrtc::create_program(&src, Some(&file)).map_err(|e| nvrtc_err("nvrtcCreateProgram", e))?;
    let options = [
        format!("--gpu-architecture=sm_{}{}", target.major, target.minor),
        "--std=c++17".to_string(),
        "--fmad=false".to_string(),
        "--device-as-default-execution-space".to_string(),
    ];
    // SAFETY: `program` was created above and is destroyed once below.
    let compiled = unsafe { nvrtc::compile_program(program, &options) };
    let outcome = match compiled {
        Ok(()) => cubin(program).map_err(|e| nvrtc_err("nvrtcGetCUBIN", e)),
        Err(e) => {
            // SAFETY: `program` is alive.
            let log = unsafe { nvrtc::get_program_log(program) }
                .map(|raw| {
                    let bytes: Vec<u8> = raw
                        .iter()
                        .map(|&c| c as u8)
                        .take_while(|&b| b != 0)
                        .collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_default();
            Err(ServerError::Compilation(format!(
                "NVRTC failed to compile kernel `{name}` ({e:?}):\n{log}\n--- generated source ---\n{source}"
            )))
        }
    };
    // SAFETY: created above, destroyed once.
    if let Err(e) = unsafe { nvrtc::destroy_program(program) } {
        crate::driver::record_release_error(ServerError::Compilation(format!(
            "nvrtcDestroyProgram failed for kernel `{name}`: {e:?}"
        )));
    }
    outcome
}

fn cubin(program: nvrtc_sys::nvrtcProgram) -> Result<Vec<u8>, nvrtc::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: `program` compiled successfully; the size is written to a local.
    unsafe { nvrtc_sys::nvrtcGetCUBINSize(program, &mut size) }.result()?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds exactly `size` bytes, as NVRTC asked for.
    unsafe { nvrtc_sys::nvrtcGetCUBIN(program, image.as_mut_ptr().cast()) }.result()?;
    Ok(image)
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
