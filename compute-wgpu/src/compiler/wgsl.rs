//! The WGSL code generator.
//!
//! Why one file above 800 lines: the generator is one walk over the IR (statements, then the
//! expressions in them, each op lowered where it is met) sharing one emitter state ([`Gen`]: the
//! output, the info layout, the atomic buffers, the temporaries and the helper functions to
//! emit), and the emulation of what WGSL lacks (narrow and bf16 types in 32-bit words, 8- and
//! 16-component items, f64 math) is woven into that walk. Split by op kind, every part would
//! reach into the same state, and reading one op's lowering would mean reading several files.

use core::fmt::Write as _;

use compute_core::kernel::{
    Access, AtomicOp, BinaryOp, Block, Builtin, CmpOp, Item, KernelDefinition, MemRef, Op, PlaneOp,
    ScalarValue, Stmt, UnaryOp, ValueId,
};
use compute_core::{ElemType, ServerError};
use hashbrown::HashSet;

use super::{CompiledKernel, HEADER_WORDS, InfoLayout, ShaderCapabilities};

type Result<T> = core::result::Result<T, ServerError>;

/// The f64 math library (exp, log, sin, ...), emitted into kernels that use one of them.
const F64_MATH: &str = include_str!("f64_math.wgsl");

/// Compile `kernel` to WGSL for a device with `caps`; `checked` adds the bounds checks of
/// `launch` to global memory accesses.
///
/// # Errors
/// [`ServerError::Unsupported`] naming the element type, vector width or operation the device (or
/// this backend) lacks.
pub fn compile(
    kernel: &KernelDefinition,
    caps: ShaderCapabilities,
    checked: bool,
) -> Result<CompiledKernel> {
    let mut g = Gen::new(kernel, caps, checked);
    g.check_types()?;
    g.collect_atomics(kernel.body());
    g.kernel(kernel)?;
    Ok(CompiledKernel {
        source: g.out,
        info: g.info.clone(),
        buffer_item_sizes: kernel
            .buffers()
            .iter()
            .map(|b| b.item().size() as u64)
            .collect(),
    })
}

struct Gen<'a> {
    def: &'a KernelDefinition,
    caps: ShaderCapabilities,
    checked: bool,
    out: String,
    info: InfoLayout,
    atomics: HashSet<MemRef>,
    tmp: u32,
    uses_f16: bool,
    /// Module-scope helper functions the body calls, each emitted once, in first-use order.
    helpers: Vec<(String, String)>,
}

fn unsupported(kernel: &KernelDefinition, what: impl core::fmt::Display) -> ServerError {
    ServerError::Unsupported(format!("wgpu: kernel `{}` uses {what}", kernel.name()))
}

impl<'a> Gen<'a> {
    fn new(def: &'a KernelDefinition, caps: ShaderCapabilities, checked: bool) -> Self {
        let mut offset = 0u32;
        let mut scalar_offsets = Vec::with_capacity(def.scalars().len());
        for scalar in def.scalars() {
            scalar_offsets.push(offset);
            offset += if scalar.elem.size() == 8 { 2 } else { 1 };
        }
        let header_offset = offset;
        let fixed_words = header_offset + HEADER_WORDS * def.buffers().len() as u32;
        Self {
            def,
            caps,
            checked,
            out: String::new(),
            info: InfoLayout {
                scalar_offsets,
                header_offset,
                fixed_words,
            },
            atomics: HashSet::new(),
            tmp: 0,
            uses_f16: false,
            helpers: Vec::new(),
        }
    }

    fn fresh(&mut self) -> u32 {
        self.tmp += 1;
        self.tmp
    }

    // ------------------------------------------------------------------------------------------
    // Types
    // ------------------------------------------------------------------------------------------

    fn check_elem(&mut self, elem: ElemType, context: &str) -> Result<()> {
        let (ok, feature) = match elem {
            // Emulated: values in 32-bit types, buffers packed in `u32` words.
            ElemType::Bool
            | ElemType::I8
            | ElemType::I16
            | ElemType::U8
            | ElemType::U16
            | ElemType::BF16 => (true, ""),
            ElemType::I32 | ElemType::U32 | ElemType::F32 => (true, ""),
            ElemType::F16 => (self.caps.f16, " (the adapter lacks SHADER_F16)"),
            ElemType::F64 => (self.caps.f64, " (the adapter lacks SHADER_F64)"),
            ElemType::I64 | ElemType::U64 => (self.caps.int64, " (the adapter lacks SHADER_INT64)"),
        };
        if elem == ElemType::F16 {
            self.uses_f16 = true;
        }
        if ok {
            Ok(())
        } else {
            Err(unsupported(
                self.def,
                format!("{elem} in {context}{feature}"),
            ))
        }
    }

    fn check_item(&mut self, item: Item, context: &str) -> Result<()> {
        self.check_elem(item.elem, context)?;
        if !matches!(item.width, 1 | 2 | 4 | 8 | 16) {
            return Err(unsupported(
                self.def,
                format!(
                    "vector width {} in {context} (WGSL vectors have 2 to 4 components; widths 8 and 16 are not supported)",
                    item.width
                ),
            ));
        }
        Ok(())
    }

    fn check_types(&mut self) -> Result<()> {
        let def = self.def;
        for b in def.buffers() {
            self.check_item(b.item(), &format!("buffer `{}`", b.name))?;
        }
        for s in def.scalars() {
            self.check_elem(s.elem, &format!("scalar `{}`", s.name))?;
        }
        for s in def.shared() {
            self.check_item(s.item, &format!("shared array `{}`", s.name))?;
        }
        for l in def.local_arrays() {
            self.check_item(l.item, &format!("local array `{}`", l.name))?;
        }
        for v in def.vars() {
            self.check_item(v.item, &format!("variable `{}`", v.name))?;
        }
        for (i, item) in def.values().iter().enumerate() {
            self.check_item(*item, &format!("value {i}"))?;
        }
        Ok(())
    }

    fn collect_atomics(&mut self, block: &Block) {
        for stmt in &block.stmts {
            match stmt {
                Stmt::Let {
                    op: Op::Atomic { mem, .. },
                    ..
                } => {
                    self.atomics.insert(*mem);
                }
                Stmt::If {
                    then, otherwise, ..
                } => {
                    self.collect_atomics(then);
                    self.collect_atomics(otherwise);
                }
                Stmt::Range { body, .. } | Stmt::Loop { body } => self.collect_atomics(body),
                _ => {}
            }
        }
    }

    fn item(&self, v: ValueId) -> Item {
        self.def.values()[v.0 as usize]
    }

    fn mem_item(&self, mem: MemRef) -> Item {
        match mem {
            MemRef::Global(i) => self.def.buffers()[i as usize].item(),
            MemRef::Shared(i) => self.def.shared()[i as usize].item,
            MemRef::Local(i) => self.def.local_arrays()[i as usize].item,
        }
    }

    fn mem_name(mem: MemRef) -> String {
        match mem {
            MemRef::Global(i) => format!("b{i}"),
            MemRef::Shared(i) => format!("s{i}"),
            MemRef::Local(i) => format!("l{i}"),
        }
    }

    /// Length of a memory, as a `u32` expression.
    fn mem_len(&self, mem: MemRef) -> String {
        match mem {
            MemRef::Global(i) => format!("_len{i}"),
            MemRef::Shared(i) => format!("{}u", self.def.shared()[i as usize].len),
            MemRef::Local(i) => format!("{}u", self.def.local_arrays()[i as usize].len),
        }
    }

    /// The element reference `mem[index]` (the index a `u32` expression).
    fn mem_at(mem: MemRef, index: &str) -> String {
        match mem {
            MemRef::Global(i) => format!("b{i}[_base{i} + {index}]"),
            _ => format!("{}[{index}]", Self::mem_name(mem)),
        }
    }

    fn bounds_checked(&self, mem: MemRef) -> bool {
        !matches!(mem, MemRef::Global(_)) || self.checked
    }

    fn atomic_ty(&self, mem: MemRef) -> Result<String> {
        let item = self.mem_item(mem);
        match (item.elem, item.width) {
            (ElemType::U32 | ElemType::I32, 1) => Ok(format!("atomic<{}>", scalar_ty(item.elem))),
            (ElemType::F32, 1) if self.caps.float32_atomics => Ok("atomic<f32>".into()),
            (ElemType::U64 | ElemType::I64, 1) if self.caps.int64_atomics => {
                Ok(format!("atomic<{}>", scalar_ty(item.elem)))
            }
            (ElemType::F32, 1) => Err(unsupported(
                self.def,
                "f32 atomics (the adapter lacks SHADER_FLOAT32_ATOMIC)",
            )),
            (ElemType::U64 | ElemType::I64, 1) => Err(unsupported(
                self.def,
                format!("atomics on {item} (the adapter lacks SHADER_INT64_ATOMIC_ALL_OPS)"),
            )),
            _ => Err(unsupported(
                self.def,
                format!("atomics on {item} (wgpu has 32- and 64-bit integer and f32 atomics)"),
            )),
        }
    }

    // ------------------------------------------------------------------------------------------
    // Declarations
    // ------------------------------------------------------------------------------------------

    fn kernel(&mut self, def: &KernelDefinition) -> Result<()> {
        let mut body = String::new();
        core::mem::swap(&mut self.out, &mut body);
        self.block(def.body(), 1)?;
        core::mem::swap(&mut self.out, &mut body);

        let mut head = String::new();
        if self.uses_f16 {
            head.push_str("enable f16;\n\n");
        }
        for (k, b) in def.buffers().iter().enumerate() {
            let mem = MemRef::Global(k as u32);
            let ty = if self.atomics.contains(&mem) {
                if b.access == Access::ReadOnly {
                    return Err(ServerError::Compilation(format!(
                        "kernel `{}`: atomic on read-only buffer `{}`",
                        def.name(),
                        b.name
                    )));
                }
                self.atomic_ty(mem)?
            } else if is_packed(b.elem) {
                // Stores to packed words are atomic read-modify-writes of their bytes only, so
                // units storing neighbouring elements do not race.
                if b.access == Access::ReadOnly {
                    "u32".into()
                } else {
                    "atomic<u32>".into()
                }
            } else if b.vector_width > 4 {
                // Items of 8 and 16 components are runs of scalars.
                scalar_ty(b.elem).to_string()
            } else {
                item_ty(b.item())
            };
            let _ = writeln!(
                head,
                "@group(0) @binding({k}) var<storage, read_write> b{k}: array<{ty}>;"
            );
        }
        let _ = writeln!(
            head,
            "@group(0) @binding({}) var<storage, read> info: array<u32>;",
            def.buffers().len()
        );
        for (k, s) in def.shared().iter().enumerate() {
            let mem = MemRef::Shared(k as u32);
            let ty = if self.atomics.contains(&mem) {
                self.atomic_ty(mem)?
            } else {
                item_ty(s.item)
            };
            let _ = writeln!(head, "var<workgroup> s{k}: array<{ty}, {}>;", s.len.max(1));
        }
        for (_, code) in &self.helpers {
            head.push('\n');
            head.push_str(code);
        }
        let [x, y, z] = def.cube_dim();
        let _ = write!(
            head,
            "\n@compute @workgroup_size({x}, {y}, {z})\nfn main(@builtin(local_invocation_id) lid: vec3<u32>, \
             @builtin(local_invocation_index) lidx: u32, @builtin(workgroup_id) wid: vec3<u32>, \
             @builtin(num_workgroups) nwg: vec3<u32>"
        );
        if self.caps.subgroups {
            head.push_str(", @builtin(subgroup_size) sg_size: u32");
            if !self.multi_dimensional() {
                head.push_str(", @builtin(subgroup_invocation_id) sg_id: u32");
            }
        }
        head.push_str(") {\n");
        let _ = writeln!(head, "    let _cube_dim = vec3<u32>({x}u, {y}u, {z}u);");
        head.push_str("    let _cube_pos = wid.x + wid.y * nwg.x + wid.z * nwg.x * nwg.y;\n");
        for k in 0..def.buffers().len() {
            let h = self.info.header_offset + HEADER_WORDS * k as u32;
            let _ = writeln!(head, "    let _base{k} = info[{h}u];");
            let _ = writeln!(head, "    let _len{k} = info[{}u];", h + 1);
        }
        for (k, l) in def.local_arrays().iter().enumerate() {
            let mem = MemRef::Local(k as u32);
            let ty = if self.atomics.contains(&mem) {
                return Err(unsupported(def, "atomics on a local array"));
            } else {
                item_ty(l.item)
            };
            let _ = writeln!(head, "    var l{k}: array<{ty}, {}>;", l.len.max(1));
        }
        head.push_str(&body);
        head.push_str("}\n");
        self.out = head;
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Statements
    // ------------------------------------------------------------------------------------------

    fn line(&mut self, depth: usize, text: &str) {
        for _ in 0..depth {
            self.out.push_str("    ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    fn block(&mut self, block: &Block, depth: usize) -> Result<()> {
        for stmt in &block.stmts {
            self.stmt(stmt, depth)?;
        }
        Ok(())
    }

    fn stmt(&mut self, stmt: &Stmt, depth: usize) -> Result<()> {
        match stmt {
            Stmt::Let { out, op } => self.let_(*out, op, depth)?,
            Stmt::Store { mem, index, value } if self.packed_global(*mem) => {
                self.store_packed(*mem, *index, *value, depth);
            }
            Stmt::Store {
                mem: MemRef::Global(k),
                index,
                value,
            } if self.mem_item(MemRef::Global(*k)).width > 4 => {
                self.store_wide(*k, *index, *value, depth);
            }
            Stmt::Store { mem, index, value } => {
                let idx = format!("u32(v{})", index.0);
                let target = Self::mem_at(*mem, &idx);
                let assign = if self.atomics.contains(mem) {
                    format!("atomicStore(&{target}, v{});", value.0)
                } else {
                    format!("{target} = v{};", value.0)
                };
                if self.bounds_checked(*mem) {
                    let len = self.mem_len(*mem);
                    self.line(depth, &format!("if ({idx} < {len}) {{ {assign} }}"));
                } else {
                    self.line(depth, &assign);
                }
            }
            Stmt::DeclareVar { var, init } => {
                let ty = item_ty(self.def.vars()[var.0 as usize].item);
                self.line(depth, &format!("var x{}: {ty} = v{};", var.0, init.0));
            }
            Stmt::Assign { var, value } => self.line(depth, &format!("x{} = v{};", var.0, value.0)),
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.line(depth, &format!("if (v{}) {{", cond.0));
                self.block(then, depth + 1)?;
                if otherwise.stmts.is_empty() {
                    self.line(depth, "}");
                } else {
                    self.line(depth, "} else {");
                    self.block(otherwise, depth + 1)?;
                    self.line(depth, "}");
                }
            }
            Stmt::Range {
                var,
                start,
                end,
                step,
                body,
            } => {
                let ty = item_ty(self.item(*var));
                let n = self.fresh();
                let zero = format!("{ty}(0)");
                self.line(depth, "{");
                let d = depth + 1;
                self.line(d, &format!("var _i{n}: {ty} = v{};", start.0));
                self.line(d, &format!("let _e{n}: {ty} = v{};", end.0));
                self.line(d, &format!("let _s{n}: {ty} = v{};", step.0));
                self.line(d, &format!("if (_s{n} != {zero}) {{"));
                self.line(d + 1, "loop {");
                let dd = d + 2;
                self.line(
                    dd,
                    &format!(
                        "if (((_s{n} > {zero}) & !(_i{n} < _e{n})) | ((_s{n} < {zero}) & !(_i{n} > _e{n}))) {{ break; }}"
                    ),
                );
                self.line(dd, &format!("let v{}: {ty} = _i{n};", var.0));
                self.block(body, dd)?;
                self.line(dd, "continuing {");
                let next = self.normalize(self.item(*var), &format!("(_i{n} + _s{n})"));
                self.line(dd + 1, &format!("let _n{n}: {ty} = {next};"));
                self.line(
                    dd + 1,
                    &format!(
                        "let _o{n}: bool = ((_s{n} > {zero}) & (_n{n} < _i{n})) | ((_s{n} < {zero}) & (_n{n} > _i{n}));"
                    ),
                );
                self.line(dd + 1, &format!("_i{n} = _n{n};"));
                self.line(dd + 1, &format!("break if _o{n};"));
                self.line(dd, "}");
                self.line(d + 1, "}");
                self.line(d, "}");
                self.line(depth, "}");
            }
            Stmt::Loop { body } => {
                self.line(depth, "loop {");
                self.block(body, depth + 1)?;
                self.line(depth, "}");
            }
            Stmt::Break => self.line(depth, "break;"),
            Stmt::Continue => self.line(depth, "continue;"),
            Stmt::Return => self.line(depth, "return;"),
            Stmt::Barrier => self.line(depth, "storageBarrier(); workgroupBarrier();"),
        }
        Ok(())
    }

    // ------------------------------------------------------------------------------------------
    // Operations
    // ------------------------------------------------------------------------------------------

    fn let_(&mut self, out: ValueId, op: &Op, depth: usize) -> Result<()> {
        let item = self.item(out);
        let ty = item_ty(item);
        let v = |id: &ValueId| format!("v{}", id.0);
        let expr = match op {
            Op::Literal(value) => literal(*value),
            Op::Builtin(b) => self.builtin(*b)?,
            Op::Scalar(k) => self.scalar(*k as usize),
            Op::Load { mem, index } if self.packed_global(*mem) => {
                self.load_packed(*mem, *index, item, depth)
            }
            Op::Load {
                mem: MemRef::Global(k),
                index,
            } if item.width > 4 => self.load_wide(*k, *index, item, depth),
            Op::Load { mem, index } => {
                let idx = format!("u32(v{})", index.0);
                let at = Self::mem_at(*mem, &idx);
                let read = if self.atomics.contains(mem) {
                    format!("atomicLoad(&{at})")
                } else {
                    at
                };
                if self.bounds_checked(*mem) {
                    let len = self.mem_len(*mem);
                    let n = self.fresh();
                    self.line(depth, &format!("var _ld{n}: {ty} = {ty}();"));
                    self.line(depth, &format!("if ({idx} < {len}) {{ _ld{n} = {read}; }}"));
                    format!("_ld{n}")
                } else {
                    read
                }
            }
            Op::Len(b) => format!("_len{b}"),
            Op::Rank(b) => format!("info[{}u]", self.info.header_offset + HEADER_WORDS * b + 2),
            Op::Shape { buffer, dim } | Op::Stride { buffer, dim } => {
                let h = self.info.header_offset + HEADER_WORDS * buffer;
                let extra = if matches!(op, Op::Stride { .. }) {
                    format!(" + info[{}u]", h + 2)
                } else {
                    String::new()
                };
                format!(
                    "select(0u, info[info[{}u] + u32(v{}){extra}], u32(v{}) < info[{}u])",
                    h + 3,
                    dim.0,
                    dim.0,
                    h + 2
                )
            }
            Op::ReadVar(var) => format!("x{}", var.0),
            Op::Unary(..)
            | Op::Binary(..)
            | Op::Compare(..)
            | Op::Fma(..)
            | Op::Clamp(..)
            | Op::Select(..)
            | Op::Cast(..) => self.elementwise_value(op, item, depth),
            Op::Bitcast(a, _, _) => self.bitcast(*a, item, depth),
            Op::Splat(a, _) if item.width > 4 => {
                format!("{ty}({})", vec![v(a); item.width as usize].join(", "))
            }
            Op::Splat(a, _) => format!("{ty}({})", v(a)),
            Op::Extract(a, c) => {
                if self.item(*a).width == 1 {
                    v(a)
                } else {
                    format!("{}[{c}u]", v(a))
                }
            }
            Op::Insert(a, c, s) => {
                let n = self.fresh();
                self.line(depth, &format!("var _ins{n}: {ty} = {};", v(a)));
                self.line(depth, &format!("_ins{n}[{c}u] = {};", v(s)));
                format!("_ins{n}")
            }
            Op::Vector(parts) => {
                let list: Vec<String> = parts.iter().map(v).collect();
                format!("{ty}({})", list.join(", "))
            }
            Op::Atomic {
                op,
                mem,
                index,
                value,
                compare,
            } => {
                let idx = format!("u32(v{})", index.0);
                let target = format!("&{}", Self::mem_at(*mem, &idx));
                let call = match op {
                    AtomicOp::Load => format!("atomicLoad({target})"),
                    AtomicOp::Store | AtomicOp::Exchange => {
                        format!("atomicExchange({target}, {})", v(value))
                    }
                    AtomicOp::Add => format!("atomicAdd({target}, {})", v(value)),
                    AtomicOp::Sub => format!("atomicSub({target}, {})", v(value)),
                    AtomicOp::Min => format!("atomicMin({target}, {})", v(value)),
                    AtomicOp::Max => format!("atomicMax({target}, {})", v(value)),
                    AtomicOp::And => format!("atomicAnd({target}, {})", v(value)),
                    AtomicOp::Or => format!("atomicOr({target}, {})", v(value)),
                    AtomicOp::Xor => format!("atomicXor({target}, {})", v(value)),
                    AtomicOp::CompareExchange => {
                        let Some(cmp) = compare else {
                            return Err(ServerError::Compilation(format!(
                                "kernel `{}`: compare-exchange without a compare value",
                                self.def.name()
                            )));
                        };
                        format!(
                            "atomicCompareExchangeWeak({target}, {}, {}).old_value",
                            v(cmp),
                            v(value)
                        )
                    }
                };
                if self.bounds_checked(*mem) {
                    let len = self.mem_len(*mem);
                    let n = self.fresh();
                    self.line(depth, &format!("var _at{n}: {ty} = {ty}();"));
                    self.line(depth, &format!("if ({idx} < {len}) {{ _at{n} = {call}; }}"));
                    format!("_at{n}")
                } else {
                    call
                }
            }
            Op::Plane(..) | Op::PlaneBroadcast(..) | Op::PlaneShuffle(..) | Op::Ballot(_)
                if item.width > 4 =>
            {
                return Err(unsupported(
                    self.def,
                    format!(
                        "a plane operation on {item} (WGSL subgroup operations take vectors of up to 4 components)"
                    ),
                ));
            }
            Op::Plane(op, a) => {
                self.need_subgroups("plane operations")?;
                let f = match op {
                    PlaneOp::Sum => "subgroupAdd",
                    PlaneOp::Prod => "subgroupMul",
                    PlaneOp::Min => "subgroupMin",
                    PlaneOp::Max => "subgroupMax",
                    PlaneOp::All => "subgroupAll",
                    PlaneOp::Any => "subgroupAny",
                };
                format!("{f}({})", v(a))
            }
            Op::PlaneBroadcast(a, lane) | Op::PlaneShuffle(a, lane) => {
                self.need_subgroups("plane broadcast/shuffle")?;
                format!("subgroupShuffle({}, u32({}))", v(a), v(lane))
            }
            Op::Ballot(a) => {
                self.need_subgroups("ballot")?;
                format!("subgroupBallot({})", v(a))
            }
        };
        // Plane results of emulated types are brought back to their range (elementwise ones
        // are, per component, by `elementwise_value`).
        let expr = if matches!(
            op,
            Op::Plane(..) | Op::PlaneBroadcast(..) | Op::PlaneShuffle(..)
        ) {
            self.normalize(item, &expr)
        } else {
            expr
        };
        self.line(depth, &format!("let v{}: {ty} = {expr};", out.0));
        Ok(())
    }

    /// Whether the cube has more than one unit along y or z.
    fn multi_dimensional(&self) -> bool {
        let [_, y, z] = self.def.cube_dim();
        y > 1 || z > 1
    }

    fn need_subgroups(&self, what: &str) -> Result<()> {
        if self.caps.subgroups {
            Ok(())
        } else {
            Err(unsupported(
                self.def,
                format!("{what} (the adapter lacks SUBGROUP)"),
            ))
        }
    }

    fn builtin(&self, b: Builtin) -> Result<String> {
        Ok(match b {
            Builtin::AbsolutePos => {
                "(_cube_pos * (_cube_dim.x * _cube_dim.y * _cube_dim.z) + lidx)".into()
            }
            Builtin::AbsolutePosX => "(wid.x * _cube_dim.x + lid.x)".into(),
            Builtin::AbsolutePosY => "(wid.y * _cube_dim.y + lid.y)".into(),
            Builtin::AbsolutePosZ => "(wid.z * _cube_dim.z + lid.z)".into(),
            Builtin::UnitPos => "lidx".into(),
            Builtin::UnitPosX => "lid.x".into(),
            Builtin::UnitPosY => "lid.y".into(),
            Builtin::UnitPosZ => "lid.z".into(),
            Builtin::CubePos => "_cube_pos".into(),
            Builtin::CubePosX => "wid.x".into(),
            Builtin::CubePosY => "wid.y".into(),
            Builtin::CubePosZ => "wid.z".into(),
            Builtin::CubeDim => "(_cube_dim.x * _cube_dim.y * _cube_dim.z)".into(),
            Builtin::CubeDimX => "_cube_dim.x".into(),
            Builtin::CubeDimY => "_cube_dim.y".into(),
            Builtin::CubeDimZ => "_cube_dim.z".into(),
            Builtin::CubeCount => "(nwg.x * nwg.y * nwg.z)".into(),
            Builtin::CubeCountX => "nwg.x".into(),
            Builtin::CubeCountY => "nwg.y".into(),
            Builtin::CubeCountZ => "nwg.z".into(),
            Builtin::PlaneSize => {
                self.need_subgroups("plane_size")?;
                "sg_size".into()
            }
            Builtin::UnitPosPlane => {
                self.need_subgroups("unit_pos_plane")?;
                if self.multi_dimensional() {
                    // WGSL allows `subgroup_invocation_id` with 1-D workgroups only; planes are
                    // runs of consecutive unit indices, so the lane is the index modulo their size.
                    "(lidx % sg_size)".into()
                } else {
                    "sg_id".into()
                }
            }
        })
    }

    fn scalar(&self, k: usize) -> String {
        let o = self.info.scalar_offsets[k];
        let wide = format!("((u64(info[{}u]) << 32u) | u64(info[{o}u]))", o + 1);
        match self.def.scalars()[k].elem {
            ElemType::Bool => format!("(info[{o}u] != 0u)"),
            ElemType::I32 => format!("bitcast<i32>(info[{o}u])"),
            ElemType::F32 => format!("bitcast<f32>(info[{o}u])"),
            ElemType::F16 => format!("f16(unpack2x16float(info[{o}u]).x)"),
            // Narrow integers arrive sign- or zero-extended to a word, bf16 as its 16 bits.
            ElemType::I8 | ElemType::I16 => format!("bitcast<i32>(info[{o}u])"),
            ElemType::BF16 => format!("bitcast<f32>(info[{o}u] << 16u)"),
            ElemType::U64 => wide,
            ElemType::I64 => format!("bitcast<i64>({wide})"),
            ElemType::F64 => format!("bitcast<f64>({wide})"),
            _ => format!("info[{o}u]"),
        }
    }

    /// `op` applied to `x`, a value of `item`.
    fn unary(&mut self, op: UnaryOp, x: &str, item: Item, depth: usize) -> String {
        let transcendental = matches!(
            op,
            UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Log1p
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Tanh
                | UnaryOp::Erf
        );
        if item.elem == ElemType::F16 && transcendental {
            // In f32, rounded once to f16: drivers' f16 functions can be off by more than
            // f16's precision (lavapipe's exp(10) = 2.1952e4 for 2.2032e4).
            let wide = item.with_elem(ElemType::F32);
            let inner = self.unary_of(op, &format!("{}({x})", item_ty(wide)), wide, depth);
            return format!("{}({inner})", item_ty(item));
        }
        if item.elem == ElemType::F64 && self.caps.int64 {
            let f = match op {
                UnaryOp::Exp => Some("_f64_exp"),
                UnaryOp::Log => Some("_f64_log"),
                UnaryOp::Log1p => Some("_f64_log1p"),
                UnaryOp::Tanh => Some("_f64_tanh"),
                UnaryOp::Erf => Some("_f64_erf"),
                UnaryOp::Sin | UnaryOp::Cos => Some("_f64_sincos"),
                _ => None,
            };
            if let Some(f) = f {
                // Per component: the library is scalar.
                self.use_f64_math();
                let extra = match op {
                    UnaryOp::Sin => ", 0u",
                    UnaryOp::Cos => ", 1u",
                    _ => "",
                };
                let comps: Vec<String> = (0..item.width as usize)
                    .map(|j| format!("{f}({}{extra})", component(x, item.width, j)))
                    .collect();
                return if item.width == 1 {
                    comps.join("")
                } else {
                    format!("{}({})", item_ty(item), comps.join(", "))
                };
            }
        }
        if item.elem == ElemType::F64 && op == UnaryOp::Round {
            // Half to even: some drivers (lavapipe) round f64 halves away from zero. On |x|:
            // `d = a - floor(a)` is exact; a half goes to the even neighbour; the sign is put back.
            let ty = item_ty(item);
            let n = self.fresh();
            self.line(depth, &format!("let _a{n}: {ty} = abs({x});"));
            self.line(depth, &format!("let _f{n}: {ty} = floor(_a{n});"));
            self.line(depth, &format!("let _d{n}: {ty} = _a{n} - _f{n};"));
            self.line(
                depth,
                &format!(
                    "let _r{n}: {ty} = select(select(_f{n}, _f{n} + {ty}(1), _d{n} > {ty}(0.5)), _f{n} + (_f{n} - {ty}(2) * floor(_f{n} * {ty}(0.5))), _d{n} == {ty}(0.5));"
                ),
            );
            return format!("select(_r{n}, -_r{n}, {x} < {ty}(0))");
        }
        self.unary_of(op, x, item, depth)
    }

    /// `op` applied to the expression `x` of `item`.
    fn unary_of(&mut self, op: UnaryOp, x: &str, item: Item, depth: usize) -> String {
        let ty = item_ty(item);
        match op {
            UnaryOp::Neg => format!("(-{x})"),
            UnaryOp::Abs => format!("abs({x})"),
            UnaryOp::Not => format!("(!{x})"),
            UnaryOp::BitNot => format!("(~{x})"),
            UnaryOp::Sqrt => format!("sqrt({x})"),
            UnaryOp::Rsqrt => format!("inverseSqrt({x})"),
            UnaryOp::Exp => format!("exp({x})"),
            UnaryOp::Log => format!("log({x})"),
            UnaryOp::Log1p => format!("log({ty}(1) + {x})"),
            UnaryOp::Sin | UnaryOp::Cos if item.elem == ElemType::F32 => {
                let f = self.trig_helper(&ty);
                let shift = u32::from(op == UnaryOp::Cos);
                format!("{f}({x}, {shift})")
            }
            UnaryOp::Sin => format!("sin({x})"),
            UnaryOp::Cos => format!("cos({x})"),
            UnaryOp::Tanh => format!("tanh({x})"),
            UnaryOp::Floor => format!("floor({x})"),
            UnaryOp::Ceil => format!("ceil({x})"),
            UnaryOp::Round => format!("round({x})"),
            UnaryOp::Recip => format!("({ty}(1) / {x})"),
            UnaryOp::Erf => {
                // Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7).
                let n = self.fresh();
                self.line(
                    depth,
                    &format!("let _t{n} = {ty}(1) / ({ty}(1) + {ty}(0.3275911) * abs({x}));"),
                );
                self.line(
                    depth,
                    &format!(
                        "let _p{n} = (((({ty}(1.061405429) * _t{n} + {ty}(-1.453152027)) * _t{n} + {ty}(1.421413741)) * _t{n} + {ty}(-0.284496736)) * _t{n} + {ty}(0.254829592)) * _t{n};"
                    ),
                );
                format!("(sign({x}) * ({ty}(1) - _p{n} * exp(-({x} * {x}))))")
            }
        }
    }

    /// The name of the helper `fn(x: ty, quadrant_shift: u32) -> ty` computing `sin(x)` (shift 0)
    /// or `cos(x)` (shift 1) for an `f32` type `ty`, emitting it on first use.
    ///
    /// Drivers' `sin`/`cos` may lose accuracy away from 0 (NVIDIA's is an approximation of
    /// absolute error ~1e-6 in [-pi, pi], growing with |x|: sin(100) = -0.5063725 against
    /// -0.5063657). Here `x` is reduced to `r` in [-pi/4, pi/4] by Cody-Waite with a three-part
    /// split of pi/2 (fused multiply-adds; the first part's 8 significant bits keep `k * C1`
    /// exact for |x| up to ~2^16 * pi/2) and `sin(r)`, `cos(r)` are Cephes' minimax polynomials
    /// (about 1 ulp), picked and signed by the quadrant.
    fn trig_helper(&mut self, ty: &str) -> String {
        let name = format!("_sincos_{}", ty.replace(['<', '>'], ""));
        if self.helpers.iter().any(|(n, _)| *n == name) {
            return name;
        }
        let ity = ty.replace("f32", "i32");
        let uty = ty.replace("f32", "u32");
        let code = format!(
            "fn {name}(x: {ty}, shift: u32) -> {ty} {{
    let k = round(x * {ty}(0.636619772367581343));
    var r = fma(-k, {ty}(1.5703125), x);
    r = fma(-k, {ty}(4.837512969970703125e-4), r);
    r = fma(-k, {ty}(7.54978995489188216e-8), r);
    let z = r * r;
    let s = fma(fma(fma({ty}(-1.9515295891e-4), z, {ty}(8.3321608736e-3)), z, {ty}(-1.6666654611e-1)) * z, r, r);
    let c = fma(fma(fma({ty}(2.443315711809948e-5), z, {ty}(-1.388731625493765e-3)), z, {ty}(4.166664568298827e-2)) * z, z, fma({ty}(-0.5), z, {ty}(1.0)));
    let q = (bitcast<{uty}>({ity}(k)) + {uty}(shift)) & {uty}(3u);
    let v = select(s, c, (q & {uty}(1u)) == {uty}(1u));
    return select(v, -v, q >= {uty}(2u));
}}
"
        );
        self.helpers.push((name.clone(), code));
        name
    }

    /// The value of an elementwise operation (unary, binary, compare, fma, clamp, select, cast)
    /// of result `item`: on vectors directly, on arrays (8 and 16 components) per component.
    /// Results of emulated types are brought back to their range.
    fn elementwise_value(&mut self, op: &Op, item: Item, depth: usize) -> String {
        let operands: Vec<ValueId> = match op {
            Op::Unary(_, a) | Op::Cast(a, _) => vec![*a],
            Op::Binary(_, a, b) | Op::Compare(_, a, b) => vec![*a, *b],
            Op::Fma(a, b, c) | Op::Clamp(a, b, c) | Op::Select(a, b, c) => vec![*a, *b, *c],
            _ => unreachable!("not an elementwise operation: {op:?}"),
        };
        let normalizes = matches!(
            op,
            Op::Unary(..) | Op::Binary(..) | Op::Fma(..) | Op::Cast(..)
        );
        let items: Vec<Item> = operands.iter().map(|&o| self.item(o)).collect();
        let wide = item.width > 4 || items.iter().any(|i| i.width > 4);
        if !wide {
            let args: Vec<String> = operands.iter().map(|o| format!("v{}", o.0)).collect();
            let expr = self.elementwise(op, &args, &items, item, depth);
            return if normalizes {
                self.normalize(item, &expr)
            } else {
                expr
            };
        }
        let width = items
            .iter()
            .map(|i| i.width)
            .chain([item.width])
            .max()
            .unwrap_or(1);
        let mut comps = Vec::with_capacity(width as usize);
        for j in 0..width as usize {
            let args: Vec<String> = operands
                .iter()
                .zip(&items)
                .map(|(o, i)| component(&format!("v{}", o.0), i.width, j))
                .collect();
            let scalars: Vec<Item> = items.iter().map(|i| Item::scalar(i.elem)).collect();
            let out = Item::scalar(item.elem);
            let expr = self.elementwise(op, &args, &scalars, out, depth);
            comps.push(if normalizes {
                self.normalize(out, &expr)
            } else {
                expr
            });
        }
        format!("{}({})", item_ty(item), comps.join(", "))
    }

    /// The expression of elementwise `op` on the expressions `args` of `items`, result `item`.
    fn elementwise(
        &mut self,
        op: &Op,
        args: &[String],
        items: &[Item],
        item: Item,
        depth: usize,
    ) -> String {
        match op {
            Op::Unary(op, _) => self.unary(*op, &args[0], items[0], depth),
            Op::Binary(op, _, _) => self.binary(*op, &args[0], &args[1], items[0]),
            Op::Compare(op, _, _) => {
                let sym = match op {
                    CmpOp::Eq => "==",
                    CmpOp::Ne => "!=",
                    CmpOp::Lt => "<",
                    CmpOp::Le => "<=",
                    CmpOp::Gt => ">",
                    CmpOp::Ge => ">=",
                };
                if *op == CmpOp::Ne && is_float(items[0].elem) {
                    // Unordered: NaN != x. Written as !(a == b), which no driver orders.
                    format!("(!({} == {}))", args[0], args[1])
                } else {
                    format!("({} {sym} {})", args[0], args[1])
                }
            }
            Op::Fma(..) => {
                let ty = item_ty(item);
                let (a, b, c) = (&args[0], &args[1], &args[2]);
                if item.elem == ElemType::F16 {
                    // In f32 (where the product of two f16 is exact), rounded once to f16:
                    // lavapipe's f16 fma rounds the product first.
                    let w = item_ty(item.with_elem(ElemType::F32));
                    format!("{ty}(fma({w}({a}), {w}({b}), {w}({c})))")
                } else if is_float(item.elem) {
                    format!("fma({a}, {b}, {c})")
                } else {
                    format!("({a} * {b} + {c})")
                }
            }
            Op::Clamp(..) => format!("clamp({}, {}, {})", args[0], args[1], args[2]),
            Op::Select(..) => format!("select({}, {}, {})", args[2], args[1], args[0]),
            Op::Cast(..) => self.cast(&args[0], items[0], item),
            _ => unreachable!("not an elementwise operation: {op:?}"),
        }
    }

    /// Load item `index` of buffer `k` whose items are wider than a vector: a run of scalars.
    fn load_wide(&mut self, k: u32, index: ValueId, item: Item, depth: usize) -> String {
        let ty = item_ty(item);
        let w = item.width as usize;
        let idx = format!("u32(v{})", index.0);
        let comps: Vec<String> = (0..w)
            .map(|j| format!("b{k}[(_base{k} + {idx}) * {w}u + {j}u]"))
            .collect();
        let value = format!("{ty}({})", comps.join(", "));
        let n = self.fresh();
        if self.checked {
            self.line(depth, &format!("var _ld{n}: {ty} = {ty}();"));
            self.line(
                depth,
                &format!("if ({idx} < _len{k}) {{ _ld{n} = {value}; }}"),
            );
        } else {
            self.line(depth, &format!("let _ld{n}: {ty} = {value};"));
        }
        format!("_ld{n}")
    }

    /// Store `value` at item `index` of buffer `k` whose items are wider than a vector.
    fn store_wide(&mut self, k: u32, index: ValueId, value: ValueId, depth: usize) {
        let w = self.mem_item(MemRef::Global(k)).width as usize;
        let idx = format!("u32(v{})", index.0);
        let body: Vec<String> = (0..w)
            .map(|j| {
                format!(
                    "b{k}[(_base{k} + {idx}) * {w}u + {j}u] = v{}[{j}u];",
                    value.0
                )
            })
            .collect();
        let body = body.join(" ");
        if self.checked {
            self.line(depth, &format!("if ({idx} < _len{k}) {{ {body} }}"));
        } else {
            self.line(depth, &format!("{{ {body} }}"));
        }
    }

    // ------------------------------------------------------------------------------------------
    // Emulated element types
    // ------------------------------------------------------------------------------------------

    /// Whether `mem` is a global buffer packed into `u32` words.
    fn packed_global(&self, mem: MemRef) -> bool {
        matches!(mem, MemRef::Global(_)) && is_packed(self.mem_item(mem).elem)
    }

    /// The expression of word `word` (a `u32` expression) of packed buffer `k`.
    fn packed_word(&self, k: u32, word: &str) -> String {
        if self.def.buffers()[k as usize].access == Access::ReadOnly {
            format!("b{k}[{word}]")
        } else {
            format!("atomicLoad(&b{k}[{word}])")
        }
    }

    /// The value of emulated type `elem` whose bits are the low bytes of the `u32` `bits`.
    fn from_bits(elem: ElemType, bits: &str) -> String {
        match elem {
            ElemType::Bool => format!("({bits} != 0u)"),
            ElemType::I8 => format!("(bitcast<i32>({bits} << 24u) >> 24u)"),
            ElemType::I16 => format!("(bitcast<i32>({bits} << 16u) >> 16u)"),
            ElemType::BF16 => format!("bitcast<f32>({bits} << 16u)"),
            ElemType::F16 => format!("f16(unpack2x16float({bits}).x)"),
            ElemType::I32 | ElemType::F32 => format!("bitcast<{}>({bits})", scalar_ty(elem)),
            _ => bits.to_string(),
        }
    }

    /// The bits of the value `x` of a (narrow or 32-bit) scalar `elem`, in the low bytes of a `u32`.
    fn to_bits(elem: ElemType, x: &str) -> String {
        match elem {
            ElemType::Bool => format!("select(0u, 1u, {x})"),
            ElemType::I8 => format!("(bitcast<u32>({x}) & 0xffu)"),
            ElemType::I16 => format!("(bitcast<u32>({x}) & 0xffffu)"),
            ElemType::BF16 => format!("(bitcast<u32>({x}) >> 16u)"),
            ElemType::F16 => format!("(pack2x16float(vec2<f32>(f32({x}), 0.0)) & 0xffffu)"),
            ElemType::I32 | ElemType::F32 => format!("bitcast<u32>({x})"),
            _ => x.to_string(),
        }
    }

    /// Load item `index` of packed buffer `mem`: each component extracted from its word.
    fn load_packed(&mut self, mem: MemRef, index: ValueId, item: Item, depth: usize) -> String {
        let MemRef::Global(k) = mem else {
            unreachable!("only global buffers are packed")
        };
        let ty = item_ty(item);
        let size = item.elem.size();
        let n = self.fresh();
        let idx = format!("u32(v{})", index.0);
        let addr = format!("((_base{k} + {idx}) * {}u)", size * item.width as usize);
        let mut parts = Vec::with_capacity(item.width as usize);
        for j in 0..item.width as usize {
            let a = format!("({addr} + {}u)", j * size);
            let word = self.packed_word(k, &format!("({a} >> 2u)"));
            let bits = format!("(({word} >> (({a} & 3u) * 8u)) & {:#x}u)", byte_mask(size));
            parts.push(Self::from_bits(item.elem, &bits));
        }
        let value = if item.width == 1 {
            parts.remove(0)
        } else {
            format!("{ty}({})", parts.join(", "))
        };
        if self.checked {
            self.line(depth, &format!("var _ld{n}: {ty} = {ty}();"));
            self.line(
                depth,
                &format!("if ({idx} < _len{k}) {{ _ld{n} = {value}; }}"),
            );
        } else {
            self.line(depth, &format!("let _ld{n}: {ty} = {value};"));
        }
        format!("_ld{n}")
    }

    /// Store `value` at item `index` of packed buffer `mem`: whole words with an atomic store,
    /// parts of words with an atomic clear and set of their bytes.
    fn store_packed(&mut self, mem: MemRef, index: ValueId, value: ValueId, depth: usize) {
        let MemRef::Global(k) = mem else {
            unreachable!("only global buffers are packed")
        };
        let item = self.mem_item(mem);
        let size = item.elem.size();
        let bytes = size * item.width as usize;
        let idx = format!("u32(v{})", index.0);
        let x = format!("v{}", value.0);
        let mut body = Vec::new();
        let addr = format!("((_base{k} + {idx}) * {bytes}u)");
        if bytes.is_multiple_of(4) {
            // Items fill whole (aligned) words.
            let per = 4 / size;
            for w in 0..bytes / 4 {
                let mut word = Vec::with_capacity(per);
                for t in 0..per {
                    let c = component(&x, item.width, w * per + t);
                    let bits = Self::to_bits(item.elem, &c);
                    word.push(format!("({bits} << {}u)", 8 * size * t));
                }
                body.push(format!(
                    "atomicStore(&b{k}[({addr} >> 2u) + {w}u], {});",
                    word.join(" | ")
                ));
            }
        } else {
            for j in 0..item.width as usize {
                let a = format!("({addr} + {}u)", j * size);
                let shift = format!("(({a} & 3u) * 8u)");
                let bits = Self::to_bits(item.elem, &component(&x, item.width, j));
                body.push(format!(
                    "atomicAnd(&b{k}[{a} >> 2u], ~({:#x}u << {shift}));",
                    byte_mask(size)
                ));
                body.push(format!("atomicOr(&b{k}[{a} >> 2u], {bits} << {shift});"));
            }
        }
        let body = body.join(" ");
        if self.checked {
            self.line(depth, &format!("if ({idx} < _len{k}) {{ {body} }}"));
        } else {
            self.line(depth, &format!("{{ {body} }}"));
        }
    }

    /// `expr` (of `item`'s value type) brought back into the range of an emulated type: wrapped
    /// to 8 or 16 bits, or rounded to bf16. Other types are returned as they are.
    fn normalize(&mut self, item: Item, expr: &str) -> String {
        let uty = item_ty(item.with_elem(ElemType::U32));
        match item.elem {
            ElemType::I8 | ElemType::I16 => {
                let shift = 32 - 8 * item.elem.size();
                format!("(({expr} << {uty}({shift}u)) >> {uty}({shift}u))")
            }
            ElemType::U8 | ElemType::U16 => {
                format!("({expr} & {uty}({:#x}u))", byte_mask(item.elem.size()))
            }
            ElemType::BF16 => {
                let ty = item_ty(item);
                let name = format!("_bf16_{}", ty.replace(['<', '>'], ""));
                if !self.helpers.iter().any(|(n, _)| *n == name) {
                    // Round to nearest even on the upper 16 bits; NaN stays (a quiet) NaN.
                    let code = format!(
                        "fn {name}(x: {ty}) -> {ty} {{
    let b = bitcast<{uty}>(x);
    let r = (b + ({uty}(0x7fffu) + ((b >> {uty}(16u)) & {uty}(1u)))) & {uty}(0xffff0000u);
    let nan = (b & {uty}(0x7fffffffu)) > {uty}(0x7f800000u);
    return bitcast<{ty}>(select(r, (b | {uty}(0x00400000u)) & {uty}(0xffff0000u), nan));
}}
"
                    );
                    self.helpers.push((name.clone(), code));
                }
                format!("{name}({expr})")
            }
            _ => expr.to_string(),
        }
    }

    /// `bitcast(a)` to `to`: WGSL's own where it has one (32-bit components of equal count),
    /// else through the little-endian bytes of the value, as `u32` words.
    fn bitcast(&mut self, a: ValueId, to: Item, depth: usize) -> String {
        let from = self.item(a);
        let ty = item_ty(to);
        let x = format!("v{}", a.0);
        let word_sized = |e: ElemType| matches!(e, ElemType::I32 | ElemType::U32 | ElemType::F32);
        let vectors = from.width <= 4 && to.width <= 4;
        if vectors && from.width == to.width && word_sized(from.elem) && word_sized(to.elem) {
            return format!("bitcast<{ty}>({x})");
        }
        if vectors && from.width == to.width && from.elem.size() == 8 && to.elem.size() == 8 {
            return format!("bitcast<{ty}>({x})");
        }
        // The source as words: each holds 4 bytes (the last one fewer if the value is smaller).
        let n = self.fresh();
        let (fs, ts) = (from.elem.size(), to.elem.size());
        let bytes = fs * from.width as usize;
        let words = bytes.div_ceil(4);
        let mut word_exprs = vec![Vec::new(); words];
        for j in 0..from.width as usize {
            let c = component(&x, from.width, j);
            if fs == 8 {
                let bits = format!("bitcast<u64>({c})");
                word_exprs[2 * j].push(format!("u32({bits} & 0xfffffffflu)"));
                word_exprs[2 * j + 1].push(format!("u32({bits} >> 32u)"));
            } else {
                let at = j * fs;
                let bits = Self::to_bits(from.elem, &c);
                word_exprs[at / 4].push(format!("({bits} << {}u)", 8 * (at % 4)));
            }
        }
        for (w, parts) in word_exprs.iter().enumerate() {
            self.line(
                depth,
                &format!("let _bw{n}_{w}: u32 = {};", parts.join(" | ")),
            );
        }
        let mut comps = Vec::with_capacity(to.width as usize);
        for j in 0..to.width as usize {
            if ts == 8 {
                let bits = format!(
                    "((u64(_bw{n}_{}) << 32u) | u64(_bw{n}_{}))",
                    2 * j + 1,
                    2 * j
                );
                comps.push(format!("bitcast<{}>({bits})", scalar_ty(to.elem)));
            } else {
                let at = j * ts;
                let bits = format!(
                    "((_bw{n}_{} >> {}u) & {:#x}u)",
                    at / 4,
                    8 * (at % 4),
                    byte_mask(ts)
                );
                comps.push(Self::from_bits(to.elem, &bits));
            }
        }
        if to.width == 1 {
            comps.remove(0)
        } else {
            format!("{ty}({})", comps.join(", "))
        }
    }

    /// Emit the f64 math library into this kernel (once).
    fn use_f64_math(&mut self) {
        if !self.helpers.iter().any(|(n, _)| n == "_f64_math") {
            self.helpers
                .push(("_f64_math".into(), F64_MATH.to_string()));
        }
    }

    /// `op` applied to `x` and `y`, values of `item`.
    fn binary(&mut self, op: BinaryOp, x: &str, y: &str, item: Item) -> String {
        if op == BinaryOp::Pow && item.elem == ElemType::F64 && self.caps.int64 {
            self.use_f64_math();
            let comps: Vec<String> = (0..item.width as usize)
                .map(|j| {
                    format!(
                        "_f64_pow({}, {})",
                        component(x, item.width, j),
                        component(y, item.width, j)
                    )
                })
                .collect();
            return if item.width == 1 {
                comps.join("")
            } else {
                format!("{}({})", item_ty(item), comps.join(", "))
            };
        }
        let infix = |sym: &str| format!("({x} {sym} {y})");
        match op {
            BinaryOp::Add => infix("+"),
            BinaryOp::Sub => infix("-"),
            BinaryOp::Mul => infix("*"),
            BinaryOp::Div => infix("/"),
            BinaryOp::Rem => infix("%"),
            BinaryOp::Min => format!("min({x}, {y})"),
            BinaryOp::Max => format!("max({x}, {y})"),
            BinaryOp::Pow => format!("pow({x}, {y})"),
            BinaryOp::And | BinaryOp::BitAnd => infix("&"),
            BinaryOp::Or | BinaryOp::BitOr => infix("|"),
            BinaryOp::BitXor => infix("^"),
            BinaryOp::Shl | BinaryOp::Shr => {
                let sym = if op == BinaryOp::Shl { "<<" } else { ">>" };
                let shift_ty = item_ty(item.with_elem(ElemType::U32));
                let mask = item.elem.size() * 8 - 1;
                format!("({x} {sym} ({shift_ty}({y}) & {shift_ty}({mask}u)))")
            }
        }
    }

    /// `cast(a)` to `to`; the caller brings the result back into an emulated type's range.
    fn cast(&self, x: &str, from: Item, to: Item) -> String {
        let ty = item_ty(to);
        if from.elem == to.elem {
            return x.to_string();
        }
        if is_float(from.elem) && is_integer(to.elem) {
            // Saturate; NaN gives 0 (WGSL leaves out-of-range conversions to the driver).
            let (fty, fx) = if from.elem == ElemType::F16 {
                let fty = item_ty(from.with_elem(ElemType::F32));
                (fty.clone(), format!("{fty}({x})"))
            } else {
                (item_ty(from), x.to_string())
            };
            let bits = to.elem.size() * 8;
            let signed = matches!(
                to.elem,
                ElemType::I8 | ElemType::I16 | ElemType::I32 | ElemType::I64
            );
            let suffix = match (bits == 64, signed) {
                (true, true) => "li",
                (true, false) => "lu",
                (false, true) => "i",
                (false, false) => "u",
            };
            let (lo_bound, hi_bound, lo_val, hi_val) = if signed {
                let hi = 2f64.powi(bits as i32 - 1);
                let max = (1u64 << (bits - 1)) - 1;
                (
                    format!("{fty}({:?})", -hi),
                    format!("{fty}({:?})", hi),
                    // MIN is written as -MAX - 1: its magnitude does not fit the literal.
                    format!("({ty}(-{max}{suffix}) - {ty}(1{suffix}))"),
                    format!("{ty}({max}{suffix})"),
                )
            } else {
                let max = if bits == 64 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                };
                (
                    format!("{fty}(-1.0)"),
                    format!("{fty}({:?})", 2f64.powi(bits as i32)),
                    format!("{ty}(0{suffix})"),
                    format!("{ty}({max}{suffix})"),
                )
            };
            let cmp_lo = if signed { "<" } else { "<=" };
            return format!(
                "select(select(select({ty}({fx}), {hi_val}, {fx} >= {hi_bound}), {lo_val}, {fx} {cmp_lo} {lo_bound}), {ty}(0{suffix}), !({fx} == {fx}))"
            );
        }
        if is_integer(from.elem) && is_integer(to.elem) && to.elem.size() == 8 {
            // Widen by the source's signedness, then reinterpret: naga converts u32 -> i64 (and
            // i32 -> u64) with the target's signedness, which sign-extends a u32.
            let signed_from = matches!(
                from.elem,
                ElemType::I8 | ElemType::I16 | ElemType::I32 | ElemType::I64
            );
            let wide = item_ty(from.with_elem(if signed_from {
                ElemType::I64
            } else {
                ElemType::U64
            }));
            return format!("bitcast<{ty}>({wide}({x}))");
        }
        format!("{ty}({x})")
    }
}

fn is_float(elem: ElemType) -> bool {
    matches!(
        elem,
        ElemType::F16 | ElemType::F32 | ElemType::F64 | ElemType::BF16
    )
}

fn is_integer(elem: ElemType) -> bool {
    matches!(
        elem,
        ElemType::I8
            | ElemType::I16
            | ElemType::I32
            | ElemType::I64
            | ElemType::U8
            | ElemType::U16
            | ElemType::U32
            | ElemType::U64
    )
}

/// The WGSL type holding values of `elem`: its own, or for the emulated narrow types the 32-bit
/// one they are computed in (i8/i16 sign-extended in `i32`, u8/u16 in `u32`, bf16 in `f32`
/// rounded to bf16 after every operation).
fn scalar_ty(elem: ElemType) -> &'static str {
    match elem {
        ElemType::Bool => "bool",
        ElemType::I8 | ElemType::I16 | ElemType::I32 => "i32",
        ElemType::U8 | ElemType::U16 | ElemType::U32 => "u32",
        ElemType::BF16 | ElemType::F32 => "f32",
        ElemType::F16 => "f16",
        ElemType::F64 => "f64",
        ElemType::I64 => "i64",
        ElemType::U64 => "u64",
    }
}

/// Whether buffers of `elem` are packed into `u32` words (WGSL storage has no such type).
fn is_packed(elem: ElemType) -> bool {
    matches!(
        elem,
        ElemType::Bool
            | ElemType::I8
            | ElemType::I16
            | ElemType::U8
            | ElemType::U16
            | ElemType::BF16
    )
}

/// The low `bytes` bytes of a `u32` set.
fn byte_mask(bytes: usize) -> u32 {
    if bytes >= 4 {
        u32::MAX
    } else {
        (1u32 << (8 * bytes)) - 1
    }
}

/// The component `j` of the value `x` of an item of `width` components.
fn component(x: &str, width: u8, j: usize) -> String {
    if width == 1 {
        x.to_string()
    } else {
        format!("{x}[{j}u]")
    }
}

/// The WGSL type of an item's values: a scalar, a vector (widths 2 and 4) or an array (8, 16).
fn item_ty(item: Item) -> String {
    let s = scalar_ty(item.elem);
    match item.width {
        1 => s.to_string(),
        2..=4 => format!("vec{}<{s}>", item.width),
        // Wider than WGSL vectors: arrays, operated on component by component.
        w => format!("array<{s}, {w}>"),
    }
}

fn literal(value: ScalarValue) -> String {
    match value {
        ScalarValue::Bool(b) => b.to_string(),
        ScalarValue::I32(x) => format!("bitcast<i32>({}u)", x as u32),
        ScalarValue::U32(x) => format!("{x}u"),
        ScalarValue::F32(x) => format!("bitcast<f32>({}u)", x.to_bits()),
        ScalarValue::F16(x) => format!("f16(bitcast<f32>({}u))", x.to_f32().to_bits()),
        ScalarValue::I64(x) => format!("bitcast<i64>({}lu)", x as u64),
        ScalarValue::U64(x) => format!("{x}lu"),
        ScalarValue::F64(x) => format!("bitcast<f64>({}lu)", x.to_bits()),
        ScalarValue::I8(x) => format!("bitcast<i32>({}u)", i32::from(x) as u32),
        ScalarValue::I16(x) => format!("bitcast<i32>({}u)", i32::from(x) as u32),
        ScalarValue::U8(x) => format!("{x}u"),
        ScalarValue::U16(x) => format!("{x}u"),
        ScalarValue::BF16(x) => format!("bitcast<f32>({}u)", u32::from(x.to_bits()) << 16),
    }
}
