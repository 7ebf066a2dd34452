//! Cranelift code for one cube of a kernel (see [`super::analysis`] for the structure).
//!
//! An IR value is a list of *chunks*: 128-bit vectors for items of four 32-bit or two 64-bit
//! components (or more), scalars otherwise. Operations with a vector instruction whose result is
//! exactly the scalar one run on chunks; all others split the chunks into components, apply the
//! scalar operation and rebuild. Semantics follow the interpreter (`lanes.rs`) bit for bit.
//!
//! Size: one file because every IR operation's code generation shares the chunk model and the
//! emitter state above; split by operation family it would spread one `match` over several files.

use compute_core::elem::ElemType;
use compute_core::kernel::{
    AtomicOp, BinaryOp, Builtin, CmpOp, Item, KernelDefinition, MemRef, Op, ScalarValue, Stmt,
    UnaryOp, ValueId, VarId,
};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, AtomicRmwOp, Block, FuncRef, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind,
    Type, Value, types,
};
use cranelift_frontend::{FunctionBuilder, Variable};
use cranelift_jit::JITModule;
use cranelift_module::{Linkage, Module};
use hashbrown::HashMap;

use super::analysis::{Analysis, CubeNode};
use super::helpers::{PlaneStep, PlaneSteps};
use super::{CTX_BUFS, CTX_COUNT, CTX_SCALARS, CTX_UNCHECKED, CTX_ZEROS, Features};
use crate::compiler::PLANE_SIZE;
use crate::compiler::plane;

/// Byte layout of a worker's state and shared memory, as the generated code addresses them.
#[derive(Debug, Clone, Default)]
pub(super) struct Layout {
    /// Bytes of one unit's slots.
    pub unit_stride: u32,
    /// Total state bytes.
    pub state_bytes: u32,
    /// Shared memory bytes.
    pub shared_bytes: u32,
}

/// Size of the sink and of the zero area: the largest item (16 x 8 bytes).
pub(super) const SINK_BYTES: u32 = 128;

type R<T> = Result<T, String>;

fn elem_ty(e: ElemType) -> Type {
    match e {
        ElemType::Bool | ElemType::I8 | ElemType::U8 => types::I8,
        ElemType::I16 | ElemType::U16 | ElemType::F16 | ElemType::BF16 => types::I16,
        ElemType::I32 | ElemType::U32 => types::I32,
        ElemType::I64 | ElemType::U64 => types::I64,
        ElemType::F32 => types::F32,
        ElemType::F64 => types::F64,
    }
}

/// Components per chunk of an item.
fn chunk_lanes(item: Item) -> usize {
    match item.elem {
        ElemType::F32 | ElemType::I32 | ElemType::U32 if item.width >= 4 => 4,
        ElemType::F64 | ElemType::I64 | ElemType::U64 if item.width >= 2 => 2,
        _ => 1,
    }
}

fn chunk_ty(item: Item) -> Type {
    let t = elem_ty(item.elem);
    match chunk_lanes(item) {
        1 => t,
        l => t.by(l as u32).expect("128-bit vector type"),
    }
}

fn is_half(e: ElemType) -> bool {
    matches!(e, ElemType::F16 | ElemType::BF16)
}

fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

struct Unit {
    /// Unit index (i32).
    u: Value,
    /// Start of the unit's slots (i64).
    base: Value,
    /// Where the unit's code ends.
    next: Block,
}

struct RangeBlocks {
    header: Block,
    body: Block,
    latch: Block,
    exit: Block,
    counter: Variable,
    elem: ElemType,
    step: Value,
    i: Value,
}

pub(super) struct Emitter<'a, 'b> {
    def: &'a KernelDefinition,
    an: &'a Analysis<'a>,
    pub b: FunctionBuilder<'b>,
    module: &'b mut JITModule,
    feat: Features,
    vals: Vec<Option<Vec<Value>>>,
    regvars: Vec<Option<Vec<Variable>>>,
    var_off: Vec<Option<u32>>,
    spill_off: Vec<Option<u32>>,
    local_off: Vec<u32>,
    shared_off: Vec<u32>,
    ret_off: Option<u32>,
    layout: Layout,
    ctx: Value,
    cube: [Value; 3],
    linear: Value,
    state: Value,
    shared: Value,
    bufs: Vec<(Value, Value)>,
    counts: [Value; 3],
    scalars: Value,
    zeros: Value,
    sink: Value,
    /// Non-zero (i8) in unchecked launches.
    unchecked: Value,
    unit: Option<Unit>,
    /// In the unchecked copy of a unit loop: `absolute_pos` accesses skip bounds checks.
    fast: bool,
    /// Offset of the per-unit mask bytes.
    mask_base: u32,
    /// Slot offsets of the masks in force: a unit runs only where all are set.
    masks: Vec<u32>,
    /// `(active, resume)` slot offsets of the enclosing cube-level `loop`s.
    cube_loops: Vec<(u32, u32)>,
    loops: Vec<(Block, Block)>,
    funcs: HashMap<&'static str, FuncRef>,
    planes: PlaneSteps,
}

fn align16(x: u32) -> u32 {
    x.next_multiple_of(16)
}

impl<'a, 'b> Emitter<'a, 'b> {
    pub(super) fn new(
        def: &'a KernelDefinition,
        an: &'a Analysis<'a>,
        mut b: FunctionBuilder<'b>,
        module: &'b mut JITModule,
        feat: Features,
    ) -> R<Self> {
        let units = def.cube_size();
        let item = |v: usize| def.values()[v];
        // Per-unit slots.
        let mut off = 0u32;
        let mut spill_off = vec![None; def.values().len()];
        for (v, &s) in an.spilled.iter().enumerate() {
            if s {
                spill_off[v] = Some(off);
                off = align16(off + item(v).size() as u32);
            }
        }
        let mut var_off = vec![None; def.vars().len()];
        for (v, &m) in an.var_in_memory.iter().enumerate() {
            if m {
                var_off[v] = Some(off);
                off = align16(off + def.vars()[v].item.size() as u32);
            }
        }
        let mut local_off = Vec::new();
        for l in def.local_arrays() {
            local_off.push(off);
            off = align16(off + (l.item.size() as u32).saturating_mul(l.len));
        }
        let mask_base = off;
        off = align16(off + an.mask_slots);
        let ret_off = an.needs_return_flag.then(|| {
            let r = off;
            off = align16(off + 1);
            r
        });
        let unit_stride = align16(off.max(1));
        let sink = unit_stride
            .checked_mul(units)
            .ok_or("per-unit state too large")?;
        let state_bytes = sink + SINK_BYTES;
        if state_bytes > 64 << 20 {
            return Err("per-unit state too large".into());
        }
        let mut shared_off = Vec::new();
        let mut soff = 0u32;
        for s in def.shared() {
            shared_off.push(soff);
            soff = align16(soff + s.size_bytes() as u32);
        }
        let layout = Layout {
            unit_stride,
            state_bytes,
            shared_bytes: soff,
        };

        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let p = b.block_params(entry).to_vec();
        let (ctx, cube, linear, state, shared) = (p[0], [p[1], p[2], p[3]], p[4], p[5], p[6]);
        let bufs_ptr = b
            .ins()
            .load(types::I64, MemFlagsData::trusted(), ctx, CTX_BUFS);
        let scalars = b
            .ins()
            .load(types::I64, MemFlagsData::trusted(), ctx, CTX_SCALARS);
        let zeros = b
            .ins()
            .load(types::I64, MemFlagsData::trusted(), ctx, CTX_ZEROS);
        let counts = [0, 4, 8].map(|o| {
            b.ins()
                .load(types::I32, MemFlagsData::trusted(), ctx, CTX_COUNT + o)
        });
        let bufs = (0..def.buffers().len() as i32)
            .map(|i| {
                let ptr = b
                    .ins()
                    .load(types::I64, MemFlagsData::trusted(), bufs_ptr, i * 16);
                let len = b
                    .ins()
                    .load(types::I64, MemFlagsData::trusted(), bufs_ptr, i * 16 + 8);
                (ptr, len)
            })
            .collect();
        let sink_v = b.ins().iadd_imm_s(state, sink as i64);
        let unchecked = b
            .ins()
            .load(types::I32, MemFlagsData::trusted(), ctx, CTX_UNCHECKED);
        let unchecked = b.ins().ireduce(types::I8, unchecked);
        Ok(Self {
            def,
            an,
            b,
            module,
            feat,
            vals: vec![None; def.values().len()],
            regvars: vec![None; def.vars().len()],
            var_off,
            spill_off,
            local_off,
            shared_off,
            ret_off,
            layout,
            ctx,
            cube,
            linear,
            state,
            shared,
            bufs,
            counts,
            scalars,
            zeros,
            sink: sink_v,
            unchecked,
            unit: None,
            fast: false,
            mask_base,
            masks: Vec::new(),
            cube_loops: Vec::new(),
            loops: Vec::new(),
            funcs: HashMap::new(),
            planes: Vec::new(),
        })
    }

    /// Emit the whole cube function; returns the layout.
    pub(super) fn run(mut self) -> R<(Layout, PlaneSteps)> {
        if let Some(r) = self.ret_off {
            // Every unit starts the cube not returned.
            self.each_unit(|s, base| {
                let z8 = s.iconst(types::I8, 0);
                s.b.ins().store(mem(), z8, base, r as i32);
                Ok(())
            })?;
        }
        let tree = &self.an.tree;
        self.cube_nodes(tree)?;
        self.b.ins().return_(&[]);
        self.b.seal_all_blocks();
        let layout = self.layout.clone();
        self.b.finalize(self.module.target_config());
        Ok((layout, self.planes))
    }

    // ----- values -----

    fn item(&self, v: ValueId) -> Item {
        self.def.values()[v.0 as usize]
    }

    fn val(&self, v: ValueId) -> R<Vec<Value>> {
        self.vals[v.0 as usize]
            .clone()
            .ok_or_else(|| format!("value %{} has no code", v.0))
    }

    fn set(&mut self, v: ValueId, chunks: Vec<Value>) {
        self.vals[v.0 as usize] = Some(chunks);
    }

    /// The scalar components of an item's chunks.
    fn comps(&mut self, item: Item, chunks: &[Value]) -> Vec<Value> {
        let l = chunk_lanes(item);
        if l == 1 {
            return chunks.to_vec();
        }
        let mut out = Vec::with_capacity(item.width as usize);
        for &c in chunks {
            for k in 0..l {
                out.push(self.b.ins().extractlane(c, k as u8));
            }
        }
        out
    }

    /// The chunks of an item from its scalar components.
    fn chunks(&mut self, item: Item, comps: Vec<Value>) -> Vec<Value> {
        let l = chunk_lanes(item);
        if l == 1 {
            return comps;
        }
        let ty = chunk_ty(item);
        comps
            .chunks(l)
            .map(|part| {
                let mut v = self.b.ins().scalar_to_vector(ty, part[0]);
                for (k, &x) in part.iter().enumerate().skip(1) {
                    v = self.b.ins().insertlane(v, x, k as u8);
                }
                v
            })
            .collect()
    }

    fn iconst(&mut self, ty: Type, v: i64) -> Value {
        self.b.ins().iconst(ty, v)
    }

    fn literal(&mut self, v: ScalarValue) -> Value {
        let bits = super::super::plan::scalar_bits(v);
        match v.elem_type() {
            ElemType::F32 => self.b.ins().f32const(f32::from_bits(bits as u32)),
            ElemType::F64 => self.b.ins().f64const(f64::from_bits(bits)),
            e => {
                let ty = elem_ty(e);
                let mask = if ty.bits() == 64 {
                    u64::MAX
                } else {
                    (1u64 << ty.bits()) - 1
                };
                self.iconst(ty, (bits & mask) as i64)
            }
        }
    }

    fn helper(&mut self, name: &'static str, params: &[Type], ret: Option<Type>) -> R<FuncRef> {
        if let Some(f) = self.funcs.get(name) {
            return Ok(*f);
        }
        let mut sig = self.module.make_signature();
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.extend(ret.map(AbiParam::new));
        let id = self
            .module
            .declare_function(name, Linkage::Import, &sig)
            .map_err(|e| e.to_string())?;
        let f = self.module.declare_func_in_func(id, self.b.func);
        self.funcs.insert(name, f);
        Ok(f)
    }

    fn call(&mut self, name: &'static str, args: &[Value], ret: Type) -> R<Value> {
        let params: Vec<Type> = args
            .iter()
            .map(|&a| self.b.func.dfg.value_type(a))
            .collect();
        let f = self.helper(name, &params, Some(ret))?;
        let inst = self.b.ins().call(f, args);
        Ok(self.b.inst_results(inst)[0])
    }

    // ----- half precision -----

    fn half_to_f32(&mut self, e: ElemType, x: Value) -> R<Value> {
        let x = self.b.ins().uextend(types::I32, x);
        if e == ElemType::BF16 {
            let s = self.b.ins().ishl_imm_s(x, 16);
            return Ok(self.b.ins().bitcast(types::F32, MemFlagsData::new(), s));
        }
        self.call("f16_to_f32", &[x], types::F32)
    }

    fn f32_to_half(&mut self, e: ElemType, x: Value) -> R<Value> {
        let name = if e == ElemType::BF16 {
            "f32_to_bf16"
        } else {
            "f32_to_f16"
        };
        let r = self.call(name, &[x], types::I32)?;
        Ok(self.b.ins().ireduce(types::I16, r))
    }

    fn half_to_f64(&mut self, e: ElemType, x: Value) -> R<Value> {
        let x = self.b.ins().uextend(types::I32, x);
        let name = if e == ElemType::BF16 {
            "bf16_to_f64"
        } else {
            "f16_to_f64"
        };
        self.call(name, &[x], types::F64)
    }

    fn f64_to_half(&mut self, e: ElemType, x: Value) -> R<Value> {
        let name = if e == ElemType::BF16 {
            "f64_to_bf16"
        } else {
            "f64_to_f16"
        };
        let r = self.call(name, &[x], types::I32)?;
        Ok(self.b.ins().ireduce(types::I16, r))
    }

    // ----- scalar operations -----

    fn float_min_max(&mut self, max: bool, a: Value, b: Value) -> Value {
        // Rust's `min`/`max`: a NaN operand gives the other operand.
        let cc = if max {
            FloatCC::GreaterThan
        } else {
            FloatCC::LessThan
        };
        let better = self.b.ins().fcmp(cc, a, b);
        let b_nan = self.b.ins().fcmp(FloatCC::Unordered, b, b);
        let pick_a = self.b.ins().bor(better, b_nan);
        self.b.ins().select(pick_a, a, b)
    }

    fn int_min_max(&mut self, max: bool, signed: bool, a: Value, b: Value) -> Value {
        let cc = match (max, signed) {
            (false, true) => IntCC::SignedLessThan,
            (false, false) => IntCC::UnsignedLessThan,
            (true, true) => IntCC::SignedGreaterThan,
            (true, false) => IntCC::UnsignedGreaterThan,
        };
        let c = self.b.ins().icmp(cc, a, b);
        self.b.ins().select(c, a, b)
    }

    fn float_unary(&mut self, op: UnaryOp, ty: Type, x: Value) -> R<Value> {
        let f32_ = ty == types::F32;
        let one = |s: &mut Self| {
            if f32_ {
                s.b.ins().f32const(1.0)
            } else {
                s.b.ins().f64const(1.0)
            }
        };
        let pick = |a: &'static str, b: &'static str| if f32_ { a } else { b };
        Ok(match op {
            UnaryOp::Neg => self.b.ins().fneg(x),
            UnaryOp::Abs => self.b.ins().fabs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Rsqrt => {
                let s = self.b.ins().sqrt(x);
                let o = one(self);
                self.b.ins().fdiv(o, s)
            }
            UnaryOp::Recip => {
                let o = one(self);
                self.b.ins().fdiv(o, x)
            }
            UnaryOp::Floor if self.feat.sse41 => self.b.ins().floor(x),
            UnaryOp::Ceil if self.feat.sse41 => self.b.ins().ceil(x),
            UnaryOp::Round if self.feat.sse41 => self.b.ins().nearest(x),
            UnaryOp::Floor => self.call(pick("floor_f32", "floor_f64"), &[x], ty)?,
            UnaryOp::Ceil => self.call(pick("ceil_f32", "ceil_f64"), &[x], ty)?,
            UnaryOp::Round => self.call(pick("nearest_f32", "nearest_f64"), &[x], ty)?,
            UnaryOp::Exp => self.call(pick("exp_f32", "exp_f64"), &[x], ty)?,
            UnaryOp::Log => self.call(pick("ln_f32", "ln_f64"), &[x], ty)?,
            UnaryOp::Log1p => self.call(pick("ln1p_f32", "ln1p_f64"), &[x], ty)?,
            UnaryOp::Sin => self.call(pick("sin_f32", "sin_f64"), &[x], ty)?,
            UnaryOp::Cos => self.call(pick("cos_f32", "cos_f64"), &[x], ty)?,
            UnaryOp::Tanh => self.call(pick("tanh_f32", "tanh_f64"), &[x], ty)?,
            UnaryOp::Erf => self.call(pick("erf_f32", "erf_f64"), &[x], ty)?,
            UnaryOp::Not | UnaryOp::BitNot => return Err(format!("`{}` on a float", op.name())),
        })
    }

    fn unary_scalar(&mut self, op: UnaryOp, e: ElemType, x: Value) -> R<Value> {
        if is_half(e) {
            if op == UnaryOp::Neg {
                let m = self.iconst(types::I16, 0x8000u16 as i16 as i64);
                return Ok(self.b.ins().bxor(x, m));
            }
            let f = self.half_to_f32(e, x)?;
            let r = self.float_unary(op, types::F32, f)?;
            return self.f32_to_half(e, r);
        }
        if e.is_float() {
            return self.float_unary(op, elem_ty(e), x);
        }
        Ok(match op {
            UnaryOp::Not if e == ElemType::Bool => self.b.ins().bxor_imm_s(x, 1),
            UnaryOp::BitNot if e.is_int() => self.b.ins().bnot(x),
            UnaryOp::Neg if e.is_signed_int() => self.b.ins().ineg(x),
            UnaryOp::Abs if e.is_signed_int() => {
                let n = self.b.ins().ineg(x);
                let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                self.b.ins().select(neg, n, x)
            }
            _ => return Err(format!("`{}` on {e}", op.name())),
        })
    }

    fn float_binary(&mut self, op: BinaryOp, ty: Type, a: Value, b: Value) -> R<Value> {
        let f32_ = ty == types::F32;
        Ok(match op {
            BinaryOp::Add => self.b.ins().fadd(a, b),
            BinaryOp::Sub => self.b.ins().fsub(a, b),
            BinaryOp::Mul => self.b.ins().fmul(a, b),
            BinaryOp::Div => self.b.ins().fdiv(a, b),
            BinaryOp::Rem => self.call(if f32_ { "rem_f32" } else { "rem_f64" }, &[a, b], ty)?,
            BinaryOp::Pow => self.call(if f32_ { "pow_f32" } else { "pow_f64" }, &[a, b], ty)?,
            BinaryOp::Min => self.float_min_max(false, a, b),
            BinaryOp::Max => self.float_min_max(true, a, b),
            _ => return Err(format!("`{}` on a float", op.name())),
        })
    }

    fn int_div_rem(&mut self, rem: bool, signed: bool, a: Value, b: Value) -> Value {
        let ty = self.b.func.dfg.value_type(a);
        // Narrow integers divide in 32 bits, where MIN / -1 cannot overflow.
        let (wa, wb) = if ty.bits() < 32 {
            if signed {
                (
                    self.b.ins().sextend(types::I32, a),
                    self.b.ins().sextend(types::I32, b),
                )
            } else {
                (
                    self.b.ins().uextend(types::I32, a),
                    self.b.ins().uextend(types::I32, b),
                )
            }
        } else {
            (a, b)
        };
        let wty = self.b.func.dfg.value_type(wa);
        let one = self.iconst(wty, 1);
        let zero = self.b.ins().icmp_imm_s(IntCC::Equal, wb, 0);
        let mut bad = zero;
        if signed && ty.bits() >= 32 {
            let min = if ty.bits() == 64 {
                i64::MIN
            } else {
                i32::MIN as i64
            };
            let is_min = self.b.ins().icmp_imm_s(IntCC::Equal, wa, min);
            let is_m1 = self.b.ins().icmp_imm_s(IntCC::Equal, wb, -1);
            let ovf = self.b.ins().band(is_min, is_m1);
            bad = self.b.ins().bor(zero, ovf);
        }
        let d = self.b.ins().select(bad, one, wb);
        let r = match (rem, signed) {
            (false, true) => self.b.ins().sdiv(wa, d),
            (false, false) => self.b.ins().udiv(wa, d),
            (true, true) => self.b.ins().srem(wa, d),
            (true, false) => self.b.ins().urem(wa, d),
        };
        // x / 0 == x (d == 1 gives that), x % 0 == 0 (likewise); MIN / -1 == MIN == MIN / 1.
        if ty.bits() < 32 {
            self.b.ins().ireduce(ty, r)
        } else {
            r
        }
    }

    fn binary_scalar(&mut self, op: BinaryOp, e: ElemType, a: Value, b: Value) -> R<Value> {
        if is_half(e) {
            let fa = self.half_to_f32(e, a)?;
            let fb = self.half_to_f32(e, b)?;
            let r = self.float_binary(op, types::F32, fa, fb)?;
            return self.f32_to_half(e, r);
        }
        if e.is_float() {
            return self.float_binary(op, elem_ty(e), a, b);
        }
        if e == ElemType::Bool {
            return Ok(match op {
                BinaryOp::And => self.b.ins().band(a, b),
                BinaryOp::Or => self.b.ins().bor(a, b),
                _ => return Err(format!("`{}` on bool", op.name())),
            });
        }
        let signed = e.is_signed_int();
        Ok(match op {
            BinaryOp::Add => self.b.ins().iadd(a, b),
            BinaryOp::Sub => self.b.ins().isub(a, b),
            BinaryOp::Mul => self.b.ins().imul(a, b),
            BinaryOp::Div => self.int_div_rem(false, signed, a, b),
            BinaryOp::Rem => self.int_div_rem(true, signed, a, b),
            BinaryOp::Min => self.int_min_max(false, signed, a, b),
            BinaryOp::Max => self.int_min_max(true, signed, a, b),
            BinaryOp::BitAnd => self.b.ins().band(a, b),
            BinaryOp::BitOr => self.b.ins().bor(a, b),
            BinaryOp::BitXor => self.b.ins().bxor(a, b),
            BinaryOp::Shl => self.b.ins().ishl(a, b),
            BinaryOp::Shr if signed => self.b.ins().sshr(a, b),
            BinaryOp::Shr => self.b.ins().ushr(a, b),
            _ => return Err(format!("`{}` on {e}", op.name())),
        })
    }

    fn compare_scalar(&mut self, op: CmpOp, e: ElemType, a: Value, b: Value) -> R<Value> {
        let (a, b, float) = if is_half(e) {
            (self.half_to_f32(e, a)?, self.half_to_f32(e, b)?, true)
        } else {
            (a, b, e.is_float())
        };
        Ok(if float {
            let cc = match op {
                CmpOp::Eq => FloatCC::Equal,
                CmpOp::Ne => FloatCC::NotEqual,
                CmpOp::Lt => FloatCC::LessThan,
                CmpOp::Le => FloatCC::LessThanOrEqual,
                CmpOp::Gt => FloatCC::GreaterThan,
                CmpOp::Ge => FloatCC::GreaterThanOrEqual,
            };
            self.b.ins().fcmp(cc, a, b)
        } else {
            let s = e.is_signed_int();
            let cc = match op {
                CmpOp::Eq => IntCC::Equal,
                CmpOp::Ne => IntCC::NotEqual,
                CmpOp::Lt if s => IntCC::SignedLessThan,
                CmpOp::Le if s => IntCC::SignedLessThanOrEqual,
                CmpOp::Gt if s => IntCC::SignedGreaterThan,
                CmpOp::Ge if s => IntCC::SignedGreaterThanOrEqual,
                CmpOp::Lt => IntCC::UnsignedLessThan,
                CmpOp::Le => IntCC::UnsignedLessThanOrEqual,
                CmpOp::Gt => IntCC::UnsignedGreaterThan,
                CmpOp::Ge => IntCC::UnsignedGreaterThanOrEqual,
            };
            self.b.ins().icmp(cc, a, b)
        })
    }

    fn fma_scalar(&mut self, e: ElemType, a: Value, b: Value, c: Value) -> R<Value> {
        if is_half(e) {
            // Exact through f32, as the interpreter: fused instruction or software fma.
            let (fa, fb, fc) = (
                self.half_to_f32(e, a)?,
                self.half_to_f32(e, b)?,
                self.half_to_f32(e, c)?,
            );
            let r = if self.feat.fma {
                self.b.ins().fma(fa, fb, fc)
            } else {
                self.call("fma_f32", &[fa, fb, fc], types::F32)?
            };
            return self.f32_to_half(e, r);
        }
        if !e.is_float() {
            return Err(format!("`fma` on {e}"));
        }
        if self.feat.fma {
            return Ok(self.b.ins().fma(a, b, c));
        }
        // No fused instruction: `a * b + c` (the IR fuses only where the hardware does).
        let p = self.b.ins().fmul(a, b);
        Ok(self.b.ins().fadd(p, c))
    }

    fn clamp_scalar(&mut self, e: ElemType, x: Value, lo: Value, hi: Value) -> R<Value> {
        if e == ElemType::Bool {
            return Err("`clamp` on bool".into());
        }
        let m = self.binary_scalar(BinaryOp::Max, e, x, lo)?;
        self.binary_scalar(BinaryOp::Min, e, m, hi)
    }

    /// `Wide`-based conversions of the interpreter, one component.
    fn cast_scalar(&mut self, x: Value, from: ElemType, to: ElemType) -> R<Value> {
        if from == to {
            return Ok(x);
        }
        // Halves go through f64, exactly as the interpreter's codec does.
        if is_half(from) {
            let f = self.half_to_f64(from, x)?;
            return self.cast_scalar(f, ElemType::F64, to);
        }
        if is_half(to) {
            let f = self.cast_scalar(x, from, ElemType::F64)?;
            return self.f64_to_half(to, f);
        }
        // Bools read as 0 or 1 (u8).
        let (x, from) = if from == ElemType::Bool {
            let nz = self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0);
            (nz, ElemType::U8)
        } else {
            (x, from)
        };
        if to == ElemType::Bool {
            return Ok(if from.is_float() {
                let z = if from == ElemType::F32 {
                    self.b.ins().f32const(0.0)
                } else {
                    self.b.ins().f64const(0.0)
                };
                self.b.ins().fcmp(FloatCC::NotEqual, x, z)
            } else {
                self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0)
            });
        }
        let tt = elem_ty(to);
        if from.is_float() {
            let f = if from == ElemType::F32 {
                self.b.ins().fpromote(types::F64, x)
            } else {
                x
            };
            if to.is_float() {
                return Ok(if to == ElemType::F32 {
                    self.b.ins().fdemote(types::F32, f)
                } else {
                    f
                });
            }
            // Saturating, NaN to 0.
            return Ok(match to {
                ElemType::I64 => self.b.ins().fcvt_to_sint_sat(types::I64, f),
                ElemType::U64 => self.b.ins().fcvt_to_uint_sat(types::I64, f),
                ElemType::I32 => self.b.ins().fcvt_to_sint_sat(types::I32, f),
                ElemType::U32 => self.b.ins().fcvt_to_uint_sat(types::I32, f),
                ElemType::I8 | ElemType::I16 => {
                    let w = self.b.ins().fcvt_to_sint_sat(types::I32, f);
                    let (lo, hi) = if to == ElemType::I8 {
                        (i8::MIN as i64, i8::MAX as i64)
                    } else {
                        (i16::MIN as i64, i16::MAX as i64)
                    };
                    let lo = self.iconst(types::I32, lo);
                    let hi = self.iconst(types::I32, hi);
                    let w = self.int_min_max(true, true, w, lo);
                    let w = self.int_min_max(false, true, w, hi);
                    self.b.ins().ireduce(tt, w)
                }
                _ => {
                    let w = self.b.ins().fcvt_to_uint_sat(types::I32, f);
                    let hi = if to == ElemType::U8 {
                        u8::MAX as i64
                    } else {
                        u16::MAX as i64
                    };
                    let hi = self.iconst(types::I32, hi);
                    let w = self.int_min_max(false, false, w, hi);
                    self.b.ins().ireduce(tt, w)
                }
            });
        }
        // Integer source: widen to 64 bits by its signedness.
        let fty = self.b.func.dfg.value_type(x);
        let w = if fty == types::I64 {
            x
        } else if from.is_signed_int() {
            self.b.ins().sextend(types::I64, x)
        } else {
            self.b.ins().uextend(types::I64, x)
        };
        if to.is_float() {
            return Ok(if from.is_signed_int() {
                self.b.ins().fcvt_from_sint(tt, w)
            } else {
                self.b.ins().fcvt_from_uint(tt, w)
            });
        }
        Ok(if tt == types::I64 {
            w
        } else {
            self.b.ins().ireduce(tt, w)
        })
    }

    // ----- chunked operations -----

    fn map1(
        &mut self,
        item: Item,
        x: &[Value],
        mut f: impl FnMut(&mut Self, Value) -> R<Value>,
    ) -> R<Vec<Value>> {
        let cx = self.comps(item, x);
        let mut out = Vec::with_capacity(cx.len());
        for v in cx {
            out.push(f(self, v)?);
        }
        Ok(out)
    }

    fn unary(&mut self, op: UnaryOp, item: Item, x: &[Value]) -> R<Vec<Value>> {
        let e = item.elem;
        if chunk_lanes(item) > 1 {
            let native = match op {
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt if e.is_float() => true,
                UnaryOp::Neg if e.is_signed_int() => true,
                UnaryOp::BitNot => true,
                _ => false,
            };
            if native {
                return Ok(x
                    .iter()
                    .map(|&v| match op {
                        UnaryOp::Neg if e.is_float() => self.b.ins().fneg(v),
                        UnaryOp::Abs => self.b.ins().fabs(v),
                        UnaryOp::Sqrt => self.b.ins().sqrt(v),
                        UnaryOp::Neg => self.b.ins().ineg(v),
                        _ => self.b.ins().bnot(v),
                    })
                    .collect());
            }
        }
        let comps = self.map1(item, x, |s, v| s.unary_scalar(op, e, v))?;
        Ok(self.chunks(item, comps))
    }

    fn binary(&mut self, op: BinaryOp, item: Item, a: &[Value], b: &[Value]) -> R<Vec<Value>> {
        let e = item.elem;
        if chunk_lanes(item) > 1 {
            let native = match op {
                BinaryOp::Add | BinaryOp::Sub => true,
                BinaryOp::Mul | BinaryOp::Div => e.is_float(),
                BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor => e.is_int(),
                _ => false,
            };
            if native {
                let f = e.is_float();
                return Ok(a
                    .iter()
                    .zip(b)
                    .map(|(&x, &y)| match op {
                        BinaryOp::Add if f => self.b.ins().fadd(x, y),
                        BinaryOp::Sub if f => self.b.ins().fsub(x, y),
                        BinaryOp::Mul => self.b.ins().fmul(x, y),
                        BinaryOp::Div => self.b.ins().fdiv(x, y),
                        BinaryOp::Add => self.b.ins().iadd(x, y),
                        BinaryOp::Sub => self.b.ins().isub(x, y),
                        BinaryOp::BitAnd => self.b.ins().band(x, y),
                        BinaryOp::BitOr => self.b.ins().bor(x, y),
                        _ => self.b.ins().bxor(x, y),
                    })
                    .collect());
            }
        }
        let ca = self.comps(item, a);
        let cb = self.comps(item, b);
        let mut out = Vec::with_capacity(ca.len());
        for (x, y) in ca.into_iter().zip(cb) {
            out.push(self.binary_scalar(op, e, x, y)?);
        }
        Ok(self.chunks(item, out))
    }

    fn fma(&mut self, item: Item, a: &[Value], b: &[Value], c: &[Value]) -> R<Vec<Value>> {
        if chunk_lanes(item) > 1 && item.elem.is_float() {
            return Ok((0..a.len())
                .map(|k| {
                    if self.feat.fma {
                        self.b.ins().fma(a[k], b[k], c[k])
                    } else {
                        let p = self.b.ins().fmul(a[k], b[k]);
                        self.b.ins().fadd(p, c[k])
                    }
                })
                .collect());
        }
        let (ca, cb, cc) = (
            self.comps(item, a),
            self.comps(item, b),
            self.comps(item, c),
        );
        let mut out = Vec::with_capacity(ca.len());
        for k in 0..ca.len() {
            out.push(self.fma_scalar(item.elem, ca[k], cb[k], cc[k])?);
        }
        Ok(self.chunks(item, out))
    }

    // ----- memory -----

    /// Load an item at `addr` (its natural layout).
    fn load_item(&mut self, item: Item, addr: Value, off: i32) -> Vec<Value> {
        let ty = chunk_ty(item);
        let step = ty.bytes() as i32;
        let n = item.width as usize / chunk_lanes(item);
        (0..n)
            .map(|k| self.b.ins().load(ty, mem(), addr, off + k as i32 * step))
            .collect()
    }

    fn store_item(&mut self, item: Item, v: &[Value], addr: Value, off: i32) {
        let step = chunk_ty(item).bytes() as i32;
        for (k, &c) in v.iter().enumerate() {
            self.b.ins().store(mem(), c, addr, off + k as i32 * step);
        }
    }

    /// The index as u64 (negative indices become huge, so out of range).
    fn index64(&mut self, v: ValueId) -> R<Value> {
        let e = self.item(v).elem;
        let x = self.val(v)?[0];
        let ty = self.b.func.dfg.value_type(x);
        Ok(if ty == types::I64 {
            x
        } else if e.is_signed_int() {
            self.b.ins().sextend(types::I64, x)
        } else if e.is_unsigned_int() {
            self.b.ins().uextend(types::I64, x)
        } else {
            return Err(format!("index of type {e}"));
        })
    }

    /// `(address, in range)` of entry `index` of memory, out-of-range addresses replaced by
    /// `fallback`.
    fn address(&mut self, m: MemRef, index: ValueId, fallback: Value) -> R<(Value, Value, Item)> {
        let i = self.index64(index)?;
        if self.fast
            && let MemRef::Global(b) = m
            && self.an.unit_builtin[index.0 as usize] == Some(Builtin::AbsolutePos)
        {
            let d = self.def.buffers().get(b as usize).ok_or("unknown buffer")?;
            let item = d.item();
            let off = self.b.ins().imul_imm_s(i, item.size() as i64);
            let addr = self.b.ins().iadd(self.bufs[b as usize].0, off);
            let yes = self.iconst(types::I8, 1);
            return Ok((addr, yes, item));
        }
        let (base, len, item) = match m {
            MemRef::Global(b) => {
                let d = self.def.buffers().get(b as usize).ok_or("unknown buffer")?;
                let (p, l) = self.bufs[b as usize];
                (p, l, d.item())
            }
            MemRef::Shared(s) => {
                let d = self.def.shared().get(s as usize).ok_or("unknown shared")?;
                let p = self
                    .b
                    .ins()
                    .iadd_imm_s(self.shared, self.shared_off[s as usize] as i64);
                let l = self.iconst(types::I64, d.len as i64);
                (p, l, d.item)
            }
            MemRef::Local(a) => {
                let d = self
                    .def
                    .local_arrays()
                    .get(a as usize)
                    .ok_or("unknown local array")?;
                let base = self.unit.as_ref().ok_or("local array outside a unit")?.base;
                let p = self
                    .b
                    .ins()
                    .iadd_imm_s(base, self.local_off[a as usize] as i64);
                let l = self.iconst(types::I64, d.len as i64);
                (p, l, d.item)
            }
        };
        let mut inb = self.b.ins().icmp(IntCC::UnsignedLessThan, i, len);
        if matches!(m, MemRef::Global(_)) {
            inb = self.b.ins().bor(inb, self.unchecked);
        }
        let off = self.b.ins().imul_imm_s(i, item.size() as i64);
        let addr = self.b.ins().iadd(base, off);
        let addr = self.b.ins().select(inb, addr, fallback);
        Ok((addr, inb, item))
    }

    fn load(&mut self, m: MemRef, index: ValueId) -> R<Vec<Value>> {
        let (addr, _, item) = self.address(m, index, self.zeros)?;
        let v = self.load_item(item, addr, 0);
        if matches!(m, MemRef::Global(_)) && item.elem == ElemType::Bool {
            return Ok(v
                .into_iter()
                .map(|x| self.b.ins().icmp_imm_s(IntCC::NotEqual, x, 0))
                .collect());
        }
        Ok(v)
    }

    fn store(&mut self, m: MemRef, index: ValueId, value: ValueId) -> R<()> {
        let v = self.val(value)?;
        let (addr, _, item) = self.address(m, index, self.sink)?;
        self.store_item(item, &v, addr, 0);
        Ok(())
    }

    fn atomic(
        &mut self,
        op: AtomicOp,
        m: MemRef,
        index: ValueId,
        value: ValueId,
        compare: Option<ValueId>,
    ) -> R<Vec<Value>> {
        // Atomics always check: the unchecked loop copy only vouches for loads and stores.
        let fast = core::mem::replace(&mut self.fast, false);
        let found = self.address(m, index, self.sink);
        self.fast = fast;
        let (addr, inb, item) = found?;
        if item.width != 1 {
            return Err("vector atomics".into());
        }
        let e = item.elem;
        let v = self.val(value)?[0];
        let flags = MemFlagsData::trusted();
        let float = e == ElemType::F32;
        let ty = match e {
            ElemType::I32 | ElemType::U32 | ElemType::F32 => types::I32,
            ElemType::I64 | ElemType::U64 => types::I64,
            _ => return Err(format!("atomics on {e}")),
        };
        let bits = if float {
            self.b.ins().bitcast(types::I32, MemFlagsData::new(), v)
        } else {
            v
        };
        let s = e.is_signed_int();
        let r = match op {
            AtomicOp::Load => self.b.ins().atomic_load(ty, flags, addr),
            AtomicOp::CompareExchange => {
                let c = self.val(compare.ok_or("compare-exchange without compare")?)?[0];
                let c = if float {
                    self.b.ins().bitcast(types::I32, MemFlagsData::new(), c)
                } else {
                    c
                };
                self.b.ins().atomic_cas(flags, addr, c, bits)
            }
            AtomicOp::Add if float => self.call("atomic_add_f32", &[addr, bits], types::I32)?,
            _ => {
                let rop = match op {
                    AtomicOp::Store | AtomicOp::Exchange => AtomicRmwOp::Xchg,
                    AtomicOp::Add if !float => AtomicRmwOp::Add,
                    AtomicOp::Sub if !float => AtomicRmwOp::Sub,
                    AtomicOp::And if !float => AtomicRmwOp::And,
                    AtomicOp::Or if !float => AtomicRmwOp::Or,
                    AtomicOp::Xor if !float => AtomicRmwOp::Xor,
                    AtomicOp::Min if !float && s => AtomicRmwOp::Smin,
                    AtomicOp::Max if !float && s => AtomicRmwOp::Smax,
                    AtomicOp::Min if !float => AtomicRmwOp::Umin,
                    AtomicOp::Max if !float => AtomicRmwOp::Umax,
                    _ => return Err(format!("`{}` on {e}", op.name())),
                };
                self.b.ins().atomic_rmw(ty, flags, rop, addr, bits)
            }
        };
        let zero = self.iconst(ty, 0);
        let r = self.b.ins().select(inb, r, zero);
        Ok(vec![if float {
            self.b.ins().bitcast(types::F32, MemFlagsData::new(), r)
        } else {
            r
        }])
    }

    // ----- builtins -----

    fn builtin(&mut self, b: Builtin) -> R<Value> {
        let [dx, dy, dz] = self.def.cube_dim();
        let c = |s: &mut Self, v: u32| s.iconst(types::I32, v as i32 as i64);
        let unit = |s: &Self| {
            s.unit
                .as_ref()
                .map(|u| u.u)
                .ok_or("unit builtin outside a unit")
        };
        Ok(match b {
            Builtin::CubePos => self.linear,
            Builtin::CubePosX => self.cube[0],
            Builtin::CubePosY => self.cube[1],
            Builtin::CubePosZ => self.cube[2],
            Builtin::CubeDim => c(self, dx * dy * dz),
            Builtin::CubeDimX => c(self, dx),
            Builtin::CubeDimY => c(self, dy),
            Builtin::CubeDimZ => c(self, dz),
            Builtin::CubeCountX => self.counts[0],
            Builtin::CubeCountY => self.counts[1],
            Builtin::CubeCountZ => self.counts[2],
            Builtin::CubeCount => {
                let xy = self.b.ins().imul(self.counts[0], self.counts[1]);
                self.b.ins().imul(xy, self.counts[2])
            }
            Builtin::PlaneSize => c(self, PLANE_SIZE),
            Builtin::UnitPos => unit(self)?,
            Builtin::UnitPosX => {
                let u = unit(self)?;
                self.b.ins().urem_imm_u(u, dx as i64)
            }
            Builtin::UnitPosY => {
                let u = unit(self)?;
                let q = self.b.ins().udiv_imm_u(u, dx as i64);
                self.b.ins().urem_imm_u(q, dy as i64)
            }
            Builtin::UnitPosZ => {
                let u = unit(self)?;
                self.b.ins().udiv_imm_u(u, (dx * dy) as i64)
            }
            Builtin::UnitPosPlane => {
                let u = unit(self)?;
                self.b.ins().urem_imm_u(u, PLANE_SIZE as i64)
            }
            Builtin::AbsolutePos => {
                let u = unit(self)?;
                let base = self.b.ins().imul_imm_s(self.linear, (dx * dy * dz) as i64);
                self.b.ins().iadd(base, u)
            }
            Builtin::AbsolutePosX | Builtin::AbsolutePosY | Builtin::AbsolutePosZ => {
                let (k, d, local) = match b {
                    Builtin::AbsolutePosX => (0, dx, Builtin::UnitPosX),
                    Builtin::AbsolutePosY => (1, dy, Builtin::UnitPosY),
                    _ => (2, dz, Builtin::UnitPosZ),
                };
                let l = self.builtin(local)?;
                let base = self.b.ins().imul_imm_s(self.cube[k], d as i64);
                self.b.ins().iadd(base, l)
            }
        })
    }

    // ----- operations -----

    fn op(&mut self, out: ValueId, op: &Op) -> R<Vec<Value>> {
        let item = self.item(out);
        Ok(match op {
            Op::Literal(v) => vec![self.literal(*v)],
            Op::Builtin(b) => vec![self.builtin(*b)?],
            Op::Scalar(i) => {
                let d = self
                    .def
                    .scalars()
                    .get(*i as usize)
                    .ok_or("unknown scalar")?;
                let ty = elem_ty(d.elem);
                vec![
                    self.b
                        .ins()
                        .load(ty, MemFlagsData::trusted(), self.scalars, *i as i32 * 8),
                ]
            }
            Op::Len(b) => {
                let (_, len) = *self.bufs.get(*b as usize).ok_or("unknown buffer")?;
                let max = self.iconst(types::I64, u32::MAX as i64);
                let l = self.int_min_max(false, false, len, max);
                vec![self.b.ins().ireduce(types::I32, l)]
            }
            Op::Rank(b) => {
                let bi = self.iconst(types::I32, *b as i64);
                vec![self.call("rank", &[self.ctx, bi], types::I32)?]
            }
            Op::Shape { buffer, dim } | Op::Stride { buffer, dim } => {
                let bi = self.iconst(types::I32, *buffer as i64);
                let d = self.index64(*dim)?;
                let st = self.iconst(types::I32, matches!(op, Op::Stride { .. }) as i64);
                vec![self.call("meta", &[self.ctx, bi, d, st], types::I32)?]
            }
            Op::Load { mem, index } => self.load(*mem, *index)?,
            Op::ReadVar(var) => self.read_var(*var)?,
            Op::Unary(u, x) => {
                let x = self.val(*x)?;
                self.unary(*u, item, &x)?
            }
            Op::Binary(bop, x, y) => {
                let (x, y) = (self.val(*x)?, self.val(*y)?);
                self.binary(*bop, item, &x, &y)?
            }
            Op::Compare(c, x, y) => {
                let from = self.item(*x);
                let (x, y) = (self.val(*x)?, self.val(*y)?);
                let (cx, cy) = (self.comps(from, &x), self.comps(from, &y));
                let mut out = Vec::with_capacity(cx.len());
                for (a, b) in cx.into_iter().zip(cy) {
                    out.push(self.compare_scalar(*c, from.elem, a, b)?);
                }
                out
            }
            Op::Fma(a, b, c) => {
                let (a, b, c) = (self.val(*a)?, self.val(*b)?, self.val(*c)?);
                self.fma(item, &a, &b, &c)?
            }
            Op::Clamp(x, lo, hi) => {
                let (x, lo, hi) = (self.val(*x)?, self.val(*lo)?, self.val(*hi)?);
                let (cx, cl, ch) = (
                    self.comps(item, &x),
                    self.comps(item, &lo),
                    self.comps(item, &hi),
                );
                let mut out = Vec::with_capacity(cx.len());
                for k in 0..cx.len() {
                    out.push(self.clamp_scalar(item.elem, cx[k], cl[k], ch[k])?);
                }
                self.chunks(item, out)
            }
            Op::Select(c, x, y) => {
                let (c, x, y) = (self.val(*c)?, self.val(*x)?, self.val(*y)?);
                let (cx, cy) = (self.comps(item, &x), self.comps(item, &y));
                let out: Vec<Value> = (0..cx.len())
                    .map(|k| self.b.ins().select(c[k], cx[k], cy[k]))
                    .collect();
                self.chunks(item, out)
            }
            Op::Cast(x, to) => {
                let from = self.item(*x);
                let xv = self.val(*x)?;
                let cx = self.comps(from, &xv);
                let mut out = Vec::with_capacity(cx.len());
                for v in cx {
                    out.push(self.cast_scalar(v, from.elem, *to)?);
                }
                self.chunks(item, out)
            }
            Op::Bitcast(x, _, _) => {
                let from = self.item(*x);
                let xv = self.val(*x)?;
                if from.size() != item.size() {
                    return Err("bitcast between sizes".into());
                }
                let slot = self.b.create_sized_stack_slot(StackSlotData::new(
                    StackSlotKind::ExplicitSlot,
                    from.size() as u32,
                    4,
                ));
                let addr = self.b.ins().stack_addr(types::I64, slot, 0);
                self.store_item(from, &xv, addr, 0);
                self.load_item(item, addr, 0)
            }
            Op::Splat(x, _) => {
                let s = self.val(*x)?[0];
                let l = chunk_lanes(item);
                if l == 1 {
                    vec![s; item.width as usize]
                } else {
                    let v = self.b.ins().splat(chunk_ty(item), s);
                    vec![v; item.width as usize / l]
                }
            }
            Op::Extract(x, c) => {
                let from = self.item(*x);
                let xv = self.val(*x)?;
                let l = chunk_lanes(from);
                let c = *c as usize;
                if c >= from.width as usize {
                    return Err("extract past the width".into());
                }
                if l == 1 {
                    vec![xv[c]]
                } else {
                    vec![self.b.ins().extractlane(xv[c / l], (c % l) as u8)]
                }
            }
            Op::Insert(v, c, x) => {
                let mut vv = self.val(*v)?;
                let s = self.val(*x)?[0];
                let l = chunk_lanes(item);
                let c = *c as usize;
                if c >= item.width as usize {
                    return Err("insert past the width".into());
                }
                if l == 1 {
                    vv[c] = s;
                } else {
                    vv[c / l] = self.b.ins().insertlane(vv[c / l], s, (c % l) as u8);
                }
                vv
            }
            Op::Vector(parts) => {
                let mut comps = Vec::with_capacity(parts.len());
                for p in parts {
                    comps.push(self.val(*p)?[0]);
                }
                self.chunks(item, comps)
            }
            Op::Atomic {
                op,
                mem,
                index,
                value,
                compare,
            } => self.atomic(*op, *mem, *index, *value, *compare)?,
            Op::Plane(..) | Op::PlaneBroadcast(..) | Op::PlaneShuffle(..) | Op::Ballot(_) => {
                return Err("plane operations".into());
            }
        })
    }

    // ----- variables -----

    fn var_item(&self, var: VarId) -> R<Item> {
        self.def
            .vars()
            .get(var.0 as usize)
            .map(|d| d.item)
            .ok_or_else(|| format!("variable {} is not declared", var.0))
    }

    fn var_addr(&mut self, var: VarId) -> Option<Value> {
        let off = self.var_off[var.0 as usize]?;
        let base = self.unit.as_ref()?.base;
        Some(self.b.ins().iadd_imm_s(base, off as i64))
    }

    fn read_var(&mut self, var: VarId) -> R<Vec<Value>> {
        let item = self.var_item(var)?;
        if let Some(addr) = self.var_addr(var) {
            return Ok(self.load_item(item, addr, 0));
        }
        let vars = self.reg_var(var, item);
        Ok(vars.iter().map(|&v| self.b.use_var(v)).collect())
    }

    fn write_var(&mut self, var: VarId, value: ValueId) -> R<()> {
        let item = self.var_item(var)?;
        if self.item(value) != item {
            return Err("variable of another type".into());
        }
        let v = self.val(value)?;
        if let Some(addr) = self.var_addr(var) {
            self.store_item(item, &v, addr, 0);
            return Ok(());
        }
        let vars = self.reg_var(var, item);
        for (var, val) in vars.into_iter().zip(v) {
            self.b.def_var(var, val);
        }
        Ok(())
    }

    fn reg_var(&mut self, var: VarId, item: Item) -> Vec<Variable> {
        if let Some(v) = &self.regvars[var.0 as usize] {
            return v.clone();
        }
        let ty = chunk_ty(item);
        let n = item.width as usize / chunk_lanes(item);
        let v: Vec<Variable> = (0..n).map(|_| self.b.declare_var(ty)).collect();
        self.regvars[var.0 as usize] = Some(v.clone());
        v
    }

    // ----- control -----

    /// Continue in a fresh block after a jump (code there is unreachable).
    fn dead(&mut self) {
        let b = self.b.create_block();
        self.b.switch_to_block(b);
    }

    fn range_begin(&mut self, start: ValueId, end: ValueId, step: ValueId) -> R<RangeBlocks> {
        let elem = self.item(start).elem;
        if !elem.is_int() {
            return Err(format!("range over {elem}"));
        }
        let (s0, e, st) = (self.val(start)?[0], self.val(end)?[0], self.val(step)?[0]);
        let ty = elem_ty(elem);
        let counter = self.b.declare_var(ty);
        self.b.def_var(counter, s0);
        let header = self.b.create_block();
        let body = self.b.create_block();
        let latch = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let i = self.b.use_var(counter);
        let go = if elem.is_signed_int() {
            let up = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, st, 0);
            let lt = self.b.ins().icmp(IntCC::SignedLessThan, i, e);
            let a = self.b.ins().band(up, lt);
            let down = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, st, 0);
            let gt = self.b.ins().icmp(IntCC::SignedGreaterThan, i, e);
            let b = self.b.ins().band(down, gt);
            self.b.ins().bor(a, b)
        } else {
            let up = self.b.ins().icmp_imm_s(IntCC::NotEqual, st, 0);
            let lt = self.b.ins().icmp(IntCC::UnsignedLessThan, i, e);
            self.b.ins().band(up, lt)
        };
        self.b.ins().brif(go, body, &[], exit, &[]);
        self.b.switch_to_block(body);
        Ok(RangeBlocks {
            header,
            body,
            latch,
            exit,
            counter,
            elem,
            step: st,
            i,
        })
    }

    fn range_end(&mut self, r: RangeBlocks) {
        let _ = r.body;
        self.b.ins().jump(r.latch, &[]);
        self.b.switch_to_block(r.latch);
        let next = self.b.ins().iadd(r.i, r.step);
        // Stop when `i + step` overflows.
        let ovf = if r.elem.is_signed_int() {
            let up = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, r.step, 0);
            let wrapped_up = self.b.ins().icmp(IntCC::SignedLessThan, next, r.i);
            let a = self.b.ins().band(up, wrapped_up);
            let down = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, r.step, 0);
            let wrapped_down = self.b.ins().icmp(IntCC::SignedGreaterThan, next, r.i);
            let b = self.b.ins().band(down, wrapped_down);
            self.b.ins().bor(a, b)
        } else {
            self.b.ins().icmp(IntCC::UnsignedLessThan, next, r.i)
        };
        self.b.def_var(r.counter, next);
        self.b.ins().brif(ovf, r.exit, &[], r.header, &[]);
        self.b.switch_to_block(r.exit);
    }

    fn cube_nodes(&mut self, nodes: &'a [CubeNode]) -> R<()> {
        for n in nodes {
            match n {
                CubeNode::Seg(s) => self.segment(*s)?,
                CubeNode::Plane { out, op } => self.plane_step(*out, op)?,
                CubeNode::If {
                    cond,
                    then,
                    otherwise,
                    masks: Some((mt, me)),
                } => {
                    let (mt, me) = (self.mask_base + mt, self.mask_base + me);
                    let coff = self.spill_off[cond.0 as usize].ok_or("condition without a slot")?;
                    self.each_unit(|e, base| {
                        let c = e.b.ins().load(types::I8, mem(), base, coff as i32);
                        let t = e.b.ins().icmp_imm_s(IntCC::NotEqual, c, 0);
                        let f = e.b.ins().bxor_imm_s(t, 1);
                        e.b.ins().store(mem(), t, base, mt as i32);
                        e.b.ins().store(mem(), f, base, me as i32);
                        Ok(())
                    })?;
                    self.masks.push(mt);
                    let r = self.cube_nodes(then);
                    self.masks.pop();
                    r?;
                    self.masks.push(me);
                    let r = self.cube_nodes(otherwise);
                    self.masks.pop();
                    r?;
                }
                CubeNode::Loop {
                    body,
                    active,
                    resume,
                } => self.cube_loop(body, self.mask_base + active, self.mask_base + resume)?,
                CubeNode::If {
                    cond,
                    then,
                    otherwise,
                    masks: None,
                } => {
                    let c = self.val(*cond)?[0];
                    let (t, e, m) = (
                        self.b.create_block(),
                        self.b.create_block(),
                        self.b.create_block(),
                    );
                    self.b.ins().brif(c, t, &[], e, &[]);
                    self.b.switch_to_block(t);
                    self.cube_nodes(then)?;
                    self.b.ins().jump(m, &[]);
                    self.b.switch_to_block(e);
                    self.cube_nodes(otherwise)?;
                    self.b.ins().jump(m, &[]);
                    self.b.switch_to_block(m);
                }
                CubeNode::Range {
                    var,
                    start,
                    end,
                    step,
                    body,
                } => {
                    let r = self.range_begin(*start, *end, *step)?;
                    self.set(*var, vec![r.i]);
                    self.cube_nodes(body)?;
                    self.range_end(r);
                }
            }
        }
        Ok(())
    }

    /// Buffers this segment accesses at `absolute_pos` (loads and stores, at any depth).
    fn linear_buffers(&self, stmts: &[&'a Stmt]) -> Vec<u32> {
        fn walk(e: &Emitter<'_, '_>, s: &Stmt, out: &mut Vec<u32>) {
            let lin = |v: &ValueId| e.an.unit_builtin[v.0 as usize] == Some(Builtin::AbsolutePos);
            match s {
                Stmt::Let {
                    op:
                        Op::Load {
                            mem: MemRef::Global(b),
                            index,
                        },
                    ..
                }
                | Stmt::Store {
                    mem: MemRef::Global(b),
                    index,
                    ..
                } if lin(index) && !out.contains(b) => out.push(*b),
                Stmt::If {
                    then, otherwise, ..
                } => {
                    for s in then.stmts.iter().chain(&otherwise.stmts) {
                        walk(e, s, out);
                    }
                }
                Stmt::Range { body, .. } | Stmt::Loop { body } => {
                    for s in &body.stmts {
                        walk(e, s, out);
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        for s in stmts {
            walk(self, s, &mut out);
        }
        out
    }

    fn segment(&mut self, s: usize) -> R<()> {
        let seg = &self.an.segs[s];
        for &(out, op) in &seg.hoisted {
            let v = self.op(out, op)?;
            self.set(out, v);
        }
        let uniform = &self.an.uniform;
        let work = seg.stmts.iter().any(|st| match st {
            Stmt::Let { out, .. } => !uniform[out.0 as usize],
            _ => true,
        });
        if !work {
            return Ok(());
        }
        let linear = self.linear_buffers(&seg.stmts);
        if linear.is_empty() {
            return self.unit_loop(s);
        }
        // When the whole cube's `absolute_pos` run is inside every buffer it indexes (the
        // common case: all cubes but the last), a copy of the loop accesses them unchecked.
        let units = self.def.cube_size() as i64;
        let lin = self.b.ins().uextend(types::I64, self.linear);
        let next = self.b.ins().iadd_imm_s(lin, 1);
        let end = self.b.ins().imul_imm_s(next, units);
        let mut fast = self
            .b
            .ins()
            .icmp_imm_s(IntCC::UnsignedLessThanOrEqual, end, 1i64 << 32);
        for b in linear {
            let len = self.bufs[b as usize].1;
            let ok = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, end, len);
            fast = self.b.ins().band(fast, ok);
        }
        let (bf, bs, after) = (
            self.b.create_block(),
            self.b.create_block(),
            self.b.create_block(),
        );
        self.b.ins().brif(fast, bf, &[], bs, &[]);
        self.b.switch_to_block(bf);
        self.fast = true;
        let r = self.unit_loop(s);
        self.fast = false;
        r?;
        self.b.ins().jump(after, &[]);
        self.b.switch_to_block(bs);
        self.unit_loop(s)?;
        self.b.ins().jump(after, &[]);
        self.b.switch_to_block(after);
        Ok(())
    }

    fn unit_loop(&mut self, s: usize) -> R<()> {
        let seg = &self.an.segs[s];
        let units = self.def.cube_size();
        let uvar = self.b.declare_var(types::I32);
        let zero = self.iconst(types::I32, 0);
        self.b.def_var(uvar, zero);
        let head = self.b.create_block();
        let next = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(head, &[]);
        self.b.switch_to_block(head);
        let u = self.b.use_var(uvar);
        let u64_ = self.b.ins().uextend(types::I64, u);
        let off = self
            .b
            .ins()
            .imul_imm_s(u64_, self.layout.unit_stride as i64);
        let base = self.b.ins().iadd(self.state, off);
        if let Some(r) = self.ret_off {
            let flag = self.b.ins().load(types::I8, mem(), base, r as i32);
            let body = self.b.create_block();
            self.b.ins().brif(flag, next, &[], body, &[]);
            self.b.switch_to_block(body);
        }
        for m in self.masks.clone() {
            let flag = self.b.ins().load(types::I8, mem(), base, m as i32);
            let body = self.b.create_block();
            self.b.ins().brif(flag, body, &[], next, &[]);
            self.b.switch_to_block(body);
        }
        self.unit = Some(Unit { u, base, next });
        for &v in &seg.live_in {
            let item = self.item(v);
            let chunks = if let Some(b) = self.an.unit_builtin[v.0 as usize] {
                vec![self.builtin(b)?]
            } else {
                let off = self.spill_off[v.0 as usize].ok_or("live value without a slot")?;
                self.load_item(item, base, off as i32)
            };
            self.set(v, chunks);
        }
        for st in &seg.stmts {
            self.unit_stmt(st)?;
        }
        self.b.ins().jump(next, &[]);
        self.b.switch_to_block(next);
        let u1 = self.b.ins().iadd_imm_s(u, 1);
        self.b.def_var(uvar, u1);
        let more = self
            .b
            .ins()
            .icmp_imm_s(IntCC::UnsignedLessThan, u1, units as i64);
        self.b.ins().brif(more, head, &[], exit, &[]);
        self.b.switch_to_block(exit);
        self.unit = None;
        Ok(())
    }

    /// Emit `f(unit base)` for every unit of the cube (masks ignored).
    fn each_unit(&mut self, mut f: impl FnMut(&mut Self, Value) -> R<()>) -> R<()> {
        let units = self.def.cube_size();
        let uvar = self.b.declare_var(types::I32);
        let zero = self.iconst(types::I32, 0);
        self.b.def_var(uvar, zero);
        let (head, exit) = (self.b.create_block(), self.b.create_block());
        self.b.ins().jump(head, &[]);
        self.b.switch_to_block(head);
        let u = self.b.use_var(uvar);
        let u64_ = self.b.ins().uextend(types::I64, u);
        let o = self
            .b
            .ins()
            .imul_imm_s(u64_, self.layout.unit_stride as i64);
        let base = self.b.ins().iadd(self.state, o);
        f(self, base)?;
        let u1 = self.b.ins().iadd_imm_s(u, 1);
        self.b.def_var(uvar, u1);
        let more = self
            .b
            .ins()
            .icmp_imm_s(IntCC::UnsignedLessThan, u1, units as i64);
        self.b.ins().brif(more, head, &[], exit, &[]);
        self.b.switch_to_block(exit);
        Ok(())
    }

    /// Whether the unit at `base` runs: not returned, every mask in force set (i8).
    fn unit_active(&mut self, base: Value) -> Value {
        let mut on = self.iconst(types::I8, 1);
        if let Some(r) = self.ret_off {
            let f = self.b.ins().load(types::I8, mem(), base, r as i32);
            let nf = self.b.ins().icmp_imm_s(IntCC::Equal, f, 0);
            on = self.b.ins().band(on, nf);
        }
        for m in self.masks.clone() {
            let f = self.b.ins().load(types::I8, mem(), base, m as i32);
            let nz = self.b.ins().icmp_imm_s(IntCC::NotEqual, f, 0);
            on = self.b.ins().band(on, nz);
        }
        on
    }

    /// A cube-level `loop`: runs its body while any unit is active in it.
    fn cube_loop(&mut self, body: &'a [CubeNode<'a>], active: u32, resume: u32) -> R<()> {
        self.each_unit(|e, base| {
            let on = e.unit_active(base);
            let zero = e.iconst(types::I8, 0);
            e.b.ins().store(mem(), on, base, active as i32);
            e.b.ins().store(mem(), zero, base, resume as i32);
            Ok(())
        })?;
        let head = self.b.create_block();
        let run = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(head, &[]);
        self.b.switch_to_block(head);
        self.masks.push(active);
        let any = self.b.declare_var(types::I8);
        let zero = self.iconst(types::I8, 0);
        self.b.def_var(any, zero);
        let r = self.each_unit(|e, base| {
            let on = e.unit_active(base);
            let acc = e.b.use_var(any);
            let acc = e.b.ins().bor(acc, on);
            e.b.def_var(any, acc);
            Ok(())
        });
        if let Err(e) = r {
            self.masks.pop();
            return Err(e);
        }
        let go = self.b.use_var(any);
        self.b.ins().brif(go, run, &[], exit, &[]);
        self.b.switch_to_block(run);
        self.cube_loops.push((active, resume));
        let r = self.cube_nodes(body);
        self.cube_loops.pop();
        self.masks.pop();
        r?;
        // Units that continued come back for the next iteration.
        self.each_unit(|e, base| {
            let a = e.b.ins().load(types::I8, mem(), base, active as i32);
            let c = e.b.ins().load(types::I8, mem(), base, resume as i32);
            let a = e.b.ins().bor(a, c);
            let zero = e.iconst(types::I8, 0);
            e.b.ins().store(mem(), a, base, active as i32);
            e.b.ins().store(mem(), zero, base, resume as i32);
            Ok(())
        })?;
        self.b.ins().jump(head, &[]);
        self.b.switch_to_block(exit);
        Ok(())
    }

    /// Store a (uniform) value to slot `off` of every unit.
    fn store_all_units(&mut self, item: Item, chunks: &[Value], off: u32) -> R<()> {
        let units = self.def.cube_size();
        let uvar = self.b.declare_var(types::I32);
        let zero = self.iconst(types::I32, 0);
        self.b.def_var(uvar, zero);
        let (head, exit) = (self.b.create_block(), self.b.create_block());
        self.b.ins().jump(head, &[]);
        self.b.switch_to_block(head);
        let u = self.b.use_var(uvar);
        let u64_ = self.b.ins().uextend(types::I64, u);
        let o = self
            .b
            .ins()
            .imul_imm_s(u64_, self.layout.unit_stride as i64);
        let base = self.b.ins().iadd(self.state, o);
        self.store_item(item, chunks, base, off as i32);
        let u1 = self.b.ins().iadd_imm_s(u, 1);
        self.b.def_var(uvar, u1);
        let more = self
            .b
            .ins()
            .icmp_imm_s(IntCC::UnsignedLessThan, u1, units as i64);
        self.b.ins().brif(more, head, &[], exit, &[]);
        self.b.switch_to_block(exit);
        Ok(())
    }

    fn plane_step(&mut self, out: ValueId, op: &Op) -> R<()> {
        let slot = |e: &Self, v: ValueId| {
            e.spill_off[v.0 as usize].ok_or_else(|| format!("plane operand %{} has no slot", v.0))
        };
        let out_item = self.item(out);
        let (f, x, lane): (plane::PlaneFn, ValueId, Option<ValueId>) = match op {
            Op::Plane(p, x) => (
                plane::reduce_fn(*p, out_item.elem)
                    .ok_or_else(|| format!("`{}` on {out_item}", p.name()))?,
                *x,
                None,
            ),
            Op::PlaneBroadcast(x, l) | Op::PlaneShuffle(x, l) => {
                let f: plane::PlaneFn = match out_item.elem.size() {
                    1 => plane::shuffle::<u8>,
                    2 => plane::shuffle::<u16>,
                    4 => plane::shuffle::<u32>,
                    _ => plane::shuffle::<u64>,
                };
                (f, *x, Some(*l))
            }
            Op::Ballot(x) => (plane::ballot as plane::PlaneFn, *x, None),
            _ => return Err("not a plane operation".into()),
        };
        for v in [Some(x), lane].into_iter().flatten() {
            if self.an.uniform[v.0 as usize] {
                let off = slot(self, v)?;
                let item = self.item(v);
                let chunks = self.val(v)?;
                self.store_all_units(item, &chunks, off)?;
            }
        }
        let x_item = self.item(x);
        let step = Box::new(PlaneStep {
            f,
            x_off: slot(self, x)?,
            x_bytes: x_item.size() as u32,
            lane_off: lane.map(|l| slot(self, l)).transpose()?,
            out_off: slot(self, out)?,
            out_bytes: out_item.size() as u32,
            width: x_item.width as usize,
            ret_off: self.ret_off,
            masks: self.masks.clone(),
            units: self.def.cube_size() as usize,
            stride: self.layout.unit_stride,
        });
        let ptr = self.iconst(types::I64, &*step as *const PlaneStep as i64);
        self.planes.push(step);
        let fref = self.helper("plane_step", &[types::I64, types::I64], None)?;
        self.b.ins().call(fref, &[ptr, self.state]);
        Ok(())
    }

    fn unit_block(&mut self, stmts: &'a [Stmt]) -> R<()> {
        for s in stmts {
            self.unit_stmt(s)?;
        }
        Ok(())
    }

    fn unit_stmt(&mut self, s: &'a Stmt) -> R<()> {
        match s {
            Stmt::Let { out, op } => {
                if self.an.uniform[out.0 as usize] {
                    return Ok(());
                }
                let v = self.op(*out, op)?;
                if let Some(off) = self.spill_off[out.0 as usize] {
                    let base = self.unit.as_ref().ok_or("spill outside a unit")?.base;
                    self.store_item(self.item(*out), &v, base, off as i32);
                }
                self.set(*out, v);
            }
            Stmt::Store { mem, index, value } => {
                if let MemRef::Global(b) = mem {
                    let d = self
                        .def
                        .buffers()
                        .get(*b as usize)
                        .ok_or("unknown buffer")?;
                    if d.access != compute_core::kernel::Access::ReadWrite {
                        return Err("store to a read-only buffer".into());
                    }
                }
                self.store(*mem, *index, *value)?;
            }
            Stmt::DeclareVar { var, init } => self.write_var(*var, *init)?,
            Stmt::Assign { var, value } => self.write_var(*var, *value)?,
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.val(*cond)?[0];
                let (t, e, m) = (
                    self.b.create_block(),
                    self.b.create_block(),
                    self.b.create_block(),
                );
                let has_else = !otherwise.stmts.is_empty();
                self.b
                    .ins()
                    .brif(c, t, &[], if has_else { e } else { m }, &[]);
                self.b.switch_to_block(t);
                self.unit_block(&then.stmts)?;
                self.b.ins().jump(m, &[]);
                self.b.switch_to_block(e);
                if has_else {
                    self.unit_block(&otherwise.stmts)?;
                    self.b.ins().jump(m, &[]);
                } else {
                    // Unreachable, but every block must end.
                    self.b.ins().jump(m, &[]);
                }
                self.b.switch_to_block(m);
            }
            Stmt::Range {
                var,
                start,
                end,
                step,
                body,
            } => {
                let r = self.range_begin(*start, *end, *step)?;
                self.set(*var, vec![r.i]);
                self.loops.push((r.latch, r.exit));
                self.unit_block(&body.stmts)?;
                self.loops.pop();
                self.range_end(r);
            }
            Stmt::Loop { body } => {
                let head = self.b.create_block();
                let exit = self.b.create_block();
                self.b.ins().jump(head, &[]);
                self.b.switch_to_block(head);
                self.loops.push((head, exit));
                self.unit_block(&body.stmts)?;
                self.loops.pop();
                self.b.ins().jump(head, &[]);
                self.b.switch_to_block(exit);
            }
            Stmt::Break | Stmt::Continue if self.loops.is_empty() => {
                // Out of a cube-level `loop`: the unit leaves this iteration (and, for
                // `break`, the loop).
                let &(active, resume) = self.cube_loops.last().ok_or("`break` outside a loop")?;
                let unit = self.unit.as_ref().ok_or("`break` outside a unit")?;
                let (base, next) = (unit.base, unit.next);
                let zero = self.iconst(types::I8, 0);
                self.b.ins().store(mem(), zero, base, active as i32);
                if matches!(s, Stmt::Continue) {
                    let one = self.iconst(types::I8, 1);
                    self.b.ins().store(mem(), one, base, resume as i32);
                }
                self.b.ins().jump(next, &[]);
                self.dead();
            }
            Stmt::Break | Stmt::Continue => {
                let &(cont, brk) = self.loops.last().ok_or("`break` outside a loop")?;
                let target = if matches!(s, Stmt::Break) { brk } else { cont };
                self.b.ins().jump(target, &[]);
                self.dead();
            }
            Stmt::Return => {
                let unit = self.unit.as_ref().ok_or("return outside a unit")?;
                let (base, next) = (unit.base, unit.next);
                if let Some(r) = self.ret_off {
                    let one = self.iconst(types::I8, 1);
                    self.b.ins().store(mem(), one, base, r as i32);
                }
                self.b.ins().jump(next, &[]);
                self.dead();
            }
            Stmt::Barrier => return Err("a barrier in unit code".into()),
        }
        Ok(())
    }
}
