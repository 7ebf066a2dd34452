//! A cranelift JIT for the kernel IR: each kernel becomes one native function that runs a cube.
//!
//! [`compile`](super::compile) builds the function once (the server caches plans by kernel id,
//! so once per kernel). Kernels it does not cover (barriers or plane operations under range loops
//! whose bounds differ between units, or a `break` out of a range loop that holds a barrier) are
//! left to the interpreter, which stays the reference. The switch is `COMPUTE_CPU_JIT` (`0` for
//! the interpreter; on by default; `COMPUTE_CPU_JIT_LOG=1` logs each fallback), and
//! `COMPUTE_CPU_SIMD=baseline` makes both paths use only the baseline instruction set (SSE2 on
//! x86-64), to check the path taken on CPUs without AVX2 or FMA.
//!
//! Global memory: in checked launches the generated code bounds-checks every access (out-of-range
//! loads read 0 from a zero area, stores and atomics land in a per-worker sink), except loads and
//! stores at `absolute_pos` in cubes whose whole run is in range (one test per cube); unchecked
//! launches trust global indices, as the interpreter does (shared and local arrays are always
//! checked). Loads and stores are machine instructions, outside Rust's memory model, so racing
//! kernels read torn values, never undefined behaviour.

mod analysis;
mod emit;
mod helpers;
#[cfg(test)]
mod tests;

use core::ops::Range;
use std::sync::OnceLock;

use compute_core::kernel::KernelDefinition;
use cranelift_codegen::ir::{AbiParam, UserFuncName, types};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use rayon::prelude::*;

use super::plan::scalar_bits;
use super::run::Launch;

/// One bound buffer as the generated code reads it.
#[repr(C)]
pub(super) struct BufDesc {
    ptr: *mut u8,
    /// Entries of the buffer's item.
    len: u64,
}

/// Tensor metadata of one buffer, for the `shape`/`stride`/`rank` helpers.
#[repr(C)]
pub(super) struct Meta {
    shape: *const usize,
    shape_len: usize,
    strides: *const usize,
    strides_len: usize,
}

/// What a launch passes the generated code.
#[repr(C)]
pub(super) struct Ctx {
    bufs: *const BufDesc,
    scalars: *const u64,
    metas: *const Meta,
    zeros: *const u8,
    cube_count: [u32; 3],
    /// 1 for an unchecked launch: global indices are trusted.
    unchecked: u32,
}

const CTX_BUFS: i32 = 0;
const CTX_SCALARS: i32 = 8;
const CTX_ZEROS: i32 = 24;
const CTX_COUNT: i32 = 32;
const CTX_UNCHECKED: i32 = 44;

/// Zeros that out-of-range loads read (as large as the largest item).
static ZEROS: [u64; 16] = [0; 16];

struct SharedCtx(Ctx);

// SAFETY: the pointers in the context are only read (buffers, scalars, metadata and zeros) or
// written through the generated code under the launch contract of `Plan::execute`, which makes
// sharing the launch across the pool's threads sound, as for the interpreter's `GlobalMem`.
unsafe impl Sync for SharedCtx {}

/// `fn(ctx, cube_x, cube_y, cube_z, cube_linear, state, shared)`.
type CubeFn = unsafe extern "C" fn(*const Ctx, u32, u32, u32, u32, *mut u8, *mut u8);

/// Instruction-set features the code generator and the interpreter's lane kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features {
    /// x86-64 SSE4.1 (rounding instructions).
    pub sse41: bool,
    /// x86-64 AVX2.
    pub avx2: bool,
    /// Fused multiply-add (x86-64 FMA3; always on aarch64).
    pub fma: bool,
    /// x86-64 AVX-512F.
    pub avx512f: bool,
    /// aarch64 NEON.
    pub neon: bool,
    /// Whether `COMPUTE_CPU_SIMD=baseline` turned detection off.
    pub forced_baseline: bool,
}

impl Features {
    /// A short description, such as `x86-64 avx2 fma sse4.1`.
    pub fn describe(&self) -> String {
        let mut s = String::from(std::env::consts::ARCH);
        for (on, name) in [
            (self.avx512f, "avx512f"),
            (self.avx2, "avx2"),
            (self.fma, "fma"),
            (self.sse41, "sse4.1"),
            (self.neon, "neon"),
        ] {
            if on {
                s.push(' ');
                s.push_str(name);
            }
        }
        if self.forced_baseline {
            s.push_str(" (baseline forced by COMPUTE_CPU_SIMD)");
        } else if !self.avx2 && !self.neon {
            s.push_str(" (baseline)");
        }
        s
    }
}

/// The CPU features in use, detected once (`COMPUTE_CPU_SIMD=baseline` turns them all off).
pub fn features() -> Features {
    static F: OnceLock<Features> = OnceLock::new();
    *F.get_or_init(|| {
        if compute_core::env::text("COMPUTE_CPU_SIMD").is_some_and(|v| v.trim() == "baseline") {
            return Features {
                forced_baseline: true,
                ..Features::default()
            };
        }
        #[cfg(target_arch = "x86_64")]
        {
            Features {
                sse41: std::arch::is_x86_feature_detected!("sse4.1"),
                avx2: std::arch::is_x86_feature_detected!("avx2"),
                fma: std::arch::is_x86_feature_detected!("fma"),
                avx512f: std::arch::is_x86_feature_detected!("avx512f"),
                neon: false,
                forced_baseline: false,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            Features {
                neon: std::arch::is_aarch64_feature_detected!("neon"),
                fma: true,
                sse41: true,
                ..Features::default()
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Features::default()
        }
    })
}

/// Whether launches use the JIT (`COMPUTE_CPU_JIT=0` turns it off), read once.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| compute_core::env::flag("COMPUTE_CPU_JIT", true))
}

fn isa() -> Result<OwnedTargetIsa, String> {
    static ISA: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        let set = |f: &mut settings::Builder, k: &str, v: &str| {
            f.set(k, v).map_err(|e| format!("cranelift flag {k}: {e}"))
        };
        set(&mut flags, "opt_level", "speed")?;
        set(&mut flags, "is_pic", "false")?;
        set(&mut flags, "use_colocated_libcalls", "false")?;
        set(&mut flags, "enable_verifier", "false")?;
        let native = !features().forced_baseline;
        // Without native flags the ISA is the architecture's baseline (SSE2 on x86-64).
        let builder = cranelift_native::builder_with_options(native)
            .map_err(|e| format!("no cranelift backend for this CPU: {e}"))?;
        builder
            .finish(settings::Flags::new(flags))
            .map_err(|e| format!("cranelift ISA: {e}"))
    })
    .clone()
}

/// A kernel compiled to machine code.
pub(crate) struct JitKernel {
    module: Option<JITModule>,
    func: CubeFn,
    layout: emit::Layout,
    /// Descriptors the code of plane operations points at.
    _planes: helpers::PlaneSteps,
    /// Microseconds the compilation took.
    pub(crate) compile_us: f64,
}

impl core::fmt::Debug for JitKernel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("JitKernel")
            .field("layout", &self.layout)
            .field("compile_us", &self.compile_us)
            .finish()
    }
}

// SAFETY: after `finalize_definitions` the module's code and data are immutable; the function
// pointer is plain code, callable from any thread, and the module is only touched again when
// dropped (which frees the code, with no call running: the kernel is dropped with its plan).
unsafe impl Send for JitKernel {}
// SAFETY: as for `Send`: shared use only calls the immutable code.
unsafe impl Sync for JitKernel {}

impl Drop for JitKernel {
    fn drop(&mut self) {
        if let Some(m) = self.module.take() {
            // SAFETY: no call to `func` can run any more: it is only called through `&self`,
            // and we hold `&mut self`.
            unsafe { m.free_memory() };
        }
    }
}

fn helper_symbols(b: &mut JITBuilder) {
    use helpers::*;
    let f1: &[(&str, extern "C" fn(f32) -> f32)] = &[
        ("exp_f32", exp_f32),
        ("ln_f32", ln_f32),
        ("ln1p_f32", ln1p_f32),
        ("sin_f32", sin_f32),
        ("cos_f32", cos_f32),
        ("tanh_f32", tanh_f32),
        ("erf_f32", erf_f32),
        ("floor_f32", floor_f32),
        ("ceil_f32", ceil_f32),
        ("nearest_f32", nearest_f32),
        ("floorf", floor_f32),
        ("ceilf", ceil_f32),
        ("truncf", trunc_f32),
        ("nearbyintf", nearest_f32),
    ];
    for &(n, f) in f1 {
        b.symbol(n, f as *const u8);
    }
    let d1: &[(&str, extern "C" fn(f64) -> f64)] = &[
        ("exp_f64", exp_f64),
        ("ln_f64", ln_f64),
        ("ln1p_f64", ln1p_f64),
        ("sin_f64", sin_f64),
        ("cos_f64", cos_f64),
        ("tanh_f64", tanh_f64),
        ("erf_f64", erf_f64),
        ("floor_f64", floor_f64),
        ("ceil_f64", ceil_f64),
        ("nearest_f64", nearest_f64),
        ("floor", floor_f64),
        ("ceil", ceil_f64),
        ("trunc", trunc_f64),
        ("nearbyint", nearest_f64),
    ];
    for &(n, f) in d1 {
        b.symbol(n, f as *const u8);
    }
    b.symbol("pow_f32", pow_f32 as *const u8);
    b.symbol("pow_f64", pow_f64 as *const u8);
    b.symbol("rem_f32", rem_f32 as *const u8);
    b.symbol("rem_f64", rem_f64 as *const u8);
    b.symbol("fma_f32", fma_f32 as *const u8);
    b.symbol("fma_f64", fma_f64 as *const u8);
    b.symbol("fmaf", fma_f32 as *const u8);
    b.symbol("fma", fma_f64 as *const u8);
    b.symbol("f16_to_f32", f16_to_f32 as *const u8);
    b.symbol("f32_to_f16", f32_to_f16 as *const u8);
    b.symbol("bf16_to_f32", bf16_to_f32 as *const u8);
    b.symbol("f32_to_bf16", f32_to_bf16 as *const u8);
    b.symbol("f16_to_f64", f16_to_f64 as *const u8);
    b.symbol("f64_to_f16", f64_to_f16 as *const u8);
    b.symbol("bf16_to_f64", bf16_to_f64 as *const u8);
    b.symbol("f64_to_bf16", f64_to_bf16 as *const u8);
    b.symbol("atomic_add_f32", atomic_add_f32 as *const u8);
    b.symbol("meta", meta as *const u8);
    b.symbol("rank", rank as *const u8);
    b.symbol("plane_step", plane_step as *const u8);
}

/// Compile a kernel; `Err` says what the JIT does not cover (the interpreter runs it then).
pub(crate) fn compile(def: &KernelDefinition) -> Result<JitKernel, String> {
    // The target ISA is built once per process, outside the per-kernel time.
    let isa = isa()?;
    let start = std::time::Instant::now();
    let an = analysis::Analysis::new(def)?;
    let mut jb = JITBuilder::with_isa(isa, default_libcall_names());
    helper_symbols(&mut jb);
    let mut module = JITModule::new(jb);
    let mut ctx = module.make_context();
    let ptr = types::I64;
    let sig = &mut ctx.func.signature;
    sig.params.push(AbiParam::new(ptr));
    for _ in 0..4 {
        sig.params.push(AbiParam::new(types::I32));
    }
    sig.params.push(AbiParam::new(ptr));
    sig.params.push(AbiParam::new(ptr));
    let id = module
        .declare_function("cube", Linkage::Local, &ctx.func.signature)
        .map_err(|e| e.to_string())?;
    ctx.func.name = UserFuncName::user(0, id.as_u32());
    let mut fctx = FunctionBuilderContext::new();
    let (layout, planes) = {
        let b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let e = emit::Emitter::new(def, &an, b, &mut module, features())?;
        e.run()?
    };
    module
        .define_function(id, &mut ctx)
        .map_err(|e| format!("cranelift: {e:?}"))?;
    module.clear_context(&mut ctx);
    module.finalize_definitions().map_err(|e| e.to_string())?;
    let code = module.get_finalized_function(id);
    // SAFETY: `code` is the finalized function built above with exactly `CubeFn`'s signature
    // in the platform's C calling convention (the module's default).
    let func: CubeFn = unsafe { core::mem::transmute::<*const u8, CubeFn>(code) };
    Ok(JitKernel {
        module: Some(module),
        func,
        layout,
        _planes: planes,
        compile_us: start.elapsed().as_secs_f64() * 1e6,
    })
}

impl JitKernel {
    /// Run every cube of the launch.
    pub(crate) fn run_launch(&self, launch: &Launch<'_>) {
        let bufs: Vec<BufDesc> = launch
            .bufs
            .iter()
            .map(|m| BufDesc {
                ptr: m.ptr(),
                len: m.len(),
            })
            .collect();
        let scalars: Vec<u64> = launch.scalars.iter().map(|&s| scalar_bits(s)).collect();
        let metas: Vec<Meta> = launch
            .shapes
            .iter()
            .zip(&launch.strides)
            .map(|(s, t)| Meta {
                shape: s.as_ptr(),
                shape_len: s.len(),
                strides: t.as_ptr(),
                strides_len: t.len(),
            })
            .collect();
        let [x, y, z] = launch.cube_count;
        let ctx = SharedCtx(Ctx {
            bufs: bufs.as_ptr(),
            scalars: scalars.as_ptr(),
            metas: metas.as_ptr(),
            zeros: ZEROS.as_ptr().cast(),
            cube_count: [x, y, z],
            unchecked: (!launch.checked) as u32,
        });
        let total = x as u64 * y as u64 * z as u64;
        let (chunk, chunks, threads) = super::split(total);
        if chunks <= 1 || threads == 1 {
            self.run_cubes(&ctx, launch.cube_count, 0..total);
        } else {
            (0..chunks).into_par_iter().for_each(|c| {
                self.run_cubes(
                    &ctx,
                    launch.cube_count,
                    c * chunk..((c + 1) * chunk).min(total),
                );
            });
        }
    }

    fn run_cubes(&self, ctx: &SharedCtx, count: [u32; 3], cubes: Range<u64>) {
        let words = |b: u32| (b as usize).div_ceil(8).max(1);
        let mut state = vec![0u64; words(self.layout.state_bytes)];
        let mut shared = vec![0u64; words(self.layout.shared_bytes)];
        let [cx, cy, _] = count;
        for cube in cubes {
            let x = (cube % cx as u64) as u32;
            let y = ((cube / cx as u64) % cy as u64) as u32;
            let z = (cube / (cx as u64 * cy as u64)) as u32;
            // SAFETY: `ctx` describes the launch's buffers under `Plan::execute`'s contract;
            // `state` and `shared` hold the layout's bytes, owned by this worker; the function
            // only touches memory through those (bounds-checked) and the helpers.
            unsafe {
                (self.func)(
                    &ctx.0,
                    x,
                    y,
                    z,
                    cube as u32,
                    state.as_mut_ptr().cast(),
                    shared.as_mut_ptr().cast(),
                )
            };
        }
    }
}
