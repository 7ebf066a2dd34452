//! The SPIR-V emitter: walks the kernel IR and writes the module's words.
//!
//! Every IR value is held as one SPIR-V id per component (a scalar); vector types appear only at
//! global memory, where a buffer of width `w` is a runtime array of `min(w, 4)`-component vectors
//! (`w / 4` consecutive vec4 chunks per item for widths 8 and 16), so a `f32x4` load is one
//! 128-bit `OpLoad`. Register types: `bool`, integers by bit width (signedness 0; the signed
//! operations pick the interpretation), `f16`, `f32`, `f64`, and `f32` for `bf16` (every `bf16`
//! result is rounded to a representable `bf16`, so the `f32` holds the value exactly). In global
//! memory `bool` is a `u8` (0/1) and `bf16` a `u16`, and so in shared memory when the device has
//! 8/16-bit integers. Shared memory and local arrays are flat arrays of `len * width` scalars. Variables are one `Function` variable per
//! component, so no phis are needed except after guarded (bounds checked) loads.
//!
//! Why one file of this size: the emitter is one state machine (the [`Emitter`]: the module being
//! written, the open block and loop stack, the ids of every IR value, variable, buffer and
//! builtin) that every IR statement and operation writes through; the arithmetic and math
//! expansions already live in `ops` and `math`, and splitting the statement walk further would
//! scatter the code that must agree on that state.

use std::collections::HashMap;

use compute_core::ElemType;
use compute_core::ServerError;
use compute_core::kernel::{
    Access, AtomicOp, BinaryOp, Block, Builtin, Item, KernelDefinition, MemRef, Op as IrOp,
    PlaneOp, ScalarValue, Stmt, ValueId,
};
use spirv::{BuiltIn, Capability, Decoration, ExecutionMode, ExecutionModel, Op, StorageClass};

use super::words::{Module, inst, string_words};
use super::{ArgLayout, SpirvCaps, SpirvKernel};

/// `Scope` operand values.
pub(super) const SCOPE_DEVICE: u32 = 1;
/// Workgroup scope.
pub(super) const SCOPE_WORKGROUP: u32 = 2;
/// Subgroup scope.
pub(super) const SCOPE_SUBGROUP: u32 = 3;

/// Memory semantics bits.
const SEM_ACQ_REL: u32 = 0x8;
const SEM_UNIFORM: u32 = 0x40;
const SEM_WORKGROUP: u32 = 0x100;

/// One global buffer parameter as declared in the module.
struct BufInfo {
    var: u32,
    /// Type of one chunk (a scalar or a vector of `per_chunk` storage elements).
    chunk_ty: u32,
    per_chunk: u32,
    chunks: u32,
    elem: ElemType,
}

/// Compile `kernel` to SPIR-V for a device with `caps`; `checked` adds the bounds checks of
/// `launch` to global memory accesses.
///
/// # Errors
/// [`ServerError::Unsupported`] naming the element type, width or operation the device lacks;
/// [`ServerError::Compilation`] for malformed IR (undefined values, break outside a loop).
pub fn compile(
    kernel: &KernelDefinition,
    caps: &SpirvCaps,
    checked: bool,
) -> Result<SpirvKernel, ServerError> {
    let mut e = Emitter::new(kernel, caps, checked)?;
    e.check_features()?;
    e.declare()?;
    e.block(kernel.body())?;
    if !e.terminated {
        inst(&mut e.code, Op::Return, &[]);
        e.terminated = true;
    }
    Ok(e.finish())
}

/// The emitter state: the module, the function's code buffers and the IR value map.
pub(super) struct Emitter<'a> {
    pub def: &'a KernelDefinition,
    pub caps: &'a SpirvCaps,
    checked: bool,
    pub m: Module,
    /// The `GLSL.std.450` import.
    pub glsl: u32,
    /// Function-storage variables (emitted first in the entry block).
    vars: Vec<u32>,
    /// Straight-line code of the entry block that dominates everything (argument and builtin
    /// loads).
    pro: Vec<u32>,
    /// The body.
    pub code: Vec<u32>,
    /// Label of the entry block.
    entry: u32,
    /// Label of the block being emitted.
    pub cur_label: u32,
    /// Whether the current block already ended.
    pub terminated: bool,
    /// (merge, continue) of the enclosing loops.
    loops: Vec<(u32, u32)>,
    vals: Vec<Vec<u32>>,
    var_ptrs: Vec<Vec<u32>>,
    buffers: Vec<BufInfo>,
    shared: Vec<u32>,
    locals: Vec<u32>,
    builtins: HashMap<Builtin, u32>,
    inputs: HashMap<u32, u32>,
    arg_words: HashMap<u32, u32>,
    info_words: HashMap<u32, u32>,
    info_var: Option<u32>,
    pc_var: Option<u32>,
    layout: ArgLayout,
    uses_info: bool,
    pub uses_subgroups: bool,
    subgroup_extended_types: bool,
}

impl<'a> Emitter<'a> {
    fn new(
        def: &'a KernelDefinition,
        caps: &'a SpirvCaps,
        checked: bool,
    ) -> Result<Self, ServerError> {
        let mut m = Module::default();
        m.cap(Capability::Shader);
        let glsl = m.id();
        let entry = m.id();
        let layout = arg_layout(def, caps);
        Ok(Self {
            def,
            caps,
            checked,
            m,
            glsl,
            vars: Vec::new(),
            pro: Vec::new(),
            code: Vec::new(),
            entry,
            cur_label: entry,
            terminated: false,
            loops: Vec::new(),
            vals: vec![Vec::new(); def.values().len()],
            var_ptrs: vec![Vec::new(); def.vars().len()],
            buffers: Vec::new(),
            shared: Vec::new(),
            locals: Vec::new(),
            builtins: HashMap::new(),
            inputs: HashMap::new(),
            arg_words: HashMap::new(),
            info_words: HashMap::new(),
            info_var: None,
            pc_var: None,
            layout,
            uses_info: false,
            uses_subgroups: false,
            subgroup_extended_types: false,
        })
    }

    /// `vulkan: kernel `name` uses ... (the device lacks ...)`.
    pub fn lacks(&self, what: &str, feature: &str) -> ServerError {
        ServerError::Unsupported(format!(
            "vulkan: kernel `{}` uses {what} (the device lacks {feature})",
            self.def.name()
        ))
    }

    /// A malformed-IR error.
    pub fn bad(&self, what: impl core::fmt::Display) -> ServerError {
        ServerError::Compilation(format!("vulkan: kernel `{}`: {what}", self.def.name()))
    }

    /// Check every element type the kernel computes with or stores against the device.
    fn check_features(&self) -> Result<(), ServerError> {
        let caps = self.caps;
        let arith = |elem: ElemType| -> Result<(), ServerError> {
            let (ok, feature) = match elem {
                ElemType::I8 | ElemType::U8 => (caps.int8, "shaderInt8"),
                ElemType::I16 | ElemType::U16 => (caps.int16, "shaderInt16"),
                ElemType::I64 | ElemType::U64 => (caps.int64, "shaderInt64"),
                ElemType::F16 => (caps.float16, "shaderFloat16"),
                ElemType::F64 => (caps.float64, "shaderFloat64"),
                _ => (true, ""),
            };
            if ok {
                Ok(())
            } else {
                Err(self.lacks(&format!("{elem} values"), feature))
            }
        };
        for item in self.def.values() {
            arith(item.elem)?;
        }
        for s in self.def.shared() {
            arith(s.item.elem)?;
        }
        for l in self.def.local_arrays() {
            arith(l.item.elem)?;
        }
        for v in self.def.vars() {
            arith(v.item.elem)?;
        }
        for s in self.def.scalars() {
            arith(s.elem)?;
        }
        for b in self.def.buffers() {
            arith(b.elem)?;
            let what = format!("a buffer of {}", b.elem);
            match b.elem {
                ElemType::Bool | ElemType::I8 | ElemType::U8 => {
                    if !caps.storage8 {
                        return Err(self.lacks(&what, "storageBuffer8BitAccess"));
                    }
                    if !caps.int8 {
                        return Err(self.lacks(&what, "shaderInt8"));
                    }
                }
                ElemType::I16 | ElemType::U16 | ElemType::F16 | ElemType::BF16 => {
                    if !caps.storage16 {
                        return Err(self.lacks(&what, "storageBuffer16BitAccess"));
                    }
                    if matches!(b.elem, ElemType::BF16) && !caps.int16 {
                        return Err(self.lacks(&what, "shaderInt16"));
                    }
                }
                _ => {}
            }
            if !super::VALID_WIDTHS.contains(&b.vector_width) {
                return Err(self.bad(format!(
                    "buffer `{}` has vector width {}",
                    b.name, b.vector_width
                )));
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Types.

    /// The register type of an element.
    pub fn reg_ty(&mut self, elem: ElemType) -> u32 {
        match elem {
            ElemType::Bool => self.m.t_bool(),
            ElemType::I8 | ElemType::U8 => self.m.t_int(8),
            ElemType::I16 | ElemType::U16 => self.m.t_int(16),
            ElemType::I32 | ElemType::U32 => self.m.t_int(32),
            ElemType::I64 | ElemType::U64 => self.m.t_int(64),
            ElemType::F16 => self.m.t_float(16),
            ElemType::BF16 | ElemType::F32 => self.m.t_float(32),
            ElemType::F64 => self.m.t_float(64),
        }
    }

    /// Whether shared memory holds `elem` in its global-memory form (`bool` as `u8`, `bf16` as
    /// `u16`, so the arrays take the bytes the IR accounts for), when the device has the 8/16-bit
    /// integers for it.
    fn shared_packed(&self, elem: ElemType) -> bool {
        match elem {
            ElemType::Bool => self.caps.int8,
            ElemType::BF16 => self.caps.int16,
            _ => false,
        }
    }

    /// The element type of a shared or local array's scalars.
    fn array_elem_ty(&mut self, mem: MemRef, elem: ElemType) -> u32 {
        if matches!(mem, MemRef::Shared(_)) && self.shared_packed(elem) {
            self.storage_ty(elem)
        } else {
            self.reg_ty(elem)
        }
    }

    /// The global-memory type of an element.
    fn storage_ty(&mut self, elem: ElemType) -> u32 {
        match elem {
            ElemType::Bool => self.m.t_int(8),
            ElemType::BF16 => self.m.t_int(16),
            other => self.reg_ty(other),
        }
    }

    // ---------------------------------------------------------------------------------------
    // Instructions.

    /// Emit `op type result args...`; the result id.
    pub fn op(&mut self, op: Op, ty: u32, args: &[u32]) -> u32 {
        let id = self.m.id();
        let mut ops = Vec::with_capacity(args.len() + 2);
        ops.push(ty);
        ops.push(id);
        ops.extend_from_slice(args);
        inst(&mut self.code, op, &ops);
        id
    }

    /// Emit an instruction without a result.
    pub fn op_void(&mut self, op: Op, args: &[u32]) {
        inst(&mut self.code, op, args);
    }

    /// A `GLSL.std.450` instruction.
    pub fn gl(&mut self, ty: u32, f: u32, args: &[u32]) -> u32 {
        let mut ops = vec![self.glsl, f];
        ops.extend_from_slice(args);
        self.op(Op::ExtInst, ty, &ops)
    }

    /// Start a block.
    pub fn label(&mut self, id: u32) {
        inst(&mut self.code, Op::Label, &[id]);
        self.cur_label = id;
        self.terminated = false;
    }

    /// End the current block with a branch (unless it already ended).
    pub fn branch(&mut self, target: u32) {
        if !self.terminated {
            inst(&mut self.code, Op::Branch, &[target]);
            self.terminated = true;
        }
    }

    /// Run `f` with the code going to the entry block's prologue.
    fn in_prologue<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        std::mem::swap(&mut self.code, &mut self.pro);
        let r = f(self);
        std::mem::swap(&mut self.code, &mut self.pro);
        r
    }

    /// A function-storage variable of `ty`, optionally initialised.
    pub fn fn_var(&mut self, ty: u32, init: Option<u32>) -> u32 {
        let ptr = self.m.t_ptr(StorageClass::Function, ty);
        let id = self.m.id();
        let mut ops = vec![ptr, id, StorageClass::Function as u32];
        if let Some(i) = init {
            ops.push(i);
        }
        inst(&mut self.vars, Op::Variable, &ops);
        id
    }

    /// A two-way structured selection: `then` runs where `cond`; the values it returns (of
    /// `tys`) merge with zero from the other path.
    pub fn guarded(
        &mut self,
        cond: Option<u32>,
        tys: &[u32],
        f: impl FnOnce(&mut Self) -> Result<Vec<u32>, ServerError>,
    ) -> Result<Vec<u32>, ServerError> {
        let Some(cond) = cond else {
            return f(self);
        };
        let pre = self.cur_label;
        let then_l = self.m.id();
        let merge = self.m.id();
        self.op_void(Op::SelectionMerge, &[merge, 0]);
        self.op_void(Op::BranchConditional, &[cond, then_l, merge]);
        self.label(then_l);
        let vals = f(self)?;
        let then_end = self.cur_label;
        self.branch(merge);
        self.label(merge);
        let mut out = Vec::with_capacity(vals.len());
        for (&v, &t) in vals.iter().zip(tys) {
            let zero = self.m.c_null(t);
            out.push(self.op(Op::Phi, t, &[v, then_end, zero, pre]));
        }
        Ok(out)
    }

    // ---------------------------------------------------------------------------------------
    // Declarations.

    fn declare(&mut self) -> Result<(), ServerError> {
        let def = self.def;
        if self.caps.version < (1, 3) {
            self.m.ext("SPV_KHR_storage_buffer_storage_class");
        }
        for (k, b) in def.buffers().iter().enumerate() {
            let w = u32::from(b.vector_width);
            let per_chunk = w.min(4);
            let chunks = w / per_chunk;
            let st = self.storage_ty(b.elem);
            let chunk_ty = if per_chunk == 1 {
                st
            } else {
                self.m.t_vec(st, per_chunk)
            };
            let size = b.elem.size() as u32;
            match size {
                1 => {
                    self.m.cap(Capability::StorageBuffer8BitAccess);
                    if self.caps.version < (1, 5) {
                        self.m.ext("SPV_KHR_8bit_storage");
                    }
                }
                2 => {
                    self.m.cap(Capability::StorageBuffer16BitAccess);
                    if self.caps.version < (1, 3) {
                        self.m.ext("SPV_KHR_16bit_storage");
                    }
                }
                _ => {}
            }
            let arr = self.m.t_strided_array(chunk_ty, None, per_chunk * size);
            let st_ty = self.m.t_struct(&[arr]);
            self.m.decorate(st_ty, Decoration::Block, &[]);
            self.m.member_decorate(st_ty, 0, Decoration::Offset, &[0]);
            if b.access == Access::ReadOnly {
                self.m
                    .member_decorate(st_ty, 0, Decoration::NonWritable, &[]);
            }
            let ptr = self.m.t_ptr(StorageClass::StorageBuffer, st_ty);
            let var = self.m.global_var(ptr, StorageClass::StorageBuffer);
            self.m.decorate(var, Decoration::DescriptorSet, &[0]);
            self.m.decorate(var, Decoration::Binding, &[k as u32]);
            self.buffers.push(BufInfo {
                var,
                chunk_ty,
                per_chunk,
                chunks,
                elem: b.elem,
            });
        }
        for s in def.shared() {
            let ty = self.array_elem_ty(MemRef::Shared(0), s.item.elem);
            let n = (s.len * u32::from(s.item.width)).max(1);
            let arr = self.m.t_array(ty, n);
            let ptr = self.m.t_ptr(StorageClass::Workgroup, arr);
            let var = self.m.global_var(ptr, StorageClass::Workgroup);
            self.shared.push(var);
        }
        for l in def.local_arrays() {
            let ty = self.reg_ty(l.item.elem);
            let n = (l.len * u32::from(l.item.width)).max(1);
            let arr = self.m.t_array(ty, n);
            let zero = self.m.c_null(arr);
            let var = self.fn_var(arr, Some(zero));
            self.locals.push(var);
        }
        Ok(())
    }

    /// The info buffer variable.
    fn info_var(&mut self) -> u32 {
        self.uses_info = true;
        if let Some(v) = self.info_var {
            return v;
        }
        let u = self.m.t_u32();
        let arr = self.m.t_strided_array(u, None, 4);
        let st = self.m.t_struct(&[arr]);
        self.m.decorate(st, Decoration::Block, &[]);
        self.m.member_decorate(st, 0, Decoration::Offset, &[0]);
        self.m.member_decorate(st, 0, Decoration::NonWritable, &[]);
        let ptr = self.m.t_ptr(StorageClass::StorageBuffer, st);
        let var = self.m.global_var(ptr, StorageClass::StorageBuffer);
        self.m.decorate(var, Decoration::DescriptorSet, &[0]);
        self.m
            .decorate(var, Decoration::Binding, &[self.def.buffers().len() as u32]);
        self.info_var = Some(var);
        var
    }

    /// Word `index` (a `u32` id) of the info buffer.
    fn info_load(&mut self, index: u32) -> u32 {
        let var = self.info_var();
        let u = self.m.t_u32();
        let ptr_ty = self.m.t_ptr(StorageClass::StorageBuffer, u);
        let c0 = self.m.c_u32(0);
        let p = self.op(Op::AccessChain, ptr_ty, &[var, c0, index]);
        self.op(Op::Load, u, &[p])
    }

    /// Constant word `w` of the info buffer, loaded once in the prologue.
    fn info_word(&mut self, w: u32) -> u32 {
        if let Some(&id) = self.info_words.get(&w) {
            return id;
        }
        let id = self.in_prologue(|e| {
            let c = e.m.c_u32(w);
            e.info_load(c)
        });
        self.info_words.insert(w, id);
        id
    }

    /// Argument word `w`, loaded once in the prologue.
    fn arg_word(&mut self, w: u32) -> u32 {
        if !self.layout.in_push_constants {
            return self.info_word(w);
        }
        if let Some(&id) = self.arg_words.get(&w) {
            return id;
        }
        let var = match self.pc_var {
            Some(v) => v,
            None => {
                let u = self.m.t_u32();
                let arr = self.m.t_strided_array(u, Some(self.layout.words), 4);
                let st = self.m.t_struct(&[arr]);
                self.m.decorate(st, Decoration::Block, &[]);
                self.m.member_decorate(st, 0, Decoration::Offset, &[0]);
                let ptr = self.m.t_ptr(StorageClass::PushConstant, st);
                let v = self.m.global_var(ptr, StorageClass::PushConstant);
                self.pc_var = Some(v);
                v
            }
        };
        let id = self.in_prologue(|e| {
            let u = e.m.t_u32();
            let ptr_ty = e.m.t_ptr(StorageClass::PushConstant, u);
            let c0 = e.m.c_u32(0);
            let cw = e.m.c_u32(w);
            let p = e.op(Op::AccessChain, ptr_ty, &[var, c0, cw]);
            e.op(Op::Load, u, &[p])
        });
        self.arg_words.insert(w, id);
        id
    }

    /// A builtin input variable's loaded value.
    fn input(&mut self, b: BuiltIn, vec3: bool) -> u32 {
        if let Some(&id) = self.inputs.get(&(b as u32)) {
            return id;
        }
        let u = self.m.t_u32();
        let ty = if vec3 { self.m.t_vec(u, 3) } else { u };
        let ptr = self.m.t_ptr(StorageClass::Input, ty);
        let var = self.m.global_var(ptr, StorageClass::Input);
        self.m.decorate(var, Decoration::BuiltIn, &[b as u32]);
        let id = self.in_prologue(|e| e.op(Op::Load, ty, &[var]));
        self.inputs.insert(b as u32, id);
        id
    }

    /// A component of a uvec3 builtin.
    fn input_comp(&mut self, b: BuiltIn, c: u32) -> u32 {
        let v = self.input(b, true);
        let u = self.m.t_u32();
        self.in_prologue(|e| e.op(Op::CompositeExtract, u, &[v, c]))
    }

    fn builtin(&mut self, b: Builtin) -> Result<u32, ServerError> {
        if let Some(&id) = self.builtins.get(&b) {
            return Ok(id);
        }
        let [dx, dy, dz] = self.def.cube_dim();
        let u = self.m.t_u32();
        let id = match b {
            Builtin::UnitPosX => self.input_comp(BuiltIn::LocalInvocationId, 0),
            Builtin::UnitPosY => self.input_comp(BuiltIn::LocalInvocationId, 1),
            Builtin::UnitPosZ => self.input_comp(BuiltIn::LocalInvocationId, 2),
            Builtin::CubePosX => self.input_comp(BuiltIn::WorkgroupId, 0),
            Builtin::CubePosY => self.input_comp(BuiltIn::WorkgroupId, 1),
            Builtin::CubePosZ => self.input_comp(BuiltIn::WorkgroupId, 2),
            Builtin::CubeCountX => self.input_comp(BuiltIn::NumWorkgroups, 0),
            Builtin::CubeCountY => self.input_comp(BuiltIn::NumWorkgroups, 1),
            Builtin::CubeCountZ => self.input_comp(BuiltIn::NumWorkgroups, 2),
            Builtin::CubeDimX => self.m.c_u32(dx),
            Builtin::CubeDimY => self.m.c_u32(dy),
            Builtin::CubeDimZ => self.m.c_u32(dz),
            Builtin::CubeDim => self.m.c_u32(dx * dy * dz),
            Builtin::UnitPos => {
                let (x, y, z) = (
                    self.builtin(Builtin::UnitPosX)?,
                    self.builtin(Builtin::UnitPosY)?,
                    self.builtin(Builtin::UnitPosZ)?,
                );
                let cx = self.m.c_u32(dx);
                let cxy = self.m.c_u32(dx * dy);
                self.in_prologue(|e| {
                    let a = e.op(Op::IMul, u, &[y, cx]);
                    let b2 = e.op(Op::IMul, u, &[z, cxy]);
                    let s = e.op(Op::IAdd, u, &[x, a]);
                    e.op(Op::IAdd, u, &[s, b2])
                })
            }
            Builtin::CubePos => {
                let (x, y, z) = (
                    self.builtin(Builtin::CubePosX)?,
                    self.builtin(Builtin::CubePosY)?,
                    self.builtin(Builtin::CubePosZ)?,
                );
                let nx = self.builtin(Builtin::CubeCountX)?;
                let ny = self.builtin(Builtin::CubeCountY)?;
                self.in_prologue(|e| {
                    let a = e.op(Op::IMul, u, &[y, nx]);
                    let nxy = e.op(Op::IMul, u, &[nx, ny]);
                    let b2 = e.op(Op::IMul, u, &[z, nxy]);
                    let s = e.op(Op::IAdd, u, &[x, a]);
                    e.op(Op::IAdd, u, &[s, b2])
                })
            }
            Builtin::CubeCount => {
                let (x, y, z) = (
                    self.builtin(Builtin::CubeCountX)?,
                    self.builtin(Builtin::CubeCountY)?,
                    self.builtin(Builtin::CubeCountZ)?,
                );
                self.in_prologue(|e| {
                    let a = e.op(Op::IMul, u, &[x, y]);
                    e.op(Op::IMul, u, &[a, z])
                })
            }
            Builtin::AbsolutePos => {
                let cp = self.builtin(Builtin::CubePos)?;
                let cd = self.builtin(Builtin::CubeDim)?;
                let up = self.builtin(Builtin::UnitPos)?;
                self.in_prologue(|e| {
                    let a = e.op(Op::IMul, u, &[cp, cd]);
                    e.op(Op::IAdd, u, &[a, up])
                })
            }
            Builtin::AbsolutePosX | Builtin::AbsolutePosY | Builtin::AbsolutePosZ => {
                let (p, d, l) = match b {
                    Builtin::AbsolutePosX => {
                        (Builtin::CubePosX, Builtin::CubeDimX, Builtin::UnitPosX)
                    }
                    Builtin::AbsolutePosY => {
                        (Builtin::CubePosY, Builtin::CubeDimY, Builtin::UnitPosY)
                    }
                    _ => (Builtin::CubePosZ, Builtin::CubeDimZ, Builtin::UnitPosZ),
                };
                let (p, d, l) = (self.builtin(p)?, self.builtin(d)?, self.builtin(l)?);
                self.in_prologue(|e| {
                    let a = e.op(Op::IMul, u, &[p, d]);
                    e.op(Op::IAdd, u, &[a, l])
                })
            }
            Builtin::PlaneSize | Builtin::UnitPosPlane => {
                self.need_subgroups(b.name())?;
                let which = if b == Builtin::PlaneSize {
                    BuiltIn::SubgroupSize
                } else {
                    BuiltIn::SubgroupLocalInvocationId
                };
                self.input(which, false)
            }
        };
        self.builtins.insert(b, id);
        Ok(id)
    }

    /// Require subgroup operations (and declare the basic capability).
    pub fn need_subgroups(&mut self, what: &str) -> Result<(), ServerError> {
        if !self.caps.subgroups {
            return Err(self.lacks(
                &format!("`{what}`"),
                "subgroup operations in the compute stage",
            ));
        }
        self.uses_subgroups = true;
        self.m.cap(Capability::GroupNonUniform);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Values.

    fn item(&self, v: ValueId) -> Result<Item, ServerError> {
        self.def
            .values()
            .get(v.0 as usize)
            .copied()
            .ok_or_else(|| self.bad(format!("value %{} has no type", v.0)))
    }

    fn get(&self, v: ValueId) -> Result<Vec<u32>, ServerError> {
        match self.vals.get(v.0 as usize) {
            Some(ids) if !ids.is_empty() => Ok(ids.clone()),
            _ => Err(self.bad(format!("value %{} is used before its definition", v.0))),
        }
    }

    fn scalar(&self, v: ValueId) -> Result<u32, ServerError> {
        Ok(self.get(v)?[0])
    }

    /// A constant of an element's register type.
    pub fn literal(&mut self, v: &ScalarValue) -> u32 {
        match *v {
            ScalarValue::Bool(b) => self.m.c_bool(b),
            ScalarValue::I8(x) => self.m.c_int(8, x as u8 as u64),
            ScalarValue::U8(x) => self.m.c_int(8, u64::from(x)),
            ScalarValue::I16(x) => self.m.c_int(16, x as u16 as u64),
            ScalarValue::U16(x) => self.m.c_int(16, u64::from(x)),
            ScalarValue::I32(x) => self.m.c_int(32, x as u32 as u64),
            ScalarValue::U32(x) => self.m.c_int(32, u64::from(x)),
            ScalarValue::I64(x) => self.m.c_int(64, x as u64),
            ScalarValue::U64(x) => self.m.c_int(64, x),
            ScalarValue::F16(x) => {
                let t = self.m.t_float(16);
                self.m.constant(t, &[u32::from(x.to_bits())])
            }
            ScalarValue::BF16(x) => {
                let t = self.m.t_float(32);
                self.m.constant(t, &[x.to_f32().to_bits()])
            }
            ScalarValue::F32(x) => {
                let t = self.m.t_float(32);
                self.m.constant(t, &[x.to_bits()])
            }
            ScalarValue::F64(x) => {
                let t = self.m.t_float(64);
                let b = x.to_bits();
                self.m.constant(t, &[b as u32, (b >> 32) as u32])
            }
        }
    }

    /// A constant `v` of an element's register type.
    pub fn const_of(&mut self, elem: ElemType, v: f64) -> u32 {
        match elem {
            ElemType::Bool => self.m.c_bool(v != 0.0),
            ElemType::F16 => self.m.c_float(16, v),
            ElemType::BF16 | ElemType::F32 => self.m.c_float(32, v),
            ElemType::F64 => self.m.c_float(64, v),
            e => self.m.c_int(bits(e), v as i64 as u64),
        }
    }

    /// An integer constant of an element (bit pattern).
    pub fn const_bits(&mut self, elem: ElemType, v: u64) -> u32 {
        self.m.c_int(bits(elem), v)
    }

    /// A scalar parameter, from the argument words.
    fn scalar_param(&mut self, i: u32) -> Result<u32, ServerError> {
        let decl = self
            .def
            .scalars()
            .get(i as usize)
            .ok_or_else(|| self.bad(format!("scalar {i} is not declared")))?;
        let elem = decl.elem;
        let w = self.layout.scalar_words[i as usize];
        let lo = self.arg_word(w);
        let hi = if elem.size() == 8 {
            Some(self.arg_word(w + 1))
        } else {
            None
        };
        let ty = self.reg_ty(elem);
        let u = self.m.t_u32();
        Ok(self.in_prologue(|e| match elem {
            ElemType::Bool => {
                let z = e.m.c_u32(0);
                let b = e.m.t_bool();
                e.op(Op::INotEqual, b, &[lo, z])
            }
            ElemType::U32 | ElemType::I32 => lo,
            ElemType::F32 => e.op(Op::Bitcast, ty, &[lo]),
            ElemType::BF16 => {
                let s = e.m.c_u32(16);
                let sh = e.op(Op::ShiftLeftLogical, u, &[lo, s]);
                e.op(Op::Bitcast, ty, &[sh])
            }
            ElemType::I8 | ElemType::U8 | ElemType::I16 | ElemType::U16 => {
                e.op(Op::UConvert, ty, &[lo])
            }
            ElemType::F16 => {
                let t16 = e.m.t_int(16);
                let h = e.op(Op::UConvert, t16, &[lo]);
                e.op(Op::Bitcast, ty, &[h])
            }
            _ => {
                let t64 = e.m.t_int(64);
                let l = e.op(Op::UConvert, t64, &[lo]);
                let h = e.op(Op::UConvert, t64, &[hi.unwrap_or(lo)]);
                let s = e.m.c_u32(32);
                let hs = e.op(Op::ShiftLeftLogical, t64, &[h, s]);
                let v = e.op(Op::BitwiseOr, t64, &[l, hs]);
                if elem == ElemType::F64 {
                    e.op(Op::Bitcast, ty, &[v])
                } else {
                    v
                }
            }
        }))
    }

    /// The (offset, length) argument words of a buffer.
    fn buffer_range(&mut self, b: u32) -> Result<(u32, u32), ServerError> {
        let w = *self
            .layout
            .buffer_words
            .get(b as usize)
            .ok_or_else(|| self.bad(format!("buffer {b} is not declared")))?;
        Ok((self.arg_word(w), self.arg_word(w + 1)))
    }

    /// The (rank, metadata offset) words of a buffer.
    fn buffer_meta(&mut self, b: u32) -> Result<(u32, u32), ServerError> {
        if b as usize >= self.def.buffers().len() {
            return Err(self.bad(format!("buffer {b} is not declared")));
        }
        let h = self.layout.info_header_word + 2 * b;
        Ok((self.info_word(h), self.info_word(h + 1)))
    }

    /// An integer index as `u32`, with the condition that it is non-negative and fits (None
    /// when it always does).
    fn index_u32(&mut self, v: ValueId) -> Result<(u32, Option<u32>), ServerError> {
        let item = self.item(v)?;
        if !item.elem.is_int() || item.width != 1 {
            return Err(self.bad(format!("index of type {item}")));
        }
        let x = self.scalar(v)?;
        let u = self.m.t_u32();
        let bt = self.m.t_bool();
        let signed = item.elem.is_signed_int();
        Ok(match bits(item.elem) {
            32 => {
                if signed {
                    let z = self.m.c_u32(0);
                    let ok = self.op(Op::SGreaterThanEqual, bt, &[x, z]);
                    (x, Some(ok))
                } else {
                    (x, None)
                }
            }
            64 => {
                let t64 = self.m.t_int(64);
                let s = self.m.c_u32(32);
                let hi = self.op(Op::ShiftRightLogical, t64, &[x, s]);
                let z = self.m.c_int(64, 0);
                let ok = self.op(Op::IEqual, bt, &[hi, z]);
                let lo = self.op(Op::UConvert, u, &[x]);
                (lo, Some(ok))
            }
            _ => {
                if signed {
                    let w = self.op(Op::SConvert, u, &[x]);
                    let z = self.m.c_u32(0);
                    let ok = self.op(Op::SGreaterThanEqual, bt, &[w, z]);
                    (w, Some(ok))
                } else {
                    (self.op(Op::UConvert, u, &[x]), None)
                }
            }
        })
    }

    /// `fits && idx < len`.
    fn in_range(&mut self, idx: u32, fits: Option<u32>, len: u32) -> u32 {
        let bt = self.m.t_bool();
        let lt = self.op(Op::ULessThan, bt, &[idx, len]);
        match fits {
            Some(f) => self.op(Op::LogicalAnd, bt, &[f, lt]),
            None => lt,
        }
    }

    /// A pointer to scalar `c` of entry `idx` of a shared or local array, its storage class.
    fn array_ptr(&mut self, mem: MemRef, idx: u32, c: u32) -> Result<u32, ServerError> {
        let (var, item, class) = match mem {
            MemRef::Shared(s) => {
                let d = self
                    .def
                    .shared()
                    .get(s as usize)
                    .ok_or_else(|| self.bad(format!("shared array {s} is not declared")))?;
                (self.shared[s as usize], d.item, StorageClass::Workgroup)
            }
            MemRef::Local(l) => {
                let d = self
                    .def
                    .local_arrays()
                    .get(l as usize)
                    .ok_or_else(|| self.bad(format!("local array {l} is not declared")))?;
                (self.locals[l as usize], d.item, StorageClass::Function)
            }
            MemRef::Global(_) => return Err(self.bad("global memory is not an array")),
        };
        let u = self.m.t_u32();
        let w = u32::from(item.width);
        let flat = if w == 1 {
            idx
        } else {
            let cw = self.m.c_u32(w);
            let m = self.op(Op::IMul, u, &[idx, cw]);
            let cc = self.m.c_u32(c);
            self.op(Op::IAdd, u, &[m, cc])
        };
        let ty = self.array_elem_ty(mem, item.elem);
        let pt = self.m.t_ptr(class, ty);
        Ok(self.op(Op::AccessChain, pt, &[var, flat]))
    }

    /// Entries of a shared or local array.
    fn array_len(&self, mem: MemRef) -> u32 {
        match mem {
            MemRef::Shared(s) => self.def.shared()[s as usize].len,
            MemRef::Local(l) => self.def.local_arrays()[l as usize].len,
            MemRef::Global(_) => 0,
        }
    }

    /// The address of entry `index` of memory: the `u32` entry index to use, and the guard.
    fn address(&mut self, mem: MemRef, index: ValueId) -> Result<(u32, Option<u32>), ServerError> {
        let (idx, fits) = self.index_u32(index)?;
        let u = self.m.t_u32();
        match mem {
            MemRef::Global(b) => {
                let (off, len) = self.buffer_range(b)?;
                let guard = if self.checked {
                    Some(self.in_range(idx, fits, len))
                } else {
                    None
                };
                let a = self.op(Op::IAdd, u, &[off, idx]);
                Ok((a, guard))
            }
            _ => {
                if matches!(mem, MemRef::Shared(s) if s as usize >= self.shared.len())
                    || matches!(mem, MemRef::Local(l) if l as usize >= self.locals.len())
                {
                    return Err(self.bad("undeclared shared or local array"));
                }
                let n = self.array_len(mem);
                let len = self.m.c_u32(n);
                let g = self.in_range(idx, fits, len);
                Ok((idx, Some(g)))
            }
        }
    }

    /// A pointer to chunk `j` of item `a` of global buffer `b`.
    fn chunk_ptr(&mut self, b: u32, a: u32, j: u32) -> u32 {
        let (var, chunk_ty, chunks) = {
            let bi = &self.buffers[b as usize];
            (bi.var, bi.chunk_ty, bi.chunks)
        };
        let u = self.m.t_u32();
        let ci = if chunks == 1 {
            a
        } else {
            let k = self.m.c_u32(chunks);
            let m = self.op(Op::IMul, u, &[a, k]);
            let cj = self.m.c_u32(j);
            self.op(Op::IAdd, u, &[m, cj])
        };
        let pt = self.m.t_ptr(StorageClass::StorageBuffer, chunk_ty);
        let c0 = self.m.c_u32(0);
        self.op(Op::AccessChain, pt, &[var, c0, ci])
    }

    /// A global-memory scalar converted to its register form.
    fn load_conv(&mut self, elem: ElemType, x: u32) -> u32 {
        match elem {
            ElemType::Bool => {
                let bt = self.m.t_bool();
                let z = self.m.c_int(8, 0);
                self.op(Op::INotEqual, bt, &[x, z])
            }
            ElemType::BF16 => {
                let u = self.m.t_u32();
                let w = self.op(Op::UConvert, u, &[x]);
                let s = self.m.c_u32(16);
                let sh = self.op(Op::ShiftLeftLogical, u, &[w, s]);
                let f = self.m.t_float(32);
                self.op(Op::Bitcast, f, &[sh])
            }
            _ => x,
        }
    }

    /// A register scalar converted to its global-memory form.
    fn store_conv(&mut self, elem: ElemType, x: u32) -> u32 {
        match elem {
            ElemType::Bool => {
                let t8 = self.m.t_int(8);
                let one = self.m.c_int(8, 1);
                let zero = self.m.c_int(8, 0);
                self.op(Op::Select, t8, &[x, one, zero])
            }
            ElemType::BF16 => {
                let u = self.m.t_u32();
                let b = self.op(Op::Bitcast, u, &[x]);
                let s = self.m.c_u32(16);
                let sh = self.op(Op::ShiftRightLogical, u, &[b, s]);
                let t16 = self.m.t_int(16);
                self.op(Op::UConvert, t16, &[sh])
            }
            _ => x,
        }
    }

    fn load_global(&mut self, b: u32, a: u32) -> Vec<u32> {
        let (chunk_ty, per_chunk, chunks, elem) = {
            let bi = &self.buffers[b as usize];
            (bi.chunk_ty, bi.per_chunk, bi.chunks, bi.elem)
        };
        let st = self.storage_ty(elem);
        let mut out = Vec::new();
        for j in 0..chunks {
            let p = self.chunk_ptr(b, a, j);
            let v = self.op(Op::Load, chunk_ty, &[p]);
            if per_chunk == 1 {
                out.push(self.load_conv(elem, v));
            } else {
                for c in 0..per_chunk {
                    let x = self.op(Op::CompositeExtract, st, &[v, c]);
                    out.push(self.load_conv(elem, x));
                }
            }
        }
        out
    }

    fn store_global(&mut self, b: u32, a: u32, vals: &[u32]) {
        let (chunk_ty, per_chunk, chunks, elem) = {
            let bi = &self.buffers[b as usize];
            (bi.chunk_ty, bi.per_chunk, bi.chunks, bi.elem)
        };
        for j in 0..chunks {
            let comps: Vec<u32> = (0..per_chunk)
                .map(|c| vals[(j * per_chunk + c) as usize])
                .collect();
            let comps: Vec<u32> = comps
                .into_iter()
                .map(|x| self.store_conv(elem, x))
                .collect();
            let v = if per_chunk == 1 {
                comps[0]
            } else {
                self.op(Op::CompositeConstruct, chunk_ty, &comps)
            };
            let p = self.chunk_ptr(b, a, j);
            self.op_void(Op::Store, &[p, v]);
        }
    }

    /// The item of a memory's entries.
    fn mem_item(&self, mem: MemRef) -> Result<Item, ServerError> {
        match mem {
            MemRef::Global(b) => self
                .def
                .buffers()
                .get(b as usize)
                .map(|d| d.item())
                .ok_or_else(|| self.bad(format!("buffer {b} is not declared"))),
            MemRef::Shared(s) => self
                .def
                .shared()
                .get(s as usize)
                .map(|d| d.item)
                .ok_or_else(|| self.bad(format!("shared array {s} is not declared"))),
            MemRef::Local(l) => self
                .def
                .local_arrays()
                .get(l as usize)
                .map(|d| d.item)
                .ok_or_else(|| self.bad(format!("local array {l} is not declared"))),
        }
    }

    fn load(&mut self, mem: MemRef, index: ValueId) -> Result<Vec<u32>, ServerError> {
        let item = self.mem_item(mem)?;
        let (a, guard) = self.address(mem, index)?;
        let ty = self.reg_ty(item.elem);
        let tys = vec![ty; item.width as usize];
        self.guarded(guard, &tys, |e| match mem {
            MemRef::Global(b) => Ok(e.load_global(b, a)),
            _ => {
                let packed = matches!(mem, MemRef::Shared(_)) && e.shared_packed(item.elem);
                let st = e.array_elem_ty(mem, item.elem);
                let mut out = Vec::new();
                for c in 0..u32::from(item.width) {
                    let p = e.array_ptr(mem, a, c)?;
                    let v = e.op(Op::Load, st, &[p]);
                    out.push(if packed { e.load_conv(item.elem, v) } else { v });
                }
                Ok(out)
            }
        })
    }

    fn store(&mut self, mem: MemRef, index: ValueId, value: ValueId) -> Result<(), ServerError> {
        let item = self.mem_item(mem)?;
        let vals = self.get(value)?;
        if vals.len() != item.width as usize {
            return Err(self.bad(format!(
                "stored value %{} does not match the memory's item {item}",
                value.0
            )));
        }
        let (a, guard) = self.address(mem, index)?;
        self.guarded(guard, &[], |e| {
            match mem {
                MemRef::Global(b) => {
                    if e.def.buffers()[b as usize].access == Access::ReadOnly {
                        return Err(e.bad("store to a read-only buffer"));
                    }
                    e.store_global(b, a, &vals);
                }
                _ => {
                    let packed = matches!(mem, MemRef::Shared(_)) && e.shared_packed(item.elem);
                    for (c, &v) in vals.iter().enumerate() {
                        let v = if packed {
                            e.store_conv(item.elem, v)
                        } else {
                            v
                        };
                        let p = e.array_ptr(mem, a, c as u32)?;
                        e.op_void(Op::Store, &[p, v]);
                    }
                }
            }
            Ok(Vec::new())
        })?;
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Statements.

    fn block(&mut self, block: &Block) -> Result<(), ServerError> {
        for stmt in &block.stmts {
            self.stmt(stmt)?;
            if self.terminated {
                // The rest of the block is unreachable (after return, break or continue).
                break;
            }
        }
        Ok(())
    }

    fn var_ptrs(&mut self, var: u32) -> Result<Vec<u32>, ServerError> {
        let decl = self
            .def
            .vars()
            .get(var as usize)
            .ok_or_else(|| self.bad(format!("variable {var} is not declared")))?;
        if self.var_ptrs[var as usize].is_empty() {
            let item = decl.item;
            let ty = self.reg_ty(item.elem);
            let zero = self.m.c_null(ty);
            let ptrs = (0..item.width)
                .map(|_| self.fn_var(ty, Some(zero)))
                .collect();
            self.var_ptrs[var as usize] = ptrs;
        }
        Ok(self.var_ptrs[var as usize].clone())
    }

    fn stmt(&mut self, stmt: &Stmt) -> Result<(), ServerError> {
        match stmt {
            Stmt::Let { out, op } => {
                let ids = self.let_op(*out, op)?;
                let item = self.item(*out)?;
                if ids.len() != item.width as usize {
                    return Err(self.bad(format!(
                        "value %{} has {} components, its type {item}",
                        out.0,
                        ids.len()
                    )));
                }
                self.vals[out.0 as usize] = ids;
                Ok(())
            }
            Stmt::Store { mem, index, value } => self.store(*mem, *index, *value),
            Stmt::DeclareVar { var, init: value } | Stmt::Assign { var, value } => {
                let ptrs = self.var_ptrs(var.0)?;
                let vals = self.get(*value)?;
                if ptrs.len() != vals.len() {
                    return Err(self.bad(format!("variable {} assigned another item", var.0)));
                }
                for (p, v) in ptrs.into_iter().zip(vals) {
                    self.op_void(Op::Store, &[p, v]);
                }
                Ok(())
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.scalar(*cond)?;
                let then_l = self.m.id();
                let merge = self.m.id();
                let else_l = if otherwise.stmts.is_empty() {
                    merge
                } else {
                    self.m.id()
                };
                self.op_void(Op::SelectionMerge, &[merge, 0]);
                self.op_void(Op::BranchConditional, &[c, then_l, else_l]);
                self.terminated = true;
                self.label(then_l);
                self.block(then)?;
                self.branch(merge);
                if else_l != merge {
                    self.label(else_l);
                    self.block(otherwise)?;
                    self.branch(merge);
                }
                self.label(merge);
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
                let header = self.m.id();
                let body_l = self.m.id();
                let cont = self.m.id();
                let merge = self.m.id();
                self.branch(header);
                self.label(header);
                self.op_void(Op::LoopMerge, &[merge, cont, 0]);
                self.op_void(Op::Branch, &[body_l]);
                self.terminated = true;
                self.label(body_l);
                self.loops.push((merge, cont));
                self.block(body)?;
                self.loops.pop();
                self.branch(cont);
                self.label(cont);
                self.op_void(Op::Branch, &[header]);
                self.terminated = true;
                self.label(merge);
                Ok(())
            }
            Stmt::Break => {
                let (merge, _) = *self
                    .loops
                    .last()
                    .ok_or_else(|| self.bad("break outside a loop"))?;
                self.branch(merge);
                Ok(())
            }
            Stmt::Continue => {
                let (_, cont) = *self
                    .loops
                    .last()
                    .ok_or_else(|| self.bad("continue outside a loop"))?;
                self.branch(cont);
                Ok(())
            }
            Stmt::Return => {
                if !self.terminated {
                    self.op_void(Op::Return, &[]);
                    self.terminated = true;
                }
                Ok(())
            }
            Stmt::Barrier => {
                let scope = self.m.c_u32(SCOPE_WORKGROUP);
                let sem = self.m.c_u32(SEM_ACQ_REL | SEM_WORKGROUP | SEM_UNIFORM);
                self.op_void(Op::ControlBarrier, &[scope, scope, sem]);
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
            return Err(self.bad(format!("range loop over {item}")));
        }
        let (s, en, st) = (self.scalar(start)?, self.scalar(end)?, self.scalar(step)?);
        let ty = self.reg_ty(elem);
        let bt = self.m.t_bool();
        let nbits = bits(elem);
        let signed = elem.is_signed_int();
        let zero = self.m.c_int(nbits, 0);
        let ivar = self.fn_var(ty, None);
        self.op_void(Op::Store, &[ivar, s]);
        let header = self.m.id();
        let body_l = self.m.id();
        let cont = self.m.id();
        let merge = self.m.id();
        self.branch(header);
        self.label(header);
        let i = self.op(Op::Load, ty, &[ivar]);
        let nz = self.op(Op::INotEqual, bt, &[st, zero]);
        let go = if signed {
            let pos = self.op(Op::SGreaterThan, bt, &[st, zero]);
            let lt = self.op(Op::SLessThan, bt, &[i, en]);
            let gt = self.op(Op::SGreaterThan, bt, &[i, en]);
            let c = self.op(Op::Select, bt, &[pos, lt, gt]);
            self.op(Op::LogicalAnd, bt, &[nz, c])
        } else {
            let lt = self.op(Op::ULessThan, bt, &[i, en]);
            self.op(Op::LogicalAnd, bt, &[nz, lt])
        };
        self.op_void(Op::LoopMerge, &[merge, cont, 0]);
        self.op_void(Op::BranchConditional, &[go, body_l, merge]);
        self.terminated = true;
        self.label(body_l);
        let iv = self.op(Op::Load, ty, &[ivar]);
        self.vals[var.0 as usize] = vec![iv];
        self.loops.push((merge, cont));
        self.block(body)?;
        self.loops.pop();
        self.branch(cont);
        self.label(cont);
        let i = self.op(Op::Load, ty, &[ivar]);
        let overflow = if signed {
            let max = self.m.c_int(nbits, (1u64 << (nbits - 1)) - 1);
            let min = self.m.c_int(nbits, 1u64 << (nbits - 1));
            let pos = self.op(Op::SGreaterThan, bt, &[st, zero]);
            let hi = self.op(Op::ISub, ty, &[max, st]);
            let lo = self.op(Op::ISub, ty, &[min, st]);
            let over = self.op(Op::SGreaterThan, bt, &[i, hi]);
            let under = self.op(Op::SLessThan, bt, &[i, lo]);
            self.op(Op::Select, bt, &[pos, over, under])
        } else {
            let max = self.m.c_int(nbits, u64::MAX);
            let hi = self.op(Op::ISub, ty, &[max, st]);
            self.op(Op::UGreaterThan, bt, &[i, hi])
        };
        let next = self.op(Op::IAdd, ty, &[i, st]);
        self.op_void(Op::Store, &[ivar, next]);
        self.op_void(Op::BranchConditional, &[overflow, merge, header]);
        self.terminated = true;
        self.label(merge);
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Operations.

    fn let_op(&mut self, out: ValueId, op: &IrOp) -> Result<Vec<u32>, ServerError> {
        let oi = self.item(out)?;
        let w = oi.width as usize;
        let u = self.m.t_u32();
        Ok(match op {
            IrOp::Literal(v) => {
                let c = self.literal(v);
                vec![c; w]
            }
            IrOp::Builtin(b) => vec![self.builtin(*b)?],
            IrOp::Scalar(i) => vec![self.scalar_param(*i)?],
            IrOp::Load { mem, index } => self.load(*mem, *index)?,
            IrOp::Len(b) => {
                let (_, len) = self.buffer_range(*b)?;
                vec![len]
            }
            IrOp::Rank(b) => {
                let (rank, _) = self.buffer_meta(*b)?;
                vec![rank]
            }
            IrOp::Shape { buffer, dim } | IrOp::Stride { buffer, dim } => {
                let (rank, moff) = self.buffer_meta(*buffer)?;
                let (d, fits) = self.index_u32(*dim)?;
                let ok = self.in_range(d, fits, rank);
                let mut at = self.op(Op::IAdd, u, &[moff, d]);
                if matches!(op, IrOp::Stride { .. }) {
                    at = self.op(Op::IAdd, u, &[at, rank]);
                }
                let z = self.m.c_u32(0);
                let safe = self.op(Op::Select, u, &[ok, at, z]);
                let v = self.info_load(safe);
                vec![self.op(Op::Select, u, &[ok, v, z])]
            }
            IrOp::ReadVar(var) => {
                let ptrs = self.var_ptrs(var.0)?;
                let ty = self.reg_ty(oi.elem);
                ptrs.into_iter()
                    .map(|p| self.op(Op::Load, ty, &[p]))
                    .collect()
            }
            IrOp::Unary(uop, a) => {
                let elem = self.item(*a)?.elem;
                let xs = self.get(*a)?;
                let mut out = Vec::with_capacity(w);
                for x in xs {
                    out.push(self.unary(*uop, elem, x)?);
                }
                out
            }
            IrOp::Binary(bop, a, b) => {
                let elem = self.item(*a)?.elem;
                let (xs, ys) = (self.get(*a)?, self.get(*b)?);
                let mut out = Vec::with_capacity(w);
                for (x, y) in xs.into_iter().zip(ys) {
                    out.push(self.binary(*bop, elem, x, y)?);
                }
                out
            }
            IrOp::Compare(c, a, b) => {
                let elem = self.item(*a)?.elem;
                let (xs, ys) = (self.get(*a)?, self.get(*b)?);
                let mut out = Vec::with_capacity(w);
                for (x, y) in xs.into_iter().zip(ys) {
                    out.push(self.compare(*c, elem, x, y));
                }
                out
            }
            IrOp::Fma(a, b, c) => {
                let elem = oi.elem;
                let (xs, ys, zs) = (self.get(*a)?, self.get(*b)?, self.get(*c)?);
                let mut out = Vec::with_capacity(w);
                for i in 0..w {
                    out.push(self.fma(elem, xs[i], ys[i], zs[i])?);
                }
                out
            }
            IrOp::Clamp(x, lo, hi) => {
                let elem = oi.elem;
                let (xs, ls, hs) = (self.get(*x)?, self.get(*lo)?, self.get(*hi)?);
                let mut out = Vec::with_capacity(w);
                for i in 0..w {
                    let m = self.binary(BinaryOp::Max, elem, xs[i], ls[i])?;
                    out.push(self.binary(BinaryOp::Min, elem, m, hs[i])?);
                }
                out
            }
            IrOp::Select(c, a, b) => {
                let (cs, xs, ys) = (self.get(*c)?, self.get(*a)?, self.get(*b)?);
                let ty = self.reg_ty(oi.elem);
                let mut out = Vec::with_capacity(w);
                for i in 0..w {
                    let ci = if cs.len() == 1 { cs[0] } else { cs[i] };
                    out.push(self.op(Op::Select, ty, &[ci, xs[i], ys[i]]));
                }
                out
            }
            IrOp::Cast(x, to) => {
                let from = self.item(*x)?.elem;
                let xs = self.get(*x)?;
                let mut out = Vec::with_capacity(w);
                for x in xs {
                    out.push(self.cast(from, *to, x)?);
                }
                out
            }
            IrOp::Bitcast(x, to, _) => {
                let from = self.item(*x)?.elem;
                let xs = self.get(*x)?;
                self.bitcast(from, *to, &xs, w)?
            }
            IrOp::Splat(x, _) => {
                let s = self.scalar(*x)?;
                vec![s; w]
            }
            IrOp::Extract(x, c) => {
                let xs = self.get(*x)?;
                vec![
                    *xs.get(*c as usize)
                        .ok_or_else(|| self.bad("extract past the vector's width"))?,
                ]
            }
            IrOp::Insert(x, c, s) => {
                let mut xs = self.get(*x)?;
                let s = self.scalar(*s)?;
                *xs.get_mut(*c as usize)
                    .ok_or_else(|| self.bad("insert past the vector's width"))? = s;
                xs
            }
            IrOp::Vector(parts) => {
                let mut out = Vec::with_capacity(w);
                for p in parts {
                    out.extend(self.get(*p)?);
                }
                out
            }
            IrOp::Atomic {
                op,
                mem,
                index,
                value,
                compare,
            } => vec![self.atomic(oi, *op, *mem, *index, *value, *compare)?],
            IrOp::Plane(p, x) => {
                let elem = self.item(*x)?.elem;
                let xs = self.get(*x)?;
                let mut out = Vec::with_capacity(w);
                for x in xs {
                    out.push(self.plane(*p, elem, x)?);
                }
                out
            }
            IrOp::PlaneBroadcast(x, lane) | IrOp::PlaneShuffle(x, lane) => {
                let broadcast = matches!(op, IrOp::PlaneBroadcast(..));
                self.need_subgroups(if broadcast {
                    "plane_broadcast"
                } else {
                    "plane_shuffle"
                })?;
                let elem = self.item(*x)?.elem;
                let ty = self.reg_ty(elem);
                let xs = self.get(*x)?;
                let l = self.lane_u32(*lane)?;
                // Before SPIR-V 1.5 a broadcast lane must be a constant; shuffle otherwise.
                let use_broadcast =
                    broadcast && (self.caps.version >= (1, 5) || self.m.is_const(l));
                if use_broadcast {
                    self.m.cap(Capability::GroupNonUniformBallot);
                } else {
                    self.m.cap(Capability::GroupNonUniformShuffle);
                }
                let mut out = Vec::with_capacity(w);
                for x in xs {
                    out.push(self.lane_op(elem, ty, x, l, use_broadcast)?);
                }
                out
            }
            IrOp::Ballot(x) => {
                self.need_subgroups("ballot")?;
                self.m.cap(Capability::GroupNonUniformBallot);
                let c = self.scalar(*x)?;
                let v4 = self.m.t_vec(u, 4);
                let scope = self.m.c_u32(SCOPE_SUBGROUP);
                let b = self.op(Op::GroupNonUniformBallot, v4, &[scope, c]);
                (0..4)
                    .map(|i| self.op(Op::CompositeExtract, u, &[b, i]))
                    .collect()
            }
        })
    }

    /// Broadcast or shuffle one scalar. 8/16-bit integers and `f16` move as 32 bits and 64-bit
    /// integers as two 32-bit halves, so no `shaderSubgroupExtendedTypes` is needed.
    fn lane_op(
        &mut self,
        elem: ElemType,
        ty: u32,
        x: u32,
        lane: u32,
        broadcast: bool,
    ) -> Result<u32, ServerError> {
        let scope = self.m.c_u32(SCOPE_SUBGROUP);
        let one = |e: &mut Self, t: u32, v: u32| {
            if broadcast {
                e.op(Op::GroupNonUniformBroadcast, t, &[scope, v, lane])
            } else {
                e.op(Op::GroupNonUniformShuffle, t, &[scope, v, lane])
            }
        };
        let u = self.m.t_u32();
        Ok(match elem {
            ElemType::I8 | ElemType::U8 | ElemType::I16 | ElemType::U16 => {
                let w = self.op(Op::UConvert, u, &[x]);
                let r = one(self, u, w);
                self.op(Op::UConvert, ty, &[r])
            }
            ElemType::F16 => {
                let w = self.widen_math(elem, x);
                let f = self.m.t_float(32);
                let r = one(self, f, w);
                self.narrow_math(elem, r)
            }
            ElemType::I64 | ElemType::U64 => {
                let s = self.m.c_u32(32);
                let lo = self.op(Op::UConvert, u, &[x]);
                let hi = self.op(Op::ShiftRightLogical, ty, &[x, s]);
                let hi = self.op(Op::UConvert, u, &[hi]);
                let lo = one(self, u, lo);
                let hi = one(self, u, hi);
                let lo = self.op(Op::UConvert, ty, &[lo]);
                let hi = self.op(Op::UConvert, ty, &[hi]);
                let hi = self.op(Op::ShiftLeftLogical, ty, &[hi, s]);
                self.op(Op::BitwiseOr, ty, &[hi, lo])
            }
            _ => one(self, ty, x),
        })
    }

    /// A lane index as `u32`.
    fn lane_u32(&mut self, lane: ValueId) -> Result<u32, ServerError> {
        let (l, _) = self.index_u32(lane)?;
        Ok(l)
    }

    fn atomic(
        &mut self,
        oi: Item,
        op: AtomicOp,
        mem: MemRef,
        index: ValueId,
        value: ValueId,
        compare: Option<ValueId>,
    ) -> Result<u32, ServerError> {
        let elem = oi.elem;
        let shared = match mem {
            MemRef::Global(_) => false,
            MemRef::Shared(_) => true,
            MemRef::Local(_) => return Err(self.bad("atomics on a local array")),
        };
        let mi = self.mem_item(mem)?;
        if oi.width != 1 || mi.width != 1 {
            return Err(self.bad(format!("atomic on {mi} (atomics need a scalar memory)")));
        }
        if let MemRef::Global(b) = mem
            && self.def.buffers()[b as usize].access == Access::ReadOnly
        {
            return Err(self.bad("atomic on a read-only buffer"));
        }
        let where_ = if shared { "shared" } else { "global" };
        match elem {
            ElemType::I32 | ElemType::U32 => {}
            ElemType::I64 | ElemType::U64 => {
                let ok = if shared {
                    self.caps.int64_atomics_shared
                } else {
                    self.caps.int64_atomics_buffer
                };
                if !ok {
                    return Err(self.lacks(
                        &format!("64-bit atomics on {where_} memory"),
                        if shared {
                            "shaderSharedInt64Atomics"
                        } else {
                            "shaderBufferInt64Atomics"
                        },
                    ));
                }
                self.m.cap(Capability::Int64Atomics);
            }
            ElemType::F32 => match op {
                AtomicOp::Load | AtomicOp::Store | AtomicOp::Exchange => {}
                AtomicOp::Add => {
                    let ok = if shared {
                        self.caps.float32_atomic_add_shared
                    } else {
                        self.caps.float32_atomic_add_buffer
                    };
                    if !ok {
                        return Err(self.lacks(
                            &format!("f32 atomic add on {where_} memory"),
                            if shared {
                                "shaderSharedFloat32AtomicAdd"
                            } else {
                                "shaderBufferFloat32AtomicAdd"
                            },
                        ));
                    }
                    self.m.cap(Capability::AtomicFloat32AddEXT);
                    self.m.ext("SPV_EXT_shader_atomic_float_add");
                }
                other => {
                    return Err(ServerError::Unsupported(format!(
                        "vulkan: kernel `{}` uses {} on f32 (only load, store, exchange and add)",
                        self.def.name(),
                        other.name()
                    )));
                }
            },
            other => {
                return Err(ServerError::Unsupported(format!(
                    "vulkan: kernel `{}` uses atomics on {other} (32/64-bit integers and f32 only)",
                    self.def.name()
                )));
            }
        }
        let v = self.scalar(value)?;
        let cmp = match compare {
            Some(c) => Some(self.scalar(c)?),
            None => None,
        };
        let ty = self.reg_ty(elem);
        let (a, guard) = self.address(mem, index)?;
        // Relaxed atomics, as CUDA's and WGSL's: ordering against other memory comes from
        // barriers. (Acquire/release semantics here make lavapipe emit memory barriers that
        // break retry loops: a compare-exchange counter lost most of its increments.)
        let scope = if shared {
            SCOPE_WORKGROUP
        } else {
            SCOPE_DEVICE
        };
        let signed = elem.is_signed_int();
        let r = self.guarded(guard, &[ty], |e| {
            let p = match mem {
                MemRef::Global(b) => e.chunk_ptr(b, a, 0),
                _ => e.array_ptr(mem, a, 0)?,
            };
            let sc = e.m.c_u32(scope);
            let ar = e.m.c_u32(0);
            let r = match op {
                AtomicOp::Load => e.op(Op::AtomicLoad, ty, &[p, sc, ar]),
                AtomicOp::Store | AtomicOp::Exchange => {
                    e.op(Op::AtomicExchange, ty, &[p, sc, ar, v])
                }
                AtomicOp::Add if elem == ElemType::F32 => {
                    e.op(Op::AtomicFAddEXT, ty, &[p, sc, ar, v])
                }
                AtomicOp::Add => e.op(Op::AtomicIAdd, ty, &[p, sc, ar, v]),
                AtomicOp::Sub => e.op(Op::AtomicISub, ty, &[p, sc, ar, v]),
                AtomicOp::Min => {
                    let o = if signed {
                        Op::AtomicSMin
                    } else {
                        Op::AtomicUMin
                    };
                    e.op(o, ty, &[p, sc, ar, v])
                }
                AtomicOp::Max => {
                    let o = if signed {
                        Op::AtomicSMax
                    } else {
                        Op::AtomicUMax
                    };
                    e.op(o, ty, &[p, sc, ar, v])
                }
                AtomicOp::And => e.op(Op::AtomicAnd, ty, &[p, sc, ar, v]),
                AtomicOp::Or => e.op(Op::AtomicOr, ty, &[p, sc, ar, v]),
                AtomicOp::Xor => e.op(Op::AtomicXor, ty, &[p, sc, ar, v]),
                AtomicOp::CompareExchange => {
                    let c = cmp.ok_or_else(|| {
                        e.bad("atomic_compare_exchange without an expected value")
                    })?;
                    e.op(Op::AtomicCompareExchange, ty, &[p, sc, ar, ar, v, c])
                }
            };
            Ok(vec![r])
        })?;
        Ok(r[0])
    }

    fn plane(&mut self, p: PlaneOp, elem: ElemType, x: u32) -> Result<u32, ServerError> {
        self.need_subgroups(p.name())?;
        let scope = self.m.c_u32(SCOPE_SUBGROUP);
        let bt = self.m.t_bool();
        if matches!(p, PlaneOp::All | PlaneOp::Any) {
            self.m.cap(Capability::GroupNonUniformVote);
            let c = if elem == ElemType::Bool {
                x
            } else {
                self.cast(elem, ElemType::Bool, x)?
            };
            let o = if p == PlaneOp::All {
                Op::GroupNonUniformAll
            } else {
                Op::GroupNonUniformAny
            };
            return Ok(self.op(o, bt, &[scope, c]));
        }
        self.m.cap(Capability::GroupNonUniformArithmetic);
        // 8/16-bit integers and f16 reduce in 32 bits (no shaderSubgroupExtendedTypes needed).
        let (ce, cx) = match elem {
            ElemType::I8 | ElemType::I16 => (ElemType::I32, self.cast(elem, ElemType::I32, x)?),
            ElemType::U8 | ElemType::U16 => (ElemType::U32, self.cast(elem, ElemType::U32, x)?),
            ElemType::F16 => (ElemType::F32, self.cast(elem, ElemType::F32, x)?),
            ElemType::Bool => {
                return Err(self.bad(format!("{} on bool", p.name())));
            }
            e => (e, x),
        };
        if matches!(ce, ElemType::I64 | ElemType::U64) {
            if p == PlaneOp::Prod {
                self.subgroup_extended_types = true;
            } else {
                return Ok(self.plane64(p, ce.is_signed_int(), x));
            }
        }
        let ty = self.reg_ty(ce);
        let float = ce.is_float();
        let signed = ce.is_signed_int();
        let o = match (p, float, signed) {
            (PlaneOp::Sum, true, _) => Op::GroupNonUniformFAdd,
            (PlaneOp::Sum, false, _) => Op::GroupNonUniformIAdd,
            (PlaneOp::Prod, true, _) => Op::GroupNonUniformFMul,
            (PlaneOp::Prod, false, _) => Op::GroupNonUniformIMul,
            (PlaneOp::Min, true, _) => Op::GroupNonUniformFMin,
            (PlaneOp::Min, false, true) => Op::GroupNonUniformSMin,
            (PlaneOp::Min, false, false) => Op::GroupNonUniformUMin,
            (PlaneOp::Max, true, _) => Op::GroupNonUniformFMax,
            (PlaneOp::Max, false, true) => Op::GroupNonUniformSMax,
            _ => Op::GroupNonUniformUMax,
        };
        // GroupOperation Reduce = 0.
        let r = self.op(o, ty, &[scope, 0, cx]);
        let r = if elem == ElemType::BF16 {
            self.round_bf16(r)
        } else {
            r
        };
        if ce != elem {
            self.cast(ce, elem, r)
        } else {
            Ok(r)
        }
    }

    /// A 64-bit integer sum, min or max over the plane from 32-bit subgroup arithmetic: the sum
    /// of four 16-bit slices (each slice's sum fits 32 bits for up to 65536 lanes), recombined
    /// with wrapping; min/max of the high words, then of the low words among the units that hold
    /// the winning high word.
    fn plane64(&mut self, p: PlaneOp, signed: bool, x: u32) -> u32 {
        let scope = self.m.c_u32(SCOPE_SUBGROUP);
        let u = self.m.t_u32();
        let t64 = self.m.t_int(64);
        let bt = self.m.t_bool();
        if p == PlaneOp::Sum {
            let mask = self.m.c_int(64, 0xffff);
            let mut acc = None;
            for k in 0..4u64 {
                let sh = self.m.c_int(64, 16 * k);
                let part = self.op(Op::ShiftRightLogical, t64, &[x, sh]);
                let part = self.op(Op::BitwiseAnd, t64, &[part, mask]);
                let part = self.op(Op::UConvert, u, &[part]);
                let s = self.op(Op::GroupNonUniformIAdd, u, &[scope, 0, part]);
                let s = self.op(Op::UConvert, t64, &[s]);
                let s = self.op(Op::ShiftLeftLogical, t64, &[s, sh]);
                acc = Some(match acc {
                    None => s,
                    Some(a) => self.op(Op::IAdd, t64, &[a, s]),
                });
            }
            return acc.unwrap_or(x);
        }
        let s32 = self.m.c_int(64, 32);
        let hi = self.op(Op::ShiftRightLogical, t64, &[x, s32]);
        let hi = self.op(Op::UConvert, u, &[hi]);
        let lo = self.op(Op::UConvert, u, &[x]);
        let min = p == PlaneOp::Min;
        let hop = match (min, signed) {
            (true, true) => Op::GroupNonUniformSMin,
            (true, false) => Op::GroupNonUniformUMin,
            (false, true) => Op::GroupNonUniformSMax,
            (false, false) => Op::GroupNonUniformUMax,
        };
        let mh = self.op(hop, u, &[scope, 0, hi]);
        let mine = self.op(Op::IEqual, bt, &[hi, mh]);
        let neutral = self.m.c_u32(if min { u32::MAX } else { 0 });
        let cand = self.op(Op::Select, u, &[mine, lo, neutral]);
        let lop = if min {
            Op::GroupNonUniformUMin
        } else {
            Op::GroupNonUniformUMax
        };
        let ml = self.op(lop, u, &[scope, 0, cand]);
        let mh = self.op(Op::UConvert, t64, &[mh]);
        let mh = self.op(Op::ShiftLeftLogical, t64, &[mh, s32]);
        let ml = self.op(Op::UConvert, t64, &[ml]);
        self.op(Op::BitwiseOr, t64, &[mh, ml])
    }

    // ---------------------------------------------------------------------------------------
    // Module assembly.

    fn finish(mut self) -> SpirvKernel {
        let func_ty = {
            let v = self.m.t_void();
            self.m.t_fn(v)
        };
        let void = self.m.t_void();
        let main = self.m.id();
        let entry = self.entry;
        let mut func = Vec::new();
        inst(&mut func, Op::Function, &[void, main, 0, func_ty]);
        inst(&mut func, Op::Label, &[entry]);
        func.extend_from_slice(&self.vars);
        func.extend_from_slice(&self.pro);
        // The body's first instructions continue the entry block (it has no label of its own).
        func.extend_from_slice(&self.code);
        inst(&mut func, Op::FunctionEnd, &[]);

        let (major, minor) = self.caps.version;
        let version = (u32::from(major) << 16) | (u32::from(minor) << 8);
        let mut w = vec![0x0723_0203, version, 0, self.m.next + 1, 0];
        for &c in &self.m.capabilities {
            inst(&mut w, Op::Capability, &[c]);
        }
        for e in &self.m.extensions {
            inst(&mut w, Op::Extension, &string_words(e));
        }
        let mut imp = vec![self.glsl];
        imp.extend(string_words("GLSL.std.450"));
        inst(&mut w, Op::ExtInstImport, &imp);
        // Logical addressing, GLSL450 memory model.
        inst(&mut w, Op::MemoryModel, &[0, 1]);
        let mut ep = vec![ExecutionModel::GLCompute as u32, main];
        ep.extend(string_words("main"));
        if self.caps.version >= (1, 4) {
            ep.extend_from_slice(&self.m.interface);
        } else {
            ep.extend(self.inputs_interface());
        }
        inst(&mut w, Op::EntryPoint, &ep);
        let [x, y, z] = self.def.cube_dim();
        inst(
            &mut w,
            Op::ExecutionMode,
            &[main, ExecutionMode::LocalSize as u32, x, y, z],
        );
        w.extend_from_slice(&self.m.annotations);
        w.extend_from_slice(&self.m.globals);
        w.extend_from_slice(&func);

        let capabilities = self
            .m
            .capabilities
            .iter()
            .filter_map(|&c| Capability::from_u32(c))
            .collect();
        SpirvKernel {
            words: w,
            push_constant_bytes: if self.layout.in_push_constants {
                self.layout.words * 4
            } else {
                0
            },
            args: self.layout,
            uses_info: self.uses_info,
            info_binding: self.def.buffers().len() as u32,
            buffer_item_sizes: self
                .def
                .buffers()
                .iter()
                .map(|b| b.item().size() as u64)
                .collect(),
            uses_subgroups: self.uses_subgroups,
            subgroup_extended_types: self.subgroup_extended_types,
            capabilities,
            extensions: self.m.extensions.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The builtin input variables (the interface before SPIR-V 1.4).
    fn inputs_interface(&self) -> Vec<u32> {
        // Input variables were pushed to the interface together with the others; before 1.4
        // only Input/Output may be listed, so pick those out by their load cache.
        let mut v: Vec<u32> = Vec::new();
        let mut g = self.m.globals.as_slice();
        while let Some(&first) = g.first() {
            let n = (first >> 16) as usize;
            if n == 0 || n > g.len() {
                break;
            }
            if (first & 0xffff) == Op::Variable as u32
                && g.get(3) == Some(&(StorageClass::Input as u32))
            {
                v.push(g[2]);
            }
            g = &g[n..];
        }
        v
    }
}

/// Bit width of an element.
pub(super) fn bits(elem: ElemType) -> u32 {
    elem.size() as u32 * 8
}

/// The argument words of a kernel (see the module docs).
fn arg_layout(def: &KernelDefinition, caps: &SpirvCaps) -> ArgLayout {
    let mut w = 0u32;
    let mut scalar_words = Vec::new();
    for s in def.scalars() {
        if s.elem.size() == 8 {
            w = w.next_multiple_of(2);
            scalar_words.push(w);
            w += 2;
        } else {
            scalar_words.push(w);
            w += 1;
        }
    }
    let mut buffer_words = Vec::new();
    for _ in def.buffers() {
        buffer_words.push(w);
        w += 2;
    }
    let in_push_constants = w * 4 <= caps.max_push_constant_bytes;
    ArgLayout {
        scalar_words,
        buffer_words,
        words: w,
        in_push_constants,
        info_header_word: if in_push_constants { 0 } else { w },
    }
}
