//! Portable IR -> CUDA C++.
//!
//! One kernel becomes one `extern "C" __global__` function, `compute_main`, taking for every
//! buffer its pointer and its length in entries (`unsigned long long`), then, for the buffers
//! whose tensor metadata the kernel reads, a `Meta` struct by value, then every scalar by value.
//! [`ParamLayout`] records that order so the server can pack launch arguments.
//!
//! Values are SSA: a C++ local of the value's item, `T` for scalars and `V<T, N>` (an aligned
//! array struct, so vector loads and stores become single wide instructions) for vectors. Every
//! operation is expanded per component. Semantics follow `compute_core::kernel::ir`: wrapping
//! integer arithmetic computed in unsigned 64-bit, `x / 0 == x`, `x % 0 == 0`, shifts modulo the
//! width, saturating float-to-int casts, half-to-even rounding, overflow-safe range loops, and
//! bounds checks (always on shared and local arrays, on global buffers in checked launches).
//! `f16` and `bf16` are stored as 16-bit words and computed in `f32` (exact for the basic
//! operations), converted with PTX `cvt`, so no CUDA header is needed.
//!
//! One file, above the crate's usual size: the generator is one emitter (`Gen`, a recursive
//! walk over the IR's statements and operations with one shared state) and the per-operation
//! expression helpers it calls (`unary`, `binary`, `compare`, `cast`); split, every piece would
//! reach back into the same state and helpers.

use core::fmt::Write as _;

use compute_core::ElemType;
use compute_core::ServerError;
use compute_core::kernel::{
    Access, AtomicOp, BinaryOp, Block, Builtin, CmpOp, Item, KernelDefinition, MemRef, Op, PlaneOp,
    ScalarValue, Stmt, UnaryOp, ValueId,
};

/// Most tensor dimensions a buffer's metadata may carry.
pub const MAX_RANK: usize = 8;

/// Name of the generated entry point.
pub const ENTRY: &str = "compute_main";

/// Size in bytes of the `Meta` struct passed by value (`rank`, `shape[8]`, `stride[8]`, `u32`s).
pub const META_BYTES: usize = 4 * (1 + 2 * MAX_RANK);

/// Bump when the generated code changes, so on-disk caches of older code are not reused.
pub const CODEGEN_VERSION: u32 = 3;

/// The kernel parameters, in order, as the launch must pass them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    /// Number of buffers (each: pointer, then length in entries).
    pub buffers: usize,
    /// Buffers (by declaration index) whose `Meta` follows, in this order.
    pub meta: Vec<usize>,
    /// Element types of the scalars, in order.
    pub scalars: Vec<ElemType>,
    /// Dynamic shared memory the launch must reserve, in bytes.
    pub shared_bytes: usize,
}

/// A kernel translated to CUDA C++.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The source, ready for NVRTC.
    pub source: String,
    /// The parameters it takes.
    pub layout: ParamLayout,
}

const PRELUDE: &str = r#"typedef unsigned short f16_t;
typedef unsigned short bf16_t;
template <typename T, int N> struct alignas(sizeof(T) * N > 16 ? 16 : sizeof(T) * N) V { T v[N]; };
struct Meta { unsigned rank; unsigned shape[8]; unsigned stride[8]; };
__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float b2f(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ unsigned short f2b(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
template <typename D, typename S> __device__ __forceinline__ D bitcast_(const S& s) {
  D d; const unsigned char* p = (const unsigned char*)&s; unsigned char* q = (unsigned char*)&d;
  for (int i = 0; i < (int)sizeof(D); ++i) q[i] = p[i];
  return d;
}
template <typename T> __device__ __forceinline__ T shfl_(unsigned m, T v, int lane) {
  if constexpr (sizeof(T) == 8) {
    unsigned long long b = bitcast_<unsigned long long>(v);
    b = __shfl_sync(m, b, lane);
    return bitcast_<T>(b);
  } else {
    unsigned b = 0; const unsigned char* p = (const unsigned char*)&v; unsigned char* q = (unsigned char*)&b;
    for (int i = 0; i < (int)sizeof(T); ++i) q[i] = p[i];
    b = __shfl_sync(m, b, lane);
    T r; p = (const unsigned char*)&b; q = (unsigned char*)&r;
    for (int i = 0; i < (int)sizeof(T); ++i) q[i] = p[i];
    return r;
  }
}
template <typename I> __device__ __forceinline__ I sat_(double x, double lo, double hi, I ilo, I ihi) {
  if (x != x) return (I)0;
  if (x <= lo) return ilo;
  if (x >= hi) return ihi;
  return (I)x;
}
"#;

fn ctype(elem: ElemType) -> &'static str {
    match elem {
        ElemType::Bool => "bool",
        ElemType::I8 => "signed char",
        ElemType::I16 => "short",
        ElemType::I32 => "int",
        ElemType::I64 => "long long",
        ElemType::U8 => "unsigned char",
        ElemType::U16 => "unsigned short",
        ElemType::U32 => "unsigned int",
        ElemType::U64 => "unsigned long long",
        ElemType::F16 => "f16_t",
        ElemType::BF16 => "bf16_t",
        ElemType::F32 => "float",
        ElemType::F64 => "double",
    }
}

fn item_type(item: Item) -> String {
    if item.width == 1 {
        ctype(item.elem).to_string()
    } else {
        format!("V<{}, {}>", ctype(item.elem), item.width)
    }
}

fn is_half(elem: ElemType) -> bool {
    matches!(elem, ElemType::F16 | ElemType::BF16)
}

/// An expression of a float element in its compute type (f32 for half types).
fn to_compute(elem: ElemType, expr: &str) -> String {
    match elem {
        ElemType::F16 => format!("h2f({expr})"),
        ElemType::BF16 => format!("b2f({expr})"),
        _ => expr.to_string(),
    }
}

/// A compute-type expression converted back to the element's storage.
fn from_compute(elem: ElemType, expr: &str) -> String {
    match elem {
        ElemType::F16 => format!("f2h({expr})"),
        ElemType::BF16 => format!("f2b({expr})"),
        _ => expr.to_string(),
    }
}

/// `f` for f32-computed types, empty for f64 (math function suffixes).
fn fsuffix(elem: ElemType) -> &'static str {
    if elem == ElemType::F64 { "" } else { "f" }
}

fn one(elem: ElemType) -> &'static str {
    if elem == ElemType::F64 { "1.0" } else { "1.0f" }
}

fn bits(elem: ElemType) -> u32 {
    elem.size() as u32 * 8
}

fn int_limits(elem: ElemType) -> (&'static str, &'static str) {
    match elem {
        ElemType::I8 => ("(signed char)-128", "(signed char)127"),
        ElemType::I16 => ("(short)-32768", "(short)32767"),
        ElemType::I32 => ("(-2147483647 - 1)", "2147483647"),
        ElemType::I64 => ("(-9223372036854775807LL - 1)", "9223372036854775807LL"),
        ElemType::U8 => ("(unsigned char)0", "(unsigned char)255"),
        ElemType::U16 => ("(unsigned short)0", "(unsigned short)65535"),
        ElemType::U32 => ("0u", "4294967295u"),
        _ => ("0ull", "18446744073709551615ull"),
    }
}

fn sat_bounds(elem: ElemType) -> (&'static str, &'static str) {
    match elem {
        ElemType::I8 => ("-128.0", "127.0"),
        ElemType::I16 => ("-32768.0", "32767.0"),
        ElemType::I32 => ("-2147483648.0", "2147483647.0"),
        ElemType::I64 => ("-9223372036854775808.0", "9223372036854775807.0"),
        ElemType::U8 => ("0.0", "255.0"),
        ElemType::U16 => ("0.0", "65535.0"),
        ElemType::U32 => ("0.0", "4294967295.0"),
        _ => ("0.0", "18446744073709551615.0"),
    }
}

/// A C++ literal of a scalar value.
fn literal(value: &ScalarValue) -> String {
    match *value {
        ScalarValue::Bool(b) => (if b { "true" } else { "false" }).to_string(),
        ScalarValue::I8(v) => format!("((signed char){v})"),
        ScalarValue::I16(v) => format!("((short){v})"),
        ScalarValue::I32(v) => format!("((int)0x{:x}u)", v as u32),
        ScalarValue::I64(v) => format!("((long long)0x{:x}ull)", v as u64),
        ScalarValue::U8(v) => format!("((unsigned char){v}u)"),
        ScalarValue::U16(v) => format!("((unsigned short){v}u)"),
        ScalarValue::U32(v) => format!("0x{v:x}u"),
        ScalarValue::U64(v) => format!("0x{v:x}ull"),
        ScalarValue::F16(v) => format!("((f16_t)0x{:x})", v.to_bits()),
        ScalarValue::BF16(v) => format!("((bf16_t)0x{:x})", v.to_bits()),
        ScalarValue::F32(v) => format!("__uint_as_float(0x{:x}u)", v.to_bits()),
        ScalarValue::F64(v) => format!("__longlong_as_double((long long)0x{:x}ull)", v.to_bits()),
    }
}

fn builtin(b: Builtin) -> &'static str {
    match b {
        Builtin::AbsolutePos => "b_ap",
        Builtin::AbsolutePosX => "b_apx",
        Builtin::AbsolutePosY => "b_apy",
        Builtin::AbsolutePosZ => "b_apz",
        Builtin::UnitPos => "b_up",
        Builtin::UnitPosX => "b_upx",
        Builtin::UnitPosY => "b_upy",
        Builtin::UnitPosZ => "b_upz",
        Builtin::CubePos => "b_cp",
        Builtin::CubePosX => "b_cpx",
        Builtin::CubePosY => "b_cpy",
        Builtin::CubePosZ => "b_cpz",
        Builtin::CubeDim => "b_cd",
        Builtin::CubeDimX => "b_cdx",
        Builtin::CubeDimY => "b_cdy",
        Builtin::CubeDimZ => "b_cdz",
        Builtin::CubeCount => "b_cc",
        Builtin::CubeCountX => "b_ccx",
        Builtin::CubeCountY => "b_ccy",
        Builtin::CubeCountZ => "b_ccz",
        Builtin::PlaneSize => "b_ps",
        Builtin::UnitPosPlane => "b_upp",
    }
}

const BUILTINS: &str = "  const unsigned b_upx = threadIdx.x, b_upy = threadIdx.y, b_upz = threadIdx.z;
  const unsigned b_cdx = blockDim.x, b_cdy = blockDim.y, b_cdz = blockDim.z;
  const unsigned b_cpx = blockIdx.x, b_cpy = blockIdx.y, b_cpz = blockIdx.z;
  const unsigned b_ccx = gridDim.x, b_ccy = gridDim.y, b_ccz = gridDim.z;
  const unsigned b_up = b_upx + b_upy * b_cdx + b_upz * b_cdx * b_cdy;
  const unsigned b_cd = b_cdx * b_cdy * b_cdz;
  const unsigned b_cp = b_cpx + b_cpy * b_ccx + b_cpz * b_ccx * b_ccy;
  const unsigned b_cc = b_ccx * b_ccy * b_ccz;
  const unsigned b_ap = b_cp * b_cd + b_up;
  const unsigned b_apx = b_cpx * b_cdx + b_upx, b_apy = b_cpy * b_cdy + b_upy, b_apz = b_cpz * b_cdz + b_upz;
  const unsigned b_ps = 32u, b_upp = b_up & 31u;
  (void)b_ap; (void)b_apx; (void)b_apy; (void)b_apz; (void)b_cc; (void)b_ps; (void)b_upp;
";

/// Which loop a `continue` belongs to.
#[derive(Clone, Copy)]
enum LoopKind {
    /// A range loop: `continue` jumps to its increment label.
    Range(usize),
    /// An unconditional loop: a plain C++ `continue`.
    Plain,
}

struct Gen<'a> {
    def: &'a KernelDefinition,
    checked: bool,
    out: String,
    depth: usize,
    loops: Vec<LoopKind>,
    labels: usize,
    tmp: usize,
}

fn unsupported(what: String) -> ServerError {
    ServerError::Compilation(format!("CUDA code generation: {what}"))
}

/// Translate `def` to CUDA C++; `checked` adds bounds checks to global memory accesses.
pub fn generate(def: &KernelDefinition, checked: bool) -> Result<Generated, ServerError> {
    let mut meta = Vec::new();
    collect_meta(def.body(), &mut meta);
    meta.sort_unstable();
    meta.dedup();
    let mut g = Gen {
        def,
        checked,
        out: String::with_capacity(4096),
        depth: 1,
        loops: Vec::new(),
        labels: 0,
        tmp: 0,
    };
    g.out.push_str(PRELUDE);
    let [x, y, z] = def.cube_dim();
    let threads = x * y * z;
    let _ = write!(
        g.out,
        "extern \"C\" __global__ void __launch_bounds__({threads}) {ENTRY}("
    );
    let mut params = Vec::new();
    for (i, b) in def.buffers().iter().enumerate() {
        let constness = if b.access == Access::ReadOnly {
            "const "
        } else {
            ""
        };
        params.push(format!(
            "{constness}{}* __restrict_none_b{i}",
            item_type(b.item())
        ));
        params.push(format!("const unsigned long long len{i}"));
    }
    for &i in &meta {
        params.push(format!("const Meta m{i}"));
    }
    for (i, s) in def.scalars().iter().enumerate() {
        params.push(format!("const {} s{i}", ctype(s.elem)));
    }
    let params = params.join(", ").replace("__restrict_none_", "");
    let _ = writeln!(g.out, "{params}) {{");
    g.out.push_str(BUILTINS);
    let mut shared_bytes = 0usize;
    if !def.shared().is_empty() {
        g.out
            .push_str("  extern __shared__ __align__(16) unsigned char smem_[];\n");
        for (i, s) in def.shared().iter().enumerate() {
            let _ = writeln!(
                g.out,
                "  {ty}* sh{i} = ({ty}*)(smem_ + {shared_bytes});",
                ty = item_type(s.item)
            );
            shared_bytes += s.size_bytes().next_multiple_of(16);
        }
    }
    for (i, l) in def.local_arrays().iter().enumerate() {
        let _ = writeln!(
            g.out,
            "  {} loc{i}[{}] = {{}};",
            item_type(l.item),
            l.len.max(1)
        );
    }
    g.block(def.body())?;
    g.out.push_str("}\n");
    Ok(Generated {
        source: g.out,
        layout: ParamLayout {
            buffers: def.buffers().len(),
            meta,
            scalars: def.scalars().iter().map(|s| s.elem).collect(),
            shared_bytes,
        },
    })
}

fn collect_meta(block: &Block, out: &mut Vec<usize>) {
    for stmt in &block.stmts {
        match stmt {
            Stmt::Let { op, .. } => match op {
                Op::Rank(b) => out.push(*b as usize),
                Op::Shape { buffer, .. } | Op::Stride { buffer, .. } => out.push(*buffer as usize),
                _ => {}
            },
            Stmt::If {
                then, otherwise, ..
            } => {
                collect_meta(then, out);
                collect_meta(otherwise, out);
            }
            Stmt::Range { body, .. } | Stmt::Loop { body } => collect_meta(body, out),
            _ => {}
        }
    }
}

impl Gen<'_> {
    fn line(&mut self, text: &str) {
        for _ in 0..self.depth {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    fn item(&self, v: ValueId) -> Result<Item, ServerError> {
        self.def
            .values()
            .get(v.0 as usize)
            .copied()
            .ok_or_else(|| unsupported(format!("value %{} has no type", v.0)))
    }

    /// Component `c` of value `v` (the value itself for scalars).
    fn comp(&self, v: ValueId, c: u8) -> Result<String, ServerError> {
        Ok(if self.item(v)?.width == 1 {
            format!("v{}", v.0)
        } else {
            format!("v{}.v[{c}]", v.0)
        })
    }

    /// Define `out` of item `item`, component `c` given by `f(c)` (storage-typed expressions).
    fn define(
        &mut self,
        out: ValueId,
        item: Item,
        mut f: impl FnMut(&Self, u8) -> Result<String, ServerError>,
    ) -> Result<(), ServerError> {
        if item.width == 1 {
            let e = f(self, 0)?;
            self.line(&format!("const {} v{} = {e};", ctype(item.elem), out.0));
        } else {
            let mut exprs = Vec::with_capacity(item.width as usize);
            for c in 0..item.width {
                exprs.push(f(self, c)?);
            }
            self.line(&format!("{} v{};", item_type(item), out.0));
            for (c, e) in exprs.into_iter().enumerate() {
                self.line(&format!("v{}.v[{c}] = {e};", out.0));
            }
        }
        Ok(())
    }

    fn block(&mut self, block: &Block) -> Result<(), ServerError> {
        for stmt in &block.stmts {
            self.stmt(stmt)?;
        }
        Ok(())
    }

    fn stmt(&mut self, stmt: &Stmt) -> Result<(), ServerError> {
        match stmt {
            Stmt::Let { out, op } => self.op(*out, op),
            Stmt::Store { mem, index, value } => {
                let (target, guard) = self.address(*mem, *index, true)?;
                match guard {
                    Some(g) => self.line(&format!("if ({g}) {target} = v{};", value.0)),
                    None => self.line(&format!("{target} = v{};", value.0)),
                }
                Ok(())
            }
            Stmt::DeclareVar { var, init } => {
                let decl =
                    self.def.vars().get(var.0 as usize).ok_or_else(|| {
                        unsupported(format!("variable {} is not declared", var.0))
                    })?;
                let ty = item_type(decl.item);
                self.line(&format!("{ty} var{} = v{};", var.0, init.0));
                Ok(())
            }
            Stmt::Assign { var, value } => {
                self.line(&format!("var{} = v{};", var.0, value.0));
                Ok(())
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.line(&format!("if (v{}) {{", cond.0));
                self.depth += 1;
                self.block(then)?;
                self.depth -= 1;
                if otherwise.stmts.is_empty() {
                    self.line("}");
                } else {
                    self.line("} else {");
                    self.depth += 1;
                    self.block(otherwise)?;
                    self.depth -= 1;
                    self.line("}");
                }
                Ok(())
            }
            Stmt::Range {
                var,
                start,
                end,
                step,
                body,
            } => self.range(*var, *start, *end, *step, body),
            Stmt::Loop { body } => {
                self.line("for (;;) {");
                self.depth += 1;
                self.loops.push(LoopKind::Plain);
                self.block(body)?;
                self.loops.pop();
                self.depth -= 1;
                self.line("}");
                Ok(())
            }
            Stmt::Break => {
                self.line("break;");
                Ok(())
            }
            Stmt::Continue => {
                match self.loops.last() {
                    Some(LoopKind::Range(label)) => {
                        let label = *label;
                        self.line(&format!("goto cont{label};"));
                    }
                    _ => self.line("continue;"),
                }
                Ok(())
            }
            Stmt::Return => {
                self.line("return;");
                Ok(())
            }
            Stmt::Barrier => {
                self.line("__syncthreads();");
                Ok(())
            }
        }
    }

    fn range(
        &mut self,
        var: ValueId,
        start: ValueId,
        end: ValueId,
        step: ValueId,
        body: &Block,
    ) -> Result<(), ServerError> {
        let item = self.item(var)?;
        let elem = item.elem;
        if !elem.is_int() || item.width != 1 {
            return Err(unsupported(format!("range loop over {item}")));
        }
        let ty = ctype(elem);
        let n = self.labels;
        self.labels += 1;
        let (min, max) = int_limits(elem);
        self.line("{");
        self.depth += 1;
        self.line(&format!("{ty} ri{n} = v{};", start.0));
        self.line(&format!("const {ty} re{n} = v{};", end.0));
        self.line(&format!("const {ty} rs{n} = v{};", step.0));
        let (cond, overflow) = if elem.is_signed_int() {
            (
                format!("(rs{n} > 0 ? ri{n} < re{n} : ri{n} > re{n})"),
                format!(
                    "(rs{n} > 0 ? ri{n} > ({ty})({max} - rs{n}) : ri{n} < ({ty})({min} - rs{n}))"
                ),
            )
        } else {
            (
                format!("(ri{n} < re{n})"),
                format!("(ri{n} > ({ty})({max} - rs{n}))"),
            )
        };
        self.line(&format!("if (rs{n} != 0) for (;;) {{"));
        self.depth += 1;
        self.line(&format!("if (!{cond}) break;"));
        self.line("{");
        self.depth += 1;
        self.line(&format!("const {ty} v{} = ri{n};", var.0));
        self.loops.push(LoopKind::Range(n));
        self.block(body)?;
        self.loops.pop();
        self.depth -= 1;
        self.line("}");
        self.line(&format!("cont{n}: ;"));
        self.line(&format!("if ({overflow}) break;"));
        self.line(&format!("ri{n} = ({ty})(ri{n} + rs{n});"));
        self.depth -= 1;
        self.line("}");
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    /// The lvalue of entry `index` of `mem`, and the bounds guard it needs (if any).
    fn address(
        &self,
        mem: MemRef,
        index: ValueId,
        _store: bool,
    ) -> Result<(String, Option<String>), ServerError> {
        let idx_item = self.item(index)?;
        if !idx_item.elem.is_int() || idx_item.width != 1 {
            return Err(unsupported(format!("index of type {idx_item}")));
        }
        let i = format!("v{}", index.0);
        let as_u64 = format!("(unsigned long long)({i})");
        let in_range = |len: String| {
            if idx_item.elem.is_signed_int() {
                format!("({i} >= 0 && {as_u64} < {len})")
            } else {
                format!("({as_u64} < {len})")
            }
        };
        Ok(match mem {
            MemRef::Global(b) => {
                if b as usize >= self.def.buffers().len() {
                    return Err(unsupported(format!("buffer {b} is not declared")));
                }
                let guard = self.checked.then(|| in_range(format!("len{b}")));
                (format!("b{b}[{as_u64}]"), guard)
            }
            MemRef::Shared(s) => {
                let decl = self
                    .def
                    .shared()
                    .get(s as usize)
                    .ok_or_else(|| unsupported(format!("shared array {s} is not declared")))?;
                (
                    format!("sh{s}[{as_u64}]"),
                    Some(in_range(format!("{}ull", decl.len))),
                )
            }
            MemRef::Local(l) => {
                let decl = self
                    .def
                    .local_arrays()
                    .get(l as usize)
                    .ok_or_else(|| unsupported(format!("local array {l} is not declared")))?;
                (
                    format!("loc{l}[{as_u64}]"),
                    Some(in_range(format!("{}ull", decl.len))),
                )
            }
        })
    }

    fn op(&mut self, out: ValueId, op: &Op) -> Result<(), ServerError> {
        let oi = self.item(out)?;
        match op {
            Op::Literal(v) => {
                let l = literal(v);
                self.define(out, oi, |_, _| Ok(l.clone()))
            }
            Op::Builtin(b) => self.define(out, oi, |_, _| Ok(builtin(*b).to_string())),
            Op::Scalar(i) => self.define(out, oi, |_, _| Ok(format!("s{i}"))),
            Op::Load { mem, index } => {
                let (src, guard) = self.address(*mem, *index, false)?;
                let ty = item_type(oi);
                match guard {
                    Some(g) => {
                        self.line(&format!("{ty} v{} = {{}};", out.0));
                        self.line(&format!("if ({g}) v{} = {src};", out.0));
                    }
                    None => self.line(&format!("const {ty} v{} = {src};", out.0)),
                }
                Ok(())
            }
            Op::Len(b) => self.define(out, oi, |_, _| {
                Ok(format!(
                    "(unsigned)(len{b} > 0xffffffffull ? 0xffffffffull : len{b})"
                ))
            }),
            Op::Rank(b) => self.define(out, oi, |_, _| Ok(format!("m{b}.rank"))),
            Op::Shape { buffer, dim } | Op::Stride { buffer, dim } => {
                let field = if matches!(op, Op::Shape { .. }) {
                    "shape"
                } else {
                    "stride"
                };
                let d = format!("v{}", dim.0);
                let di = self.item(*dim)?;
                let nonneg = if di.elem.is_signed_int() {
                    format!("{d} >= 0 && ")
                } else {
                    String::new()
                };
                self.define(out, oi, |_, _| {
                    Ok(format!(
                        "(({nonneg}(unsigned long long)({d}) < (unsigned long long)m{buffer}.rank) ? m{buffer}.{field}[(unsigned)({d})] : 0u)"
                    ))
                })
            }
            Op::ReadVar(var) => {
                self.line(&format!(
                    "const {} v{} = var{};",
                    item_type(oi),
                    out.0,
                    var.0
                ));
                Ok(())
            }
            Op::Unary(u, a) => {
                let elem = self.item(*a)?.elem;
                self.define(out, oi, |g, c| Ok(unary(*u, elem, &g.comp(*a, c)?)))
            }
            Op::Binary(b, x, y) => {
                let elem = self.item(*x)?.elem;
                self.define(out, oi, |g, c| {
                    Ok(binary(*b, elem, &g.comp(*x, c)?, &g.comp(*y, c)?))
                })
            }
            Op::Compare(cmp, x, y) => {
                let elem = self.item(*x)?.elem;
                self.define(out, oi, |g, c| {
                    Ok(compare(*cmp, elem, &g.comp(*x, c)?, &g.comp(*y, c)?))
                })
            }
            Op::Fma(a, b, c3) => {
                let elem = oi.elem;
                self.define(out, oi, |g, c| {
                    let (a, b, cc) = (g.comp(*a, c)?, g.comp(*b, c)?, g.comp(*c3, c)?);
                    Ok(if elem.is_float() {
                        let f = format!(
                            "fma{}({}, {}, {})",
                            fsuffix(elem),
                            to_compute(elem, &a),
                            to_compute(elem, &b),
                            to_compute(elem, &cc)
                        );
                        from_compute(elem, &f)
                    } else {
                        let prod = binary(BinaryOp::Mul, elem, &a, &b);
                        binary(BinaryOp::Add, elem, &prod, &cc)
                    })
                })
            }
            Op::Clamp(x, lo, hi) => {
                let elem = oi.elem;
                self.define(out, oi, |g, c| {
                    let inner = binary(BinaryOp::Max, elem, &g.comp(*x, c)?, &g.comp(*lo, c)?);
                    Ok(binary(BinaryOp::Min, elem, &inner, &g.comp(*hi, c)?))
                })
            }
            Op::Select(cond, a, b) => self.define(out, oi, |g, c| {
                Ok(format!(
                    "({} ? {} : {})",
                    g.comp(*cond, c)?,
                    g.comp(*a, c)?,
                    g.comp(*b, c)?
                ))
            }),
            Op::Cast(x, to) => {
                let from = self.item(*x)?.elem;
                let to = *to;
                self.define(out, oi, |g, c| Ok(cast(from, to, &g.comp(*x, c)?)))
            }
            Op::Bitcast(x, _, _) => {
                let ty = item_type(oi);
                self.line(&format!(
                    "const {ty} v{} = bitcast_<{ty}>(v{});",
                    out.0, x.0
                ));
                Ok(())
            }
            Op::Splat(x, _) => self.define(out, oi, |_, _| Ok(format!("v{}", x.0))),
            Op::Extract(x, c) => {
                let e = self.comp(*x, *c)?;
                self.define(out, oi, |_, _| Ok(e.clone()))
            }
            Op::Insert(x, at, s) => self.define(out, oi, |g, c| {
                if c == *at {
                    Ok(format!("v{}", s.0))
                } else {
                    g.comp(*x, c)
                }
            }),
            Op::Vector(parts) => self.define(out, oi, |_, c| {
                parts
                    .get(c as usize)
                    .map(|p| format!("v{}", p.0))
                    .ok_or_else(|| unsupported("vector with too few components".into()))
            }),
            Op::Atomic {
                op,
                mem,
                index,
                value,
                compare,
            } => self.atomic(out, oi, *op, *mem, *index, *value, *compare),
            Op::Plane(p, x) => self.plane(out, oi, *p, *x),
            Op::PlaneBroadcast(x, lane) | Op::PlaneShuffle(x, lane) => {
                let ty = ctype(oi.elem);
                let l = format!("(int)(v{})", lane.0);
                self.define(out, oi, |g, c| {
                    Ok(format!(
                        "shfl_<{ty}>(__activemask(), {}, {l})",
                        g.comp(*x, c)?
                    ))
                })
            }
            Op::Ballot(x) => {
                self.line(&format!("V<unsigned int, 4> v{};", out.0));
                self.line(&format!(
                    "v{o}.v[0] = __ballot_sync(__activemask(), v{x}); v{o}.v[1] = 0u; v{o}.v[2] = 0u; v{o}.v[3] = 0u;",
                    o = out.0,
                    x = x.0
                ));
                Ok(())
            }
        }
    }

    fn plane(&mut self, out: ValueId, oi: Item, p: PlaneOp, x: ValueId) -> Result<(), ServerError> {
        let elem = oi.elem;
        if matches!(p, PlaneOp::All | PlaneOp::Any) {
            let f = if p == PlaneOp::All {
                "__all_sync"
            } else {
                "__any_sync"
            };
            return self.define(out, oi, |g, c| {
                Ok(format!("({f}(__activemask(), {}) != 0)", g.comp(x, c)?))
            });
        }
        let op = match p {
            PlaneOp::Sum => BinaryOp::Add,
            PlaneOp::Prod => BinaryOp::Mul,
            PlaneOp::Min => BinaryOp::Min,
            _ => BinaryOp::Max,
        };
        let ty = ctype(elem);
        let n = self.tmp;
        self.tmp += 1;
        self.line(&format!("{} v{};", item_type(oi), out.0));
        self.line("{");
        self.depth += 1;
        self.line(&format!("const unsigned pm{n} = __activemask();"));
        for c in 0..oi.width {
            let src = self.comp(x, c)?;
            let dst = self.comp(out, c)?;
            self.line(&format!("{ty} pa{n} = {{}}; bool pf{n} = true;"));
            self.line(&format!(
                "for (int l = 0; l < 32; ++l) if (pm{n} & (1u << l)) {{ const {ty} px = shfl_<{ty}>(pm{n}, {src}, l); pa{n} = pf{n} ? px : {}; pf{n} = false; }}",
                binary(op, elem, &format!("pa{n}"), "px")
            ));
            self.line(&format!("{dst} = pa{n};"));
            self.tmp += 1;
        }
        self.depth -= 1;
        self.line("}");
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn atomic(
        &mut self,
        out: ValueId,
        oi: Item,
        op: AtomicOp,
        mem: MemRef,
        index: ValueId,
        value: ValueId,
        compare: Option<ValueId>,
    ) -> Result<(), ServerError> {
        if matches!(mem, MemRef::Local(_)) || oi.width != 1 {
            return Err(unsupported(format!(
                "atomic on {oi} in local memory or vectors"
            )));
        }
        let (lvalue, guard) = self.address(mem, index, true)?;
        let elem = oi.elem;
        let ty = ctype(elem);
        let p = format!("(&{lvalue})");
        let v = format!("v{}", value.0);
        let wide = match elem {
            ElemType::I32 => "int",
            ElemType::U32 => "unsigned int",
            ElemType::I64 | ElemType::U64 => "unsigned long long",
            ElemType::F32 => "float",
            other => return Err(unsupported(format!("atomics on {other}"))),
        };
        let pw = format!("(({wide}*){p})");
        let vw = format!("(({wide})({v}))");
        let expr = match (op, elem) {
            (AtomicOp::Load, _) => format!("*((volatile {ty}*){p})"),
            (AtomicOp::Store | AtomicOp::Exchange, _) => format!("({ty})atomicExch({pw}, {vw})"),
            (AtomicOp::Add, _) => format!("({ty})atomicAdd({pw}, {vw})"),
            (AtomicOp::Sub, ElemType::I32 | ElemType::U32) => {
                format!("({ty})atomicSub({pw}, {vw})")
            }
            (AtomicOp::Sub, _) => format!("({ty})atomicAdd({pw}, 0ull - {vw})"),
            (AtomicOp::Min | AtomicOp::Max, ElemType::I64) => {
                let f = if op == AtomicOp::Min {
                    "atomicMin"
                } else {
                    "atomicMax"
                };
                format!("({ty}){f}((long long*){p}, (long long)({v}))")
            }
            (AtomicOp::Min, _) => format!("({ty})atomicMin({pw}, {vw})"),
            (AtomicOp::Max, _) => format!("({ty})atomicMax({pw}, {vw})"),
            (AtomicOp::CompareExchange, _) => {
                let c = compare.ok_or_else(|| {
                    unsupported("atomic_compare_exchange without an expected value".into())
                })?;
                format!("({ty})atomicCAS({pw}, (({wide})(v{})), {vw})", c.0)
            }
            (AtomicOp::And, _) => format!("({ty})atomicAnd({pw}, {vw})"),
            (AtomicOp::Or, _) => format!("({ty})atomicOr({pw}, {vw})"),
            (AtomicOp::Xor, _) => format!("({ty})atomicXor({pw}, {vw})"),
        };
        if elem == ElemType::F32
            && !matches!(
                op,
                AtomicOp::Load | AtomicOp::Store | AtomicOp::Exchange | AtomicOp::Add
            )
        {
            return Err(unsupported(format!("{} on f32", op.name())));
        }
        match guard {
            Some(g) => {
                self.line(&format!("{ty} v{} = {{}};", out.0));
                self.line(&format!("if ({g}) v{} = {expr};", out.0));
            }
            None => self.line(&format!("const {ty} v{} = {expr};", out.0)),
        }
        Ok(())
    }
}

fn unary(op: UnaryOp, elem: ElemType, a: &str) -> String {
    let ty = ctype(elem);
    if elem.is_float() {
        let x = to_compute(elem, a);
        let f = fsuffix(elem);
        let r = match op {
            UnaryOp::Neg => format!("(-{x})"),
            UnaryOp::Abs => format!("fabs{f}({x})"),
            UnaryOp::Sqrt => format!("sqrt{f}({x})"),
            UnaryOp::Rsqrt => format!("({} / sqrt{f}({x}))", one(elem)),
            UnaryOp::Exp => format!("exp{f}({x})"),
            UnaryOp::Log => format!("log{f}({x})"),
            UnaryOp::Log1p => format!("log1p{f}({x})"),
            UnaryOp::Sin => format!("sin{f}({x})"),
            UnaryOp::Cos => format!("cos{f}({x})"),
            UnaryOp::Tanh => format!("tanh{f}({x})"),
            UnaryOp::Erf => format!("erf{f}({x})"),
            UnaryOp::Floor => format!("floor{f}({x})"),
            UnaryOp::Ceil => format!("ceil{f}({x})"),
            UnaryOp::Round => format!("rint{f}({x})"),
            UnaryOp::Recip => format!("({} / {x})", one(elem)),
            UnaryOp::Not => format!("({x} == 0)"),
            UnaryOp::BitNot => format!("({x})"),
        };
        if op == UnaryOp::Not {
            return r;
        }
        return from_compute(elem, &r);
    }
    match op {
        UnaryOp::Neg => format!("(({ty})(0ull - (unsigned long long)({a})))"),
        UnaryOp::Abs => {
            if elem.is_signed_int() {
                format!("(({a}) < 0 ? ({ty})(0ull - (unsigned long long)({a})) : ({a}))")
            } else {
                a.to_string()
            }
        }
        UnaryOp::Not => format!("(!({a}))"),
        UnaryOp::BitNot => format!("(({ty})(~({a})))"),
        // Float math on integers is rejected by the builder; compute in double if it appears.
        other => {
            let inner = unary(other, ElemType::F64, &format!("(double)({a})"));
            cast(ElemType::F64, elem, &inner)
        }
    }
}

fn binary(op: BinaryOp, elem: ElemType, a: &str, b: &str) -> String {
    let ty = ctype(elem);
    if elem.is_float() {
        let (x, y) = (to_compute(elem, a), to_compute(elem, b));
        let f = fsuffix(elem);
        let r = match op {
            BinaryOp::Add => format!("({x} + {y})"),
            BinaryOp::Sub => format!("({x} - {y})"),
            BinaryOp::Mul => format!("({x} * {y})"),
            BinaryOp::Div => format!("({x} / {y})"),
            BinaryOp::Rem => format!("fmod{f}({x}, {y})"),
            BinaryOp::Min => format!("fmin{f}({x}, {y})"),
            BinaryOp::Max => format!("fmax{f}({x}, {y})"),
            BinaryOp::Pow => format!("pow{f}({x}, {y})"),
            _ => format!("({x})"),
        };
        return from_compute(elem, &r);
    }
    let u = |e: &str| format!("(unsigned long long)({e})");
    let mask = bits(elem) - 1;
    match op {
        BinaryOp::Add => format!("(({ty})({} + {}))", u(a), u(b)),
        BinaryOp::Sub => format!("(({ty})({} - {}))", u(a), u(b)),
        BinaryOp::Mul => format!("(({ty})({} * {}))", u(a), u(b)),
        BinaryOp::Div => {
            if elem.is_signed_int() {
                format!(
                    "(({b}) == 0 ? ({a}) : (({b}) == ({ty})-1 ? ({ty})(0ull - {}) : ({ty})(({a}) / ({b}))))",
                    u(a)
                )
            } else {
                format!("(({b}) == 0 ? ({a}) : ({ty})(({a}) / ({b})))")
            }
        }
        BinaryOp::Rem => {
            if elem.is_signed_int() {
                format!("((({b}) == 0 || ({b}) == ({ty})-1) ? ({ty})0 : ({ty})(({a}) % ({b})))")
            } else {
                format!("(({b}) == 0 ? ({ty})0 : ({ty})(({a}) % ({b})))")
            }
        }
        BinaryOp::Min => format!("(({a}) < ({b}) ? ({a}) : ({b}))"),
        BinaryOp::Max => format!("(({a}) > ({b}) ? ({a}) : ({b}))"),
        BinaryOp::Pow => {
            let inner = format!("pow((double)({a}), (double)({b}))");
            cast(ElemType::F64, elem, &inner)
        }
        BinaryOp::And => format!("(({a}) && ({b}))"),
        BinaryOp::Or => format!("(({a}) || ({b}))"),
        BinaryOp::BitAnd => format!("(({ty})(({a}) & ({b})))"),
        BinaryOp::BitOr => format!("(({ty})(({a}) | ({b})))"),
        BinaryOp::BitXor => format!("(({ty})(({a}) ^ ({b})))"),
        BinaryOp::Shl => format!("(({ty})({} << ((unsigned)({b}) & {mask}u)))", u(a)),
        BinaryOp::Shr => {
            if elem.is_signed_int() {
                format!("(({ty})((long long)({a}) >> ((unsigned)({b}) & {mask}u)))")
            } else {
                format!("(({ty})({} >> ((unsigned)({b}) & {mask}u)))", u(a))
            }
        }
    }
}

fn compare(op: CmpOp, elem: ElemType, a: &str, b: &str) -> String {
    let (x, y) = if is_half(elem) {
        (to_compute(elem, a), to_compute(elem, b))
    } else {
        (a.to_string(), b.to_string())
    };
    let sym = match op {
        CmpOp::Eq => "==",
        CmpOp::Ne => "!=",
        CmpOp::Lt => "<",
        CmpOp::Le => "<=",
        CmpOp::Gt => ">",
        CmpOp::Ge => ">=",
    };
    format!("(({x}) {sym} ({y}))")
}

fn cast(from: ElemType, to: ElemType, a: &str) -> String {
    if from == to {
        return a.to_string();
    }
    let ty = ctype(to);
    if to == ElemType::Bool {
        return if from.is_float() {
            format!("({} != 0)", to_compute(from, a))
        } else {
            format!("(({a}) != 0)")
        };
    }
    if from == ElemType::Bool {
        return if to.is_float() {
            from_compute(to, &format!("(({a}) ? {} : 0)", one(to)))
        } else {
            format!("(({ty})(({a}) ? 1 : 0))")
        };
    }
    match (from.is_float(), to.is_float()) {
        (true, true) => {
            let compute = if to == ElemType::F64 {
                "double"
            } else {
                "float"
            };
            from_compute(to, &format!("(({compute})({}))", to_compute(from, a)))
        }
        (true, false) => {
            let (lo, hi) = sat_bounds(to);
            let (ilo, ihi) = int_limits(to);
            format!(
                "sat_<{ty}>((double)({}), {lo}, {hi}, ({ty}){ilo}, ({ty}){ihi})",
                to_compute(from, a)
            )
        }
        (false, true) => {
            let compute = if to == ElemType::F64 {
                "double"
            } else {
                "float"
            };
            from_compute(to, &format!("(({compute})({a}))"))
        }
        (false, false) => format!("(({ty})({a}))"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute_core::kernel::KernelBuilder;

    #[test]
    fn saxpy_has_checked_and_unchecked_forms() {
        let mut k = KernelBuilder::new("saxpy", [64, 1, 1]);
        let x = k.input("x", ElemType::F32, 4);
        let y = k.output("y", ElemType::F32, 4);
        let a = k.scalar("a", ElemType::F32);
        let i = k.absolute_pos();
        let xv = k.load(x, i);
        let yv = k.load(y, i);
        let av = k.splat(a, 4);
        let r = k.fma(av, xv, yv);
        k.store(y, i, r);
        let def = k.build().unwrap();
        let checked = generate(&def, true).unwrap();
        assert!(checked.source.contains("< len1"));
        assert!(checked.source.contains("V<float, 4>"));
        assert_eq!(checked.layout.buffers, 2);
        assert_eq!(checked.layout.scalars, vec![ElemType::F32]);
        let unchecked = generate(&def, false).unwrap();
        assert!(!unchecked.source.contains("< len1"));
    }

    #[test]
    fn loops_and_metadata() {
        let mut k = KernelBuilder::new("meta", [32, 1, 1]);
        let t = k.input("t", ElemType::I32, 1);
        let out = k.output("out", ElemType::U32, 1);
        let acc = k.var(0u32);
        let rank = k.rank(t);
        k.range(0u32, rank, 1u32, |k, d| {
            let s = k.shape(t, d);
            let v = k.get(acc);
            let v = k.add(v, s);
            k.assign(acc, v);
            k.continue_();
        });
        let v = k.get(acc);
        let zero = k.absolute_pos();
        k.store(out, zero, v);
        let def = k.build().unwrap();
        let g = generate(&def, true).unwrap();
        assert_eq!(g.layout.meta, vec![0]);
        assert!(g.source.contains("goto cont0;"));
        assert!(g.source.contains("m0.shape"));
    }

    #[test]
    fn casts_saturate_and_bools_convert() {
        assert!(cast(ElemType::F32, ElemType::I8, "x").starts_with("sat_<signed char>"));
        assert_eq!(cast(ElemType::I32, ElemType::Bool, "x"), "((x) != 0)");
        assert_eq!(cast(ElemType::F16, ElemType::F32, "x"), "((float)(h2f(x)))");
    }
}
