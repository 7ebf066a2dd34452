//! The builder that writes kernels in Rust.
//!
//! Size: one method per IR operation a kernel can build; each is short and they share the
//! builder's SSA state.

use core::sync::atomic::{AtomicU32, Ordering};

use super::definition::KernelDefinition;
use super::error::BuildError;
use super::ir::{
    AtomicOp, BinaryOp, Block, CmpOp, MemRef, Op, PlaneOp, Stmt, UnaryOp, ValueId, VarId,
};
use super::scalar::ScalarValue;
use super::types::{
    Access, BufferDecl, Builtin, Item, LocalArrayDecl, ScalarDecl, SharedDecl, VECTOR_WIDTHS,
    VarDecl,
};
use crate::elem::ElemType;

/// Tags handles with their builder, so a handle of another builder is reported, not misread.
static NEXT_BUILDER: AtomicU32 = AtomicU32::new(1);

/// A value of the kernel being built: a typed, copyable handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Value {
    builder: u32,
    id: u32,
    item: Item,
}

impl Value {
    /// The value's type.
    pub fn item(self) -> Item {
        self.item
    }

    /// The value's element type.
    pub fn elem(self) -> ElemType {
        self.item.elem
    }

    /// The value's id in the built kernel.
    pub fn id(self) -> ValueId {
        ValueId(self.id)
    }
}

/// A global buffer parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buffer {
    builder: u32,
    index: u32,
}

/// A mutable variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Var {
    builder: u32,
    id: u32,
    item: Item,
}

impl Var {
    /// The variable's type.
    pub fn item(self) -> Item {
        self.item
    }
}

/// An array in shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SharedArray {
    builder: u32,
    index: u32,
}

/// An array private to each unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalArray {
    builder: u32,
    index: u32,
}

/// An `if` whose blocks are being written (see [`KernelBuilder::begin_if`]).
#[derive(Debug)]
pub(super) struct OpenIf {
    cond: Value,
    ok: bool,
    then: Option<Block>,
}

/// A range loop whose body is being written (see [`KernelBuilder::begin_range`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct OpenRange {
    pub(super) var: Value,
    start: Value,
    end: Value,
    step: Value,
    ok: bool,
}

/// Memory that [`KernelBuilder::load`] and [`KernelBuilder::store`] address: a [`Buffer`], a
/// [`SharedArray`] or a [`LocalArray`].
pub trait Memory: Copy {
    /// The builder tag and the IR reference.
    #[doc(hidden)]
    fn mem_ref(self) -> (u32, MemRef);
}

impl Memory for Buffer {
    fn mem_ref(self) -> (u32, MemRef) {
        (self.builder, MemRef::Global(self.index))
    }
}

impl Memory for SharedArray {
    fn mem_ref(self) -> (u32, MemRef) {
        (self.builder, MemRef::Shared(self.index))
    }
}

impl Memory for LocalArray {
    fn mem_ref(self) -> (u32, MemRef) {
        (self.builder, MemRef::Local(self.index))
    }
}

/// Memory named by its IR reference, for replaying a kernel through a builder
/// ([`KernelDefinition::validate`](super::KernelDefinition::validate)).
#[derive(Debug, Clone, Copy)]
pub(super) struct RawMemory {
    builder: u32,
    mem: MemRef,
}

impl Memory for RawMemory {
    fn mem_ref(self) -> (u32, MemRef) {
        (self.builder, self.mem)
    }
}

impl KernelBuilder {
    /// The memory `mem` of this builder (whether it is declared is checked where it is used).
    pub(super) fn raw_memory(&self, mem: MemRef) -> RawMemory {
        RawMemory {
            builder: self.tag,
            mem,
        }
    }

    /// The buffer parameter `index` of this builder.
    pub(super) fn raw_buffer(&self, index: u32) -> Buffer {
        Buffer {
            builder: self.tag,
            index,
        }
    }
}

/// An operand: a [`Value`], or a Rust literal (`2.0f32`, `1u32`, `true`, a [`ScalarValue`]) that
/// becomes a constant of its type.
pub trait IntoValue {
    /// The value in `k`.
    fn into_value(self, k: &mut KernelBuilder) -> Value;
}

impl IntoValue for Value {
    fn into_value(self, _k: &mut KernelBuilder) -> Value {
        self
    }
}

impl IntoValue for ScalarValue {
    fn into_value(self, k: &mut KernelBuilder) -> Value {
        k.lit(self)
    }
}

macro_rules! literal_operands {
    ($($t:ty => $v:ident),* $(,)?) => {
        $(impl IntoValue for $t {
            fn into_value(self, k: &mut KernelBuilder) -> Value {
                k.lit(ScalarValue::$v(self))
            }
        })*
    };
}

literal_operands!(
    bool => Bool, i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16,
    u32 => U32, u64 => U64, half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
);

/// Builds a [`KernelDefinition`]. Operations append to the current block; `if_`, `range` and
/// `loop_` open nested blocks through closures. Mistakes are recorded and returned by
/// [`build`](Self::build), so kernel code needs no `?` on every line.
///
/// ```
/// use compute_core::elem::ElemType;
/// use compute_core::kernel::KernelBuilder;
///
/// let mut k = KernelBuilder::new("axpy", [256, 1, 1]);
/// let x = k.input("x", ElemType::F32, 4);
/// let y = k.output("y", ElemType::F32, 4);
/// let a = k.scalar("a", ElemType::F32);
/// let i = k.absolute_pos();
/// let n = k.len(y);
/// let inside = k.lt(i, n);
/// k.if_(inside, |k| {
///     let xi = k.load(x, i);
///     let yi = k.load(y, i);
///     let r = k.fma(a, xi, yi);
///     k.store(y, i, r);
/// });
/// let kernel = k.build().unwrap();
/// assert_eq!(kernel.buffers().len(), 2);
/// ```
#[derive(Debug)]
pub struct KernelBuilder {
    tag: u32,
    def: KernelDefinition,
    value_scope: Vec<u32>,
    value_names: Vec<String>,
    var_scope: Vec<u32>,
    blocks: Vec<Vec<Stmt>>,
    scopes: Vec<u32>,
    next_scope: u32,
    loop_depth: u32,
    errors: Vec<BuildError>,
}

impl KernelBuilder {
    /// A builder for the kernel `name` with `cube_dim` units per cube in x, y, z.
    pub fn new(name: &str, cube_dim: [u32; 3]) -> Self {
        let mut k = Self {
            tag: NEXT_BUILDER.fetch_add(1, Ordering::Relaxed),
            def: KernelDefinition {
                id_cache: Default::default(),
                name: name.to_owned(),
                cube_dim,
                buffers: Vec::new(),
                scalars: Vec::new(),
                shared: Vec::new(),
                locals: Vec::new(),
                vars: Vec::new(),
                values: Vec::new(),
                body: Block::default(),
            },
            value_scope: Vec::new(),
            value_names: Vec::new(),
            var_scope: Vec::new(),
            blocks: vec![Vec::new()],
            scopes: vec![0],
            next_scope: 1,
            loop_depth: 0,
            errors: Vec::new(),
        };
        if cube_dim.contains(&0) {
            k.declaration_error(name, format!("cube dimension {cube_dim:?} has a zero axis"));
        }
        k
    }

    /// The kernel, validated; the first mistake recorded while building otherwise.
    pub fn build(mut self) -> Result<KernelDefinition, BuildError> {
        if let Some(e) = self.errors.into_iter().next() {
            return Err(e);
        }
        debug_assert_eq!(self.blocks.len(), 1);
        self.def.body = Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        };
        Ok(self.def)
    }

    /// Every mistake recorded so far, in order.
    pub fn errors(&self) -> &[BuildError] {
        &self.errors
    }

    // ----- declarations -----

    /// A read-only global buffer of `elem` in vectors of `vector_width` (1, 2, 4, 8 or 16).
    pub fn input(&mut self, name: &str, elem: ElemType, vector_width: u8) -> Buffer {
        self.buffer(name, elem, vector_width, Access::ReadOnly)
    }

    /// A read-write global buffer of `elem` in vectors of `vector_width`.
    pub fn output(&mut self, name: &str, elem: ElemType, vector_width: u8) -> Buffer {
        self.buffer(name, elem, vector_width, Access::ReadWrite)
    }

    /// A global buffer with an explicit access mode.
    pub fn buffer(
        &mut self,
        name: &str,
        elem: ElemType,
        vector_width: u8,
        access: Access,
    ) -> Buffer {
        self.check_width(name, vector_width);
        self.check_unique(name);
        let index = self.def.buffers.len() as u32;
        self.def.buffers.push(BufferDecl {
            name: name.to_owned(),
            elem,
            vector_width,
            access,
        });
        Buffer {
            builder: self.tag,
            index,
        }
    }

    /// A scalar parameter.
    pub fn scalar(&mut self, name: &str, elem: ElemType) -> Value {
        self.check_unique(name);
        let index = self.def.scalars.len() as u32;
        self.def.scalars.push(ScalarDecl {
            name: name.to_owned(),
            elem,
        });
        self.define(Item::scalar(elem), Op::Scalar(index), name.to_owned())
    }

    /// An array of `len` entries of `elem` x `width` in shared memory, one per cube.
    pub fn shared(&mut self, name: &str, elem: ElemType, width: u8, len: u32) -> SharedArray {
        self.check_width(name, width);
        self.check_unique(name);
        let index = self.def.shared.len() as u32;
        self.def.shared.push(SharedDecl {
            name: name.to_owned(),
            item: Item::new(elem, width),
            len,
        });
        SharedArray {
            builder: self.tag,
            index,
        }
    }

    /// An array of `len` entries of `elem` x `width` private to each unit.
    pub fn local_array(&mut self, name: &str, elem: ElemType, width: u8, len: u32) -> LocalArray {
        self.check_width(name, width);
        self.check_unique(name);
        let index = self.def.locals.len() as u32;
        self.def.locals.push(LocalArrayDecl {
            name: name.to_owned(),
            item: Item::new(elem, width),
            len,
        });
        LocalArray {
            builder: self.tag,
            index,
        }
    }

    // ----- values -----

    /// A constant.
    pub fn lit(&mut self, value: ScalarValue) -> Value {
        self.define(
            Item::scalar(value.elem_type()),
            Op::Literal(value),
            format!("{value:?}"),
        )
    }

    /// An `f32` constant.
    pub fn lit_f32(&mut self, v: f32) -> Value {
        self.lit(ScalarValue::F32(v))
    }

    /// An `f64` constant.
    pub fn lit_f64(&mut self, v: f64) -> Value {
        self.lit(ScalarValue::F64(v))
    }

    /// An `i32` constant.
    pub fn lit_i32(&mut self, v: i32) -> Value {
        self.lit(ScalarValue::I32(v))
    }

    /// A `u32` constant.
    pub fn lit_u32(&mut self, v: u32) -> Value {
        self.lit(ScalarValue::U32(v))
    }

    /// An `i64` constant.
    pub fn lit_i64(&mut self, v: i64) -> Value {
        self.lit(ScalarValue::I64(v))
    }

    /// A `u64` constant.
    pub fn lit_u64(&mut self, v: u64) -> Value {
        self.lit(ScalarValue::U64(v))
    }

    /// A `bool` constant.
    pub fn lit_bool(&mut self, v: bool) -> Value {
        self.lit(ScalarValue::Bool(v))
    }

    /// A builtin (`u32`).
    pub fn builtin(&mut self, builtin: Builtin) -> Value {
        self.define(
            Item::scalar(ElemType::U32),
            Op::Builtin(builtin),
            builtin.name().to_owned(),
        )
    }
}

macro_rules! builtin_methods {
    ($($method:ident => $b:ident),* $(,)?) => {
        impl KernelBuilder {
            $(
                #[doc = concat!("The builtin `", stringify!($method), "` (`u32`), see [`Builtin::", stringify!($b), "`].")]
                pub fn $method(&mut self) -> Value {
                    self.builtin(Builtin::$b)
                }
            )*
        }
    };
}

builtin_methods!(
    absolute_pos => AbsolutePos, absolute_pos_x => AbsolutePosX, absolute_pos_y => AbsolutePosY,
    absolute_pos_z => AbsolutePosZ, unit_pos => UnitPos, unit_pos_x => UnitPosX,
    unit_pos_y => UnitPosY, unit_pos_z => UnitPosZ, cube_pos => CubePos, cube_pos_x => CubePosX,
    cube_pos_y => CubePosY, cube_pos_z => CubePosZ, cube_dim => CubeDim, cube_dim_x => CubeDimX,
    cube_dim_y => CubeDimY, cube_dim_z => CubeDimZ, cube_count => CubeCount,
    cube_count_x => CubeCountX, cube_count_y => CubeCountY, cube_count_z => CubeCountZ,
    plane_size => PlaneSize, unit_pos_plane => UnitPosPlane,
);

macro_rules! unary_methods {
    ($($method:ident => $op:ident),* $(,)?) => {
        impl KernelBuilder {
            $(
                #[doc = concat!("`", stringify!($method), "(x)`, per component, see [`UnaryOp::", stringify!($op), "`].")]
                pub fn $method(&mut self, x: impl IntoValue) -> Value {
                    self.unary(UnaryOp::$op, x)
                }
            )*
        }
    };
}

unary_methods!(
    neg => Neg, abs => Abs, not => Not, bit_not => BitNot, sqrt => Sqrt, rsqrt => Rsqrt,
    exp => Exp, log => Log, log1p => Log1p, sin => Sin, cos => Cos, tanh => Tanh, erf => Erf,
    floor => Floor, ceil => Ceil, round => Round, recip => Recip,
);

macro_rules! binary_methods {
    ($($method:ident => $op:ident),* $(,)?) => {
        impl KernelBuilder {
            $(
                #[doc = concat!("`", stringify!($method), "(a, b)`, per component, see [`BinaryOp::", stringify!($op), "`]. A scalar operand is splatted to the other's width.")]
                pub fn $method(&mut self, a: impl IntoValue, b: impl IntoValue) -> Value {
                    self.binary(BinaryOp::$op, a, b)
                }
            )*
        }
    };
}

binary_methods!(
    add => Add, sub => Sub, mul => Mul, div => Div, rem => Rem, min => Min, max => Max,
    pow => Pow, and => And, or => Or, bit_and => BitAnd, bit_or => BitOr, bit_xor => BitXor,
    shl => Shl, shr => Shr,
);

macro_rules! compare_methods {
    ($($method:ident => $op:ident),* $(,)?) => {
        impl KernelBuilder {
            $(
                #[doc = concat!("`a ", stringify!($method), " b`, per component: a bool of the operands' width.")]
                pub fn $method(&mut self, a: impl IntoValue, b: impl IntoValue) -> Value {
                    self.compare(CmpOp::$op, a, b)
                }
            )*
        }
    };
}

compare_methods!(eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge);

macro_rules! atomic_methods {
    ($($method:ident => $op:ident),* $(,)?) => {
        impl KernelBuilder {
            $(
                #[doc = concat!("Atomic `", stringify!($op), "` on entry `index` of global or shared memory; returns the previous value.")]
                pub fn $method(&mut self, mem: impl Memory, index: impl IntoValue, value: impl IntoValue) -> Value {
                    self.atomic(AtomicOp::$op, mem, index, value, None)
                }
            )*
        }
    };
}

atomic_methods!(
    atomic_add => Add, atomic_sub => Sub, atomic_min => Min, atomic_max => Max,
    atomic_exchange => Exchange, atomic_and => And, atomic_or => Or, atomic_xor => Xor,
);

macro_rules! plane_methods {
    ($($method:ident => $op:ident),* $(,)?) => {
        impl KernelBuilder {
            $(
                #[doc = concat!("`", stringify!($method), "` over the active units of the plane; every unit gets the result.")]
                pub fn $method(&mut self, x: impl IntoValue) -> Value {
                    self.plane(PlaneOp::$op, x)
                }
            )*
        }
    };
}

plane_methods!(
    plane_sum => Sum, plane_prod => Prod, plane_min => Min, plane_max => Max,
    plane_all => All, plane_any => Any,
);

impl KernelBuilder {
    // ----- memory -----

    /// Load entry `index` (an integer scalar) of a buffer, shared array or local array.
    pub fn load(&mut self, mem: impl Memory, index: impl IntoValue) -> Value {
        let op = "load";
        let index = index.into_value(self);
        let (item, mem) = match self.memory(op, mem) {
            Some(m) => m,
            None => return self.poison(Item::scalar(ElemType::U32)),
        };
        if !self.use_value(op, index) || !self.check_index(op, index) {
            return self.poison(item);
        }
        let name = format!("{}[{}]", self.mem_name(mem), self.name_of(index));
        self.define(
            item,
            Op::Load {
                mem,
                index: index.id(),
            },
            name,
        )
    }

    /// Store `value` to entry `index` of a read-write buffer, shared array or local array.
    pub fn store(&mut self, mem: impl Memory, index: impl IntoValue, value: impl IntoValue) {
        let op = "store";
        let index = index.into_value(self);
        let value = value.into_value(self);
        let Some((item, mem)) = self.memory(op, mem) else {
            return;
        };
        if !self.check_writable(op, mem) {
            return;
        }
        if !self.use_value(op, index) || !self.use_value(op, value) || !self.check_index(op, index)
        {
            return;
        }
        if value.item != item {
            let detail = format!(
                "storing {} (`{}`) into `{}` of {}",
                value.item,
                self.name_of(value),
                self.mem_name(mem),
                item
            );
            self.type_error(op, detail);
            return;
        }
        self.push(Stmt::Store {
            mem,
            index: index.id(),
            value: value.id(),
        });
    }

    /// Length of a buffer in entries of its vector width (`u32`).
    pub fn len(&mut self, buffer: Buffer) -> Value {
        match self.buffer_index("len", buffer) {
            Some(b) => {
                let name = format!("len({})", self.def.buffers[b as usize].name);
                self.define(Item::scalar(ElemType::U32), Op::Len(b), name)
            }
            None => self.poison(Item::scalar(ElemType::U32)),
        }
    }

    /// Rank of the tensor metadata the launch attached to `buffer` (`u32`).
    pub fn rank(&mut self, buffer: Buffer) -> Value {
        match self.buffer_index("rank", buffer) {
            Some(b) => {
                let name = format!("rank({})", self.def.buffers[b as usize].name);
                self.define(Item::scalar(ElemType::U32), Op::Rank(b), name)
            }
            None => self.poison(Item::scalar(ElemType::U32)),
        }
    }

    /// Size of dimension `dim` of `buffer`'s tensor (`u32`).
    pub fn shape(&mut self, buffer: Buffer, dim: impl IntoValue) -> Value {
        self.metadata("shape", buffer, dim)
    }

    /// Stride in elements of dimension `dim` of `buffer`'s tensor (`u32`).
    pub fn stride(&mut self, buffer: Buffer, dim: impl IntoValue) -> Value {
        self.metadata("stride", buffer, dim)
    }

    fn metadata(&mut self, op: &'static str, buffer: Buffer, dim: impl IntoValue) -> Value {
        let dim = dim.into_value(self);
        let u32_item = Item::scalar(ElemType::U32);
        let Some(b) = self.buffer_index(op, buffer) else {
            return self.poison(u32_item);
        };
        if !self.use_value(op, dim) || !self.check_index(op, dim) {
            return self.poison(u32_item);
        }
        let name = format!(
            "{op}({}, {})",
            self.def.buffers[b as usize].name,
            self.name_of(dim)
        );
        let ir = if op == "shape" {
            Op::Shape {
                buffer: b,
                dim: dim.id(),
            }
        } else {
            Op::Stride {
                buffer: b,
                dim: dim.id(),
            }
        };
        self.define(u32_item, ir, name)
    }

    // ----- variables -----

    /// A mutable variable initialised to `init`, visible in the current block.
    pub fn var(&mut self, init: impl IntoValue) -> Var {
        let name = format!("var{}", self.def.vars.len());
        self.var_named(&name, init)
    }

    /// A named mutable variable (the name appears in errors and generated source).
    pub fn var_named(&mut self, name: &str, init: impl IntoValue) -> Var {
        let init = init.into_value(self);
        let id = self.def.vars.len() as u32;
        self.def.vars.push(VarDecl {
            name: name.to_owned(),
            item: init.item,
        });
        self.var_scope.push(self.current_scope());
        let var = Var {
            builder: self.tag,
            id,
            item: init.item,
        };
        if self.use_value("var", init) {
            self.push(Stmt::DeclareVar {
                var: VarId(id),
                init: init.id(),
            });
        }
        var
    }

    /// The current value of a variable.
    pub fn get(&mut self, var: Var) -> Value {
        if !self.use_var("get", var) {
            return self.poison(var.item);
        }
        let name = self.def.vars[var.id as usize].name.clone();
        self.define(var.item, Op::ReadVar(VarId(var.id)), name)
    }

    /// Assign a variable.
    pub fn assign(&mut self, var: Var, value: impl IntoValue) {
        let value = value.into_value(self);
        if !self.use_var("assign", var) || !self.use_value("assign", value) {
            return;
        }
        if value.item != var.item {
            let detail = format!(
                "assigning {} (`{}`) to variable `{}` of {}",
                value.item,
                self.name_of(value),
                self.def.vars[var.id as usize].name,
                var.item
            );
            self.type_error("assign", detail);
            return;
        }
        self.push(Stmt::Assign {
            var: VarId(var.id),
            value: value.id(),
        });
    }

    // ----- arithmetic -----

    /// A unary operation.
    pub fn unary(&mut self, op: UnaryOp, x: impl IntoValue) -> Value {
        let x = x.into_value(self);
        let name = op.name();
        if !self.use_value(name, x) {
            return self.poison(x.item);
        }
        let e = x.item.elem;
        let ok = match op {
            UnaryOp::Neg | UnaryOp::Abs => e.is_signed_int() || e.is_float(),
            UnaryOp::Not => e == ElemType::Bool,
            UnaryOp::BitNot => e.is_int(),
            _ => e.is_float(),
        };
        if !ok {
            return self.elem_error(name, x);
        }
        let desc = format!("{name}({})", self.name_of(x));
        self.define(x.item, Op::Unary(op, x.id()), desc)
    }

    /// A binary operation; a scalar operand is splatted to the other operand's width.
    pub fn binary(&mut self, op: BinaryOp, a: impl IntoValue, b: impl IntoValue) -> Value {
        let name = op.name();
        let a = a.into_value(self);
        let b = b.into_value(self);
        let Some([a, b]) = self.same_items(name, [a, b]) else {
            return self.poison(a.item);
        };
        let e = a.item.elem;
        let ok = match op {
            BinaryOp::And | BinaryOp::Or => e == ElemType::Bool,
            BinaryOp::BitAnd
            | BinaryOp::BitOr
            | BinaryOp::BitXor
            | BinaryOp::Shl
            | BinaryOp::Shr => e.is_int(),
            BinaryOp::Pow => e.is_float(),
            _ => e != ElemType::Bool,
        };
        if !ok {
            return self.elem_error(name, a);
        }
        let desc = format!("{name}({}, {})", self.name_of(a), self.name_of(b));
        self.define(a.item, Op::Binary(op, a.id(), b.id()), desc)
    }

    /// A comparison: a bool of the operands' width.
    pub fn compare(&mut self, op: CmpOp, a: impl IntoValue, b: impl IntoValue) -> Value {
        let name = op.name();
        let a = a.into_value(self);
        let b = b.into_value(self);
        let out = a.item.with_elem(ElemType::Bool);
        let Some([a, b]) = self.same_items(name, [a, b]) else {
            return self.poison(out);
        };
        let desc = format!("{name}({}, {})", self.name_of(a), self.name_of(b));
        self.define(
            a.item.with_elem(ElemType::Bool),
            Op::Compare(op, a.id(), b.id()),
            desc,
        )
    }

    /// `a * b + c` (floats), fused.
    pub fn fma(&mut self, a: impl IntoValue, b: impl IntoValue, c: impl IntoValue) -> Value {
        let a = a.into_value(self);
        let b = b.into_value(self);
        let c = c.into_value(self);
        let Some([a, b, c]) = self.same_items("fma", [a, b, c]) else {
            return self.poison(a.item);
        };
        if !a.item.elem.is_float() {
            return self.elem_error("fma", a);
        }
        let desc = format!(
            "fma({}, {}, {})",
            self.name_of(a),
            self.name_of(b),
            self.name_of(c)
        );
        self.define(a.item, Op::Fma(a.id(), b.id(), c.id()), desc)
    }

    /// `min(max(x, lo), hi)`.
    pub fn clamp(&mut self, x: impl IntoValue, lo: impl IntoValue, hi: impl IntoValue) -> Value {
        let x = x.into_value(self);
        let lo = lo.into_value(self);
        let hi = hi.into_value(self);
        let Some([x, lo, hi]) = self.same_items("clamp", [x, lo, hi]) else {
            return self.poison(x.item);
        };
        if x.item.elem == ElemType::Bool {
            return self.elem_error("clamp", x);
        }
        let desc = format!("clamp({})", self.name_of(x));
        self.define(x.item, Op::Clamp(x.id(), lo.id(), hi.id()), desc)
    }

    /// `cond ? a : b` per component; a scalar `cond` selects whole vectors.
    pub fn select(&mut self, cond: impl IntoValue, a: impl IntoValue, b: impl IntoValue) -> Value {
        let op = "select";
        let cond = cond.into_value(self);
        let a = a.into_value(self);
        let b = b.into_value(self);
        let Some([a, b]) = self.same_items(op, [a, b]) else {
            return self.poison(a.item);
        };
        if !self.use_value(op, cond) {
            return self.poison(a.item);
        }
        if cond.item.elem != ElemType::Bool
            || (cond.item.width != 1 && cond.item.width != a.item.width)
        {
            let detail = format!(
                "the condition `{}` is {}, expected bool or bool x{}",
                self.name_of(cond),
                cond.item,
                a.item.width
            );
            self.type_error(op, detail);
            return self.poison(a.item);
        }
        let cond = if cond.item.width != a.item.width {
            self.splat(cond, a.item.width)
        } else {
            cond
        };
        let desc = format!("select({})", self.name_of(cond));
        self.define(a.item, Op::Select(cond.id(), a.id(), b.id()), desc)
    }

    /// Convert each component to `elem` (see the module docs for the rounding rules).
    pub fn cast(&mut self, x: impl IntoValue, elem: ElemType) -> Value {
        let x = x.into_value(self);
        let out = x.item.with_elem(elem);
        if !self.use_value("cast", x) {
            return self.poison(out);
        }
        let desc = format!("cast({}, {elem})", self.name_of(x));
        self.define(out, Op::Cast(x.id(), elem), desc)
    }

    /// Reinterpret the bits of `x` as components of `elem`; the width follows from the size.
    pub fn bitcast(&mut self, x: impl IntoValue, elem: ElemType) -> Value {
        let x = x.into_value(self);
        let bytes = x.item.size();
        let width = bytes / elem.size();
        let fallback = Item::new(elem, width.clamp(1, 16) as u8);
        if !self.use_value("bitcast", x) {
            return self.poison(fallback);
        }
        if !bytes.is_multiple_of(elem.size())
            || !VECTOR_WIDTHS.contains(&(width as u8))
            || width > 16
        {
            let detail = format!(
                "{} (`{}`) has no {elem} vector of the same size",
                x.item,
                self.name_of(x)
            );
            self.type_error("bitcast", detail);
            return self.poison(fallback);
        }
        let desc = format!("bitcast({}, {elem})", self.name_of(x));
        self.define(fallback, Op::Bitcast(x.id(), elem, width as u8), desc)
    }

    // ----- vectors -----

    /// A vector of `width` copies of the scalar `x`.
    pub fn splat(&mut self, x: impl IntoValue, width: u8) -> Value {
        let x = x.into_value(self);
        let out = x.item.with_elem(x.item.elem);
        let out = Item::new(out.elem, width);
        if !self.use_value("splat", x) {
            return self.poison(out);
        }
        if x.item.width != 1 || !VECTOR_WIDTHS.contains(&width) {
            let detail = format!(
                "cannot splat {} (`{}`) to width {width}",
                x.item,
                self.name_of(x)
            );
            self.type_error("splat", detail);
            return self.poison(out);
        }
        let desc = format!("splat({})", self.name_of(x));
        self.define(out, Op::Splat(x.id(), width), desc)
    }

    /// Component `lane` of the vector `x`.
    pub fn extract(&mut self, x: impl IntoValue, lane: u8) -> Value {
        let x = x.into_value(self);
        let out = Item::scalar(x.item.elem);
        if !self.use_value("extract", x) {
            return self.poison(out);
        }
        if lane >= x.item.width {
            let detail = format!("component {lane} of {} (`{}`)", x.item, self.name_of(x));
            self.type_error("extract", detail);
            return self.poison(out);
        }
        let desc = format!("{}.{lane}", self.name_of(x));
        self.define(out, Op::Extract(x.id(), lane), desc)
    }

    /// The vector `x` with component `lane` replaced by the scalar `value`.
    pub fn insert(&mut self, x: impl IntoValue, lane: u8, value: impl IntoValue) -> Value {
        let x = x.into_value(self);
        let value = value.into_value(self);
        if !self.use_value("insert", x) || !self.use_value("insert", value) {
            return self.poison(x.item);
        }
        if lane >= x.item.width || value.item != Item::scalar(x.item.elem) {
            let detail = format!(
                "inserting {} (`{}`) as component {lane} of {} (`{}`)",
                value.item,
                self.name_of(value),
                x.item,
                self.name_of(x)
            );
            self.type_error("insert", detail);
            return self.poison(x.item);
        }
        let desc = format!("insert({})", self.name_of(x));
        self.define(x.item, Op::Insert(x.id(), lane, value.id()), desc)
    }

    /// A vector of the scalars `parts` (2, 4, 8 or 16 of one element type).
    pub fn vector(&mut self, parts: &[Value]) -> Value {
        let elem = parts.first().map(|p| p.item.elem).unwrap_or(ElemType::U32);
        let out = Item::new(elem, parts.len().clamp(1, 16) as u8);
        for &p in parts {
            if !self.use_value("vector", p) {
                return self.poison(out);
            }
        }
        if !VECTOR_WIDTHS.contains(&(parts.len() as u8))
            || parts.len() > 16
            || parts.iter().any(|p| p.item != Item::scalar(elem))
        {
            let types: Vec<String> = parts.iter().map(|p| p.item.to_string()).collect();
            self.type_error(
                "vector",
                format!("cannot make a vector of [{}]", types.join(", ")),
            );
            return self.poison(out);
        }
        self.define(
            out,
            Op::Vector(parts.iter().map(|p| p.id()).collect()),
            "vector".into(),
        )
    }

    // ----- atomics, barrier, plane -----

    /// Atomic compare-exchange: writes `value` where the entry equals `compare`; returns the
    /// previous value.
    pub fn atomic_compare_exchange(
        &mut self,
        mem: impl Memory,
        index: impl IntoValue,
        compare: impl IntoValue,
        value: impl IntoValue,
    ) -> Value {
        let compare = compare.into_value(self);
        self.atomic(AtomicOp::CompareExchange, mem, index, value, Some(compare))
    }

    /// Atomic load of entry `index`.
    pub fn atomic_load(&mut self, mem: impl Memory, index: impl IntoValue) -> Value {
        let (_, m) = mem.mem_ref();
        let zero = match self.mem_item(m) {
            Some(item) => zero_of(item.elem),
            None => ScalarValue::U32(0),
        };
        let zero = self.lit(zero);
        self.atomic(AtomicOp::Load, mem, index, zero, None)
    }

    /// Atomic store to entry `index`.
    pub fn atomic_store(&mut self, mem: impl Memory, index: impl IntoValue, value: impl IntoValue) {
        self.atomic(AtomicOp::Store, mem, index, value, None);
    }

    /// An atomic operation; returns the entry's previous value.
    pub fn atomic(
        &mut self,
        op: AtomicOp,
        mem: impl Memory,
        index: impl IntoValue,
        value: impl IntoValue,
        compare: Option<Value>,
    ) -> Value {
        let name = op.name();
        let index = index.into_value(self);
        let value = value.into_value(self);
        let Some((item, mem)) = self.memory(name, mem) else {
            return self.poison(value.item);
        };
        if matches!(mem, MemRef::Local(_)) {
            self.type_error(
                name,
                format!(
                    "`{}` is a local array, atomics need global or shared memory",
                    self.mem_name(mem)
                ),
            );
            return self.poison(item);
        }
        if op != AtomicOp::Load && !self.check_writable(name, mem) {
            return self.poison(item);
        }
        if !self.use_value(name, index)
            || !self.use_value(name, value)
            || !self.check_index(name, index)
        {
            return self.poison(item);
        }
        if let Some(c) = compare {
            if !self.use_value(name, c) {
                return self.poison(item);
            }
            if c.item != item {
                let detail = format!(
                    "the expected value `{}` is {}, `{}` holds {item}",
                    self.name_of(c),
                    c.item,
                    self.mem_name(mem)
                );
                self.type_error(name, detail);
                return self.poison(item);
            }
        }
        let e = item.elem;
        let int = matches!(
            e,
            ElemType::I32 | ElemType::U32 | ElemType::I64 | ElemType::U64
        );
        let ok = item.width == 1
            && match op {
                AtomicOp::Load | AtomicOp::Store | AtomicOp::Exchange | AtomicOp::Add => {
                    int || e == ElemType::F32
                }
                _ => int,
            };
        if !ok {
            let detail = format!(
                "`{}` holds {item}, not a supported atomic type",
                self.mem_name(mem)
            );
            self.type_error(name, detail);
            return self.poison(item);
        }
        if value.item != item {
            let detail = format!(
                "operand `{}` is {}, `{}` holds {item}",
                self.name_of(value),
                value.item,
                self.mem_name(mem)
            );
            self.type_error(name, detail);
            return self.poison(item);
        }
        let desc = format!("{name}({})", self.mem_name(mem));
        self.define(
            item,
            Op::Atomic {
                op,
                mem,
                index: index.id(),
                value: value.id(),
                compare: compare.map(|c| c.id()),
            },
            desc,
        )
    }

    /// Wait for every unit of the cube; orders shared and global memory accesses.
    pub fn barrier(&mut self) {
        self.push(Stmt::Barrier);
    }

    /// A plane reduction.
    pub fn plane(&mut self, op: PlaneOp, x: impl IntoValue) -> Value {
        let name = op.name();
        let x = x.into_value(self);
        if !self.use_value(name, x) {
            return self.poison(x.item);
        }
        let is_bool = x.item.elem == ElemType::Bool;
        let ok = match op {
            PlaneOp::All | PlaneOp::Any => is_bool,
            _ => !is_bool,
        };
        if !ok {
            return self.elem_error(name, x);
        }
        let desc = format!("{name}({})", self.name_of(x));
        self.define(x.item, Op::Plane(op, x.id()), desc)
    }

    /// The value of `x` at unit `lane` (a `u32`, the same for all units) of the plane.
    pub fn plane_broadcast(&mut self, x: impl IntoValue, lane: impl IntoValue) -> Value {
        self.plane_exchange("plane_broadcast", x, lane)
    }

    /// The value of `x` at unit `lane` (a `u32` per unit) of the plane.
    pub fn plane_shuffle(&mut self, x: impl IntoValue, lane: impl IntoValue) -> Value {
        self.plane_exchange("plane_shuffle", x, lane)
    }

    fn plane_exchange(
        &mut self,
        name: &'static str,
        x: impl IntoValue,
        lane: impl IntoValue,
    ) -> Value {
        let x = x.into_value(self);
        let lane = lane.into_value(self);
        if !self.use_value(name, x) || !self.use_value(name, lane) {
            return self.poison(x.item);
        }
        if lane.item != Item::scalar(ElemType::U32) {
            let detail = format!(
                "the lane `{}` is {}, expected u32",
                self.name_of(lane),
                lane.item
            );
            self.type_error(name, detail);
            return self.poison(x.item);
        }
        let desc = format!("{name}({})", self.name_of(x));
        let op = if name == "plane_broadcast" {
            Op::PlaneBroadcast(x.id(), lane.id())
        } else {
            Op::PlaneShuffle(x.id(), lane.id())
        };
        self.define(x.item, op, desc)
    }

    /// A `u32x4` bitmask of the active units of the plane whose `cond` is true.
    pub fn ballot(&mut self, cond: impl IntoValue) -> Value {
        let cond = cond.into_value(self);
        let out = Item::new(ElemType::U32, 4);
        if !self.use_value("ballot", cond) {
            return self.poison(out);
        }
        if cond.item != Item::scalar(ElemType::Bool) {
            return self.elem_error("ballot", cond);
        }
        let desc = format!("ballot({})", self.name_of(cond));
        self.define(out, Op::Ballot(cond.id()), desc)
    }

    // ----- control flow -----

    /// Run `then` where `cond` (a bool scalar) is true.
    pub fn if_(&mut self, cond: impl IntoValue, then: impl FnOnce(&mut Self)) {
        self.if_else(cond, then, |_| {});
    }

    /// Run `then` where `cond` is true and `otherwise` where it is false.
    pub fn if_else(
        &mut self,
        cond: impl IntoValue,
        then: impl FnOnce(&mut Self),
        otherwise: impl FnOnce(&mut Self),
    ) {
        let cond = cond.into_value(self);
        let open = self.begin_if(cond);
        then(self);
        let open = self.begin_else(open);
        otherwise(self);
        self.end_if(open);
    }

    /// `for i in (start..end).step_by(step)` on integer scalars of one type; `body` gets `i`.
    /// A negative step counts down while `i > end`.
    pub fn range(
        &mut self,
        start: impl IntoValue,
        end: impl IntoValue,
        step: impl IntoValue,
        body: impl FnOnce(&mut Self, Value),
    ) {
        let start = start.into_value(self);
        let end = end.into_value(self);
        let step = step.into_value(self);
        let open = self.begin_range(start, end, step);
        body(self, open.var);
        self.end_range(open);
    }

    /// A loop that runs until [`break_`](Self::break_) or [`return_`](Self::return_).
    pub fn loop_(&mut self, body: impl FnOnce(&mut Self)) {
        self.begin_loop();
        body(self);
        self.end_loop();
    }

    // ----- blocks opened and closed explicitly (the `#[kernel]` expansion uses these) -----

    /// Open the `then` block of an `if` on `cond`.
    pub(super) fn begin_if(&mut self, cond: Value) -> OpenIf {
        let ok = self.use_value("if", cond) && self.check_condition("if", cond);
        self.open();
        OpenIf {
            cond,
            ok,
            then: None,
        }
    }

    /// Close the `then` block and open the `otherwise` block.
    pub(super) fn begin_else(&mut self, mut open: OpenIf) -> OpenIf {
        open.then = Some(self.close());
        self.open();
        open
    }

    /// Close the `otherwise` block and append the `if`.
    pub(super) fn end_if(&mut self, open: OpenIf) {
        let otherwise = self.close();
        if open.ok {
            self.push(Stmt::If {
                cond: open.cond.id(),
                then: open.then.unwrap_or_default(),
                otherwise,
            });
        }
    }

    /// Open the body of a range loop; the counter is `var` of the result.
    pub(super) fn begin_range(&mut self, start: Value, end: Value, step: Value) -> OpenRange {
        let op = "range";
        let mut ok = [start, end, step].iter().all(|&v| self.use_value(op, v));
        if ok
            && (start.item.width != 1
                || !start.item.elem.is_int()
                || end.item != start.item
                || step.item != start.item)
        {
            let detail = format!(
                "start, end and step must be integer scalars of one type, got {} (`{}`), {} (`{}`), {} (`{}`)",
                start.item,
                self.name_of(start),
                end.item,
                self.name_of(end),
                step.item,
                self.name_of(step)
            );
            self.type_error(op, detail);
            ok = false;
        }
        self.open();
        let var = self.new_value(start.item, "i".to_owned());
        self.loop_depth += 1;
        OpenRange {
            var,
            start,
            end,
            step,
            ok,
        }
    }

    /// Close the body of a range loop and append the loop.
    pub(super) fn end_range(&mut self, open: OpenRange) {
        self.loop_depth -= 1;
        let body = self.close();
        if open.ok {
            self.push(Stmt::Range {
                var: open.var.id(),
                start: open.start.id(),
                end: open.end.id(),
                step: open.step.id(),
                body,
            });
        }
    }

    /// Open the body of a `loop`.
    pub(super) fn begin_loop(&mut self) {
        self.loop_depth += 1;
        self.open();
    }

    /// Close the body of a `loop` and append it.
    pub(super) fn end_loop(&mut self) {
        let body = self.close();
        self.loop_depth -= 1;
        self.push(Stmt::Loop { body });
    }

    /// The item of a memory's entries, `None` (with the error recorded) for a foreign handle.
    pub(super) fn memory_item(&mut self, op: &str, mem: impl Memory) -> Option<Item> {
        self.memory(op, mem).map(|(item, _)| item)
    }

    /// Record a mistake that `build` will return.
    pub(super) fn record_type_error(&mut self, op: &str, detail: String) {
        self.type_error(op, detail);
    }

    /// Leave the innermost loop.
    pub fn break_(&mut self) {
        if self.loop_depth == 0 {
            self.not_in_loop("break");
        }
        self.push(Stmt::Break);
    }

    /// Skip to the next iteration of the innermost loop.
    pub fn continue_(&mut self) {
        if self.loop_depth == 0 {
            self.not_in_loop("continue");
        }
        self.push(Stmt::Continue);
    }

    /// Stop the unit.
    pub fn return_(&mut self) {
        self.push(Stmt::Return);
    }

    // ----- internals -----

    fn push(&mut self, stmt: Stmt) {
        if let Some(block) = self.blocks.last_mut() {
            block.push(stmt);
        }
    }

    fn current_scope(&self) -> u32 {
        self.scopes.last().copied().unwrap_or(0)
    }

    fn open(&mut self) {
        self.blocks.push(Vec::new());
        self.scopes.push(self.next_scope);
        self.next_scope += 1;
    }

    fn close(&mut self) -> Block {
        self.scopes.pop();
        Block {
            stmts: self.blocks.pop().unwrap_or_default(),
        }
    }

    fn new_value(&mut self, item: Item, name: String) -> Value {
        let id = self.def.values.len() as u32;
        self.def.values.push(item);
        self.value_scope.push(self.current_scope());
        self.value_names.push(name);
        Value {
            builder: self.tag,
            id,
            item,
        }
    }

    fn define(&mut self, item: Item, op: Op, name: String) -> Value {
        let v = self.new_value(item, name);
        self.push(Stmt::Let { out: v.id(), op });
        v
    }

    /// A value for an operation that failed validation; `build` returns the recorded error.
    fn poison(&mut self, item: Item) -> Value {
        self.new_value(item, "<invalid>".to_owned())
    }

    fn name_of(&self, v: Value) -> String {
        match self.value_names.get(v.id as usize) {
            Some(n) if n.len() <= 40 => n.clone(),
            Some(_) => format!("%{}", v.id),
            None => format!("%{}", v.id),
        }
    }

    fn kernel(&self) -> String {
        self.def.name.clone()
    }

    fn type_error(&mut self, op: &str, detail: String) {
        self.errors.push(BuildError::Type {
            kernel: self.kernel(),
            op: op.to_owned(),
            detail,
        });
    }

    fn elem_error(&mut self, op: &str, x: Value) -> Value {
        let detail = format!(
            "`{}` is {}, which `{op}` does not take",
            self.name_of(x),
            x.item
        );
        self.type_error(op, detail);
        self.poison(x.item)
    }

    fn declaration_error(&mut self, name: &str, detail: String) {
        self.errors.push(BuildError::Declaration {
            kernel: self.kernel(),
            name: name.to_owned(),
            detail,
        });
    }

    fn not_in_loop(&mut self, op: &str) {
        self.errors.push(BuildError::NotInLoop {
            kernel: self.kernel(),
            op: op.to_owned(),
        });
    }

    fn check_width(&mut self, name: &str, width: u8) {
        if !VECTOR_WIDTHS.contains(&width) {
            self.declaration_error(
                name,
                format!("vector width {width} is not 1, 2, 4, 8 or 16"),
            );
        }
    }

    fn check_unique(&mut self, name: &str) {
        let taken = self.def.buffers.iter().any(|b| b.name == name)
            || self.def.scalars.iter().any(|s| s.name == name)
            || self.def.shared.iter().any(|s| s.name == name)
            || self.def.locals.iter().any(|s| s.name == name);
        if taken {
            self.declaration_error(name, "the name is already declared".to_owned());
        }
    }

    fn use_value(&mut self, op: &str, v: Value) -> bool {
        if v.builder != self.tag || v.id as usize >= self.def.values.len() {
            self.errors.push(BuildError::Unknown {
                kernel: self.kernel(),
                op: op.to_owned(),
                what: "value",
                name: format!("%{}", v.id),
            });
            return false;
        }
        if !self.scopes.contains(&self.value_scope[v.id as usize]) {
            self.errors.push(BuildError::OutOfScope {
                kernel: self.kernel(),
                op: op.to_owned(),
                name: self.name_of(v),
            });
            return false;
        }
        true
    }

    fn use_var(&mut self, op: &str, var: Var) -> bool {
        if var.builder != self.tag || var.id as usize >= self.def.vars.len() {
            self.errors.push(BuildError::Unknown {
                kernel: self.kernel(),
                op: op.to_owned(),
                what: "variable",
                name: format!("var{}", var.id),
            });
            return false;
        }
        if !self.scopes.contains(&self.var_scope[var.id as usize]) {
            self.errors.push(BuildError::OutOfScope {
                kernel: self.kernel(),
                op: op.to_owned(),
                name: self.def.vars[var.id as usize].name.clone(),
            });
            return false;
        }
        true
    }

    fn check_index(&mut self, op: &str, index: Value) -> bool {
        if index.item.width != 1 || !index.item.elem.is_int() {
            let detail = format!(
                "the index `{}` is {}, expected an integer scalar",
                self.name_of(index),
                index.item
            );
            self.type_error(op, detail);
            return false;
        }
        true
    }

    fn check_condition(&mut self, op: &str, cond: Value) -> bool {
        if cond.item != Item::scalar(ElemType::Bool) {
            let detail = format!(
                "the condition `{}` is {}, expected bool",
                self.name_of(cond),
                cond.item
            );
            self.type_error(op, detail);
            return false;
        }
        true
    }

    /// Validate operands that must share one item, splatting scalars to the widest width.
    fn same_items<const N: usize>(&mut self, op: &str, vals: [Value; N]) -> Option<[Value; N]> {
        for &v in &vals {
            if !self.use_value(op, v) {
                return None;
            }
        }
        let width = vals.iter().map(|v| v.item.width).max().unwrap_or(1);
        let elem = vals[0].item.elem;
        if let Some(bad) = vals
            .iter()
            .find(|v| v.item.elem != elem || (v.item.width != width && v.item.width != 1))
        {
            let detail = format!(
                "operand types differ: {} (`{}`) and {} (`{}`)",
                vals[0].item,
                self.name_of(vals[0]),
                bad.item,
                self.name_of(*bad)
            );
            self.type_error(op, detail);
            return None;
        }
        let mut out = vals;
        for v in &mut out {
            if v.item.width != width {
                *v = self.splat(*v, width);
            }
        }
        Some(out)
    }

    fn memory(&mut self, op: &str, mem: impl Memory) -> Option<(Item, MemRef)> {
        let (tag, m) = mem.mem_ref();
        let item = if tag == self.tag {
            self.mem_item(m)
        } else {
            None
        };
        if item.is_none() {
            let (what, index) = match m {
                MemRef::Global(i) => ("buffer", i),
                MemRef::Shared(i) => ("shared array", i),
                MemRef::Local(i) => ("local array", i),
            };
            self.errors.push(BuildError::Unknown {
                kernel: self.kernel(),
                op: op.to_owned(),
                what,
                name: format!("#{index}"),
            });
        }
        item.map(|i| (i, m))
    }

    fn mem_item(&self, m: MemRef) -> Option<Item> {
        match m {
            MemRef::Global(i) => self.def.buffers.get(i as usize).map(|b| b.item()),
            MemRef::Shared(i) => self.def.shared.get(i as usize).map(|s| s.item),
            MemRef::Local(i) => self.def.locals.get(i as usize).map(|s| s.item),
        }
    }

    fn mem_name(&self, m: MemRef) -> String {
        let name = match m {
            MemRef::Global(i) => self.def.buffers.get(i as usize).map(|b| &b.name),
            MemRef::Shared(i) => self.def.shared.get(i as usize).map(|s| &s.name),
            MemRef::Local(i) => self.def.locals.get(i as usize).map(|s| &s.name),
        };
        name.cloned().unwrap_or_default()
    }

    fn check_writable(&mut self, op: &str, m: MemRef) -> bool {
        if let MemRef::Global(i) = m {
            let decl = &self.def.buffers[i as usize];
            if decl.access == Access::ReadOnly {
                let buffer = decl.name.clone();
                self.errors.push(BuildError::ReadOnly {
                    kernel: self.kernel(),
                    op: op.to_owned(),
                    buffer,
                });
                return false;
            }
        }
        true
    }

    fn buffer_index(&mut self, op: &str, buffer: Buffer) -> Option<u32> {
        self.memory(op, buffer).map(|_| buffer.index)
    }
}

fn zero_of(elem: ElemType) -> ScalarValue {
    match elem {
        ElemType::I32 => ScalarValue::I32(0),
        ElemType::I64 => ScalarValue::I64(0),
        ElemType::U64 => ScalarValue::U64(0),
        ElemType::F32 => ScalarValue::F32(0.0),
        _ => ScalarValue::U32(0),
    }
}
