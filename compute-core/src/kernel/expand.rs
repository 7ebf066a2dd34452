//! What the [`#[kernel]`](super::kernel) expansion calls: a [`KernelBuilder`] that takes operands
//! which may be known at build time ([`Expr`]), folds operations on them the way Rust code around
//! a builder would, and types untyped literals from the other operand.
//!
//! Not an API to write kernels with by hand (use [`KernelBuilder`]); public only because the
//! expansion lives in the user's crate.
//!
//! Size: one method per operation the `#[kernel]` expansion can call, with the constant
//! folding of each next to it.

use std::any::TypeId;
use std::sync::{Mutex, OnceLock};

use super::builder::{
    Buffer, KernelBuilder, LocalArray, Memory, OpenIf, OpenRange, SharedArray, Var,
};
use super::definition::KernelDefinition;
use super::error::BuildError;
use super::ir::{AtomicOp, BinaryOp, CmpOp, PlaneOp, UnaryOp};
use super::scalar::ScalarValue;
use super::types::{Builtin, Item};
use super::{KernelElem, Value};
use crate::elem::ElemType;
use crate::handle::{BufferArgument, CubeCount, KernelArguments};
use crate::{ComputeClient, Runtime};

/// An operand of the expansion: a kernel value, a typed constant known at build time, or a Rust
/// literal without a suffix, typed by the operation that uses it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expr {
    /// A value of the kernel.
    Value(Value),
    /// A typed constant (a `const`, a const generic, a suffixed literal, a folded operation).
    Const(ScalarValue),
    /// An integer literal without a suffix.
    Int(i128),
    /// A float literal without a suffix.
    Float(f64),
}

impl Expr {
    /// A typed constant from a Rust value (consts, const generics, suffixed literals).
    pub fn constant(value: impl ConstOperand) -> Expr {
        value.into_expr()
    }
}

/// Rust values usable as build-time constants in a kernel body.
pub trait ConstOperand {
    /// The constant.
    fn into_expr(self) -> Expr;
}

impl<T: KernelElem> ConstOperand for T {
    fn into_expr(self) -> Expr {
        Expr::Const(self.scalar())
    }
}

/// A `usize` constant is an untyped integer: it takes the type of the other operand.
impl ConstOperand for usize {
    fn into_expr(self) -> Expr {
        Expr::Int(self as i128)
    }
}

impl ConstOperand for Expr {
    fn into_expr(self) -> Expr {
        self
    }
}

/// A build-time length or width argument (`u32`, `usize`, `u8`, `i32` constants).
pub trait ConstCount: Copy {
    /// The count, or `None` when it is negative or does not fit `u32`.
    fn count(self) -> Option<u32>;
}

macro_rules! const_count {
    ($($t:ty),*) => {$(impl ConstCount for $t {
        fn count(self) -> Option<u32> {
            u32::try_from(self).ok()
        }
    })*};
}

const_count!(u8, u16, u32, u64, usize, i32, i64);

/// A build-time `Expr` (a `#[comptime]` parameter, a folded constant) as a count.
impl ConstCount for Expr {
    fn count(self) -> Option<u32> {
        match self {
            Expr::Int(i) => u32::try_from(i).ok(),
            Expr::Const(c) => match Num::of(c) {
                Num::Int(i, _) => u32::try_from(i).ok(),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A kernel's cube dimension: `[x, y, z]` or a single `x`.
pub trait CubeDimArg {
    /// `[x, y, z]`.
    fn dims(self) -> [u32; 3];
}

impl CubeDimArg for u32 {
    fn dims(self) -> [u32; 3] {
        [self, 1, 1]
    }
}

/// An unsuffixed literal (`cube_dim = 64`); a negative one is a zero axis, which `build` reports.
impl CubeDimArg for i32 {
    fn dims(self) -> [u32; 3] {
        [u32::try_from(self).unwrap_or(0), 1, 1]
    }
}

/// Unsuffixed literals (`cube_dim = [16, 16, 1]`).
impl CubeDimArg for [i32; 3] {
    fn dims(self) -> [u32; 3] {
        self.map(|d| u32::try_from(d).unwrap_or(0))
    }
}

impl CubeDimArg for [u32; 3] {
    fn dims(self) -> [u32; 3] {
        self
    }
}

/// The key of a generic kernel's definition cache: its type parameters and its constant ones.
pub type CacheKey = (Vec<TypeId>, Vec<i128>);

/// The definitions of one `#[kernel]` function, one per set of build-time parameters.
///
/// Each definition is built once and kept for the life of the process (leaked: a kernel is code,
/// and a process uses a bounded set of instantiations).
#[derive(Debug, Default)]
pub struct DefinitionCache {
    single: OnceLock<&'static KernelDefinition>,
    generic: Mutex<Vec<(CacheKey, &'static KernelDefinition)>>,
}

impl DefinitionCache {
    /// An empty cache.
    pub const fn new() -> Self {
        Self {
            single: OnceLock::new(),
            generic: Mutex::new(Vec::new()),
        }
    }

    /// The definition of a kernel without build-time parameters.
    ///
    /// # Panics
    /// When the kernel does not validate, with the build error: the kernel's source is wrong.
    pub fn get(
        &self,
        build: impl FnOnce() -> Result<KernelDefinition, BuildError>,
    ) -> &'static KernelDefinition {
        self.single.get_or_init(|| leak(build()))
    }

    /// The definition for one set of build-time parameters.
    ///
    /// # Panics
    /// As [`get`](Self::get).
    pub fn get_keyed(
        &self,
        key: CacheKey,
        build: impl FnOnce() -> Result<KernelDefinition, BuildError>,
    ) -> &'static KernelDefinition {
        let mut map = self.generic.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, def)) = map.iter().find(|(k, _)| *k == key) {
            return def;
        }
        let def = leak(build());
        map.push((key, def));
        def
    }
}

fn leak(def: Result<KernelDefinition, BuildError>) -> &'static KernelDefinition {
    match def {
        Ok(def) => Box::leak(Box::new(def)),
        Err(e) => panic!("#[kernel] function does not build: {e}"),
    }
}

/// Launch a `#[kernel]` definition with its arguments in declaration order, bounds-checked.
pub fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    def: &'static KernelDefinition,
    count: CubeCount,
    buffers: Vec<BufferArgument>,
    scalars: Vec<ScalarValue>,
) {
    // The definition is built once (cached) and converted per launch. Once the backends' kernel
    // types are cheap to clone (an `Arc` inside), keep the converted kernel per server instead.
    client.launch(
        def.clone().into(),
        count,
        KernelArguments { buffers, scalars },
    );
}

/// Launch a `#[kernel]` definition without bounds checks.
///
/// # Safety
/// Every index the kernel uses on a global buffer is in bounds for this launch.
pub unsafe fn launch_unchecked<R: Runtime>(
    client: &ComputeClient<R>,
    def: &'static KernelDefinition,
    count: CubeCount,
    buffers: Vec<BufferArgument>,
    scalars: Vec<ScalarValue>,
) {
    let args = KernelArguments { buffers, scalars };
    // SAFETY: the caller guarantees the kernel's global indices are in bounds.
    unsafe { client.launch_unchecked(def.clone().into(), count, args) }
}

/// Whether a loop of the expansion is a kernel loop or one unrolled at build time.
#[derive(Debug)]
enum Frame {
    If(OpenIf),
    Range(OpenRange),
    Loop,
    Short(Var, OpenIf),
}

/// The builder of one `#[kernel]` expansion.
#[derive(Debug)]
pub struct Ctx {
    k: KernelBuilder,
    frames: Vec<Frame>,
}

impl Ctx {
    /// A kernel named `name` with `cube_dim` units per cube.
    pub fn new(name: &str, cube_dim: impl CubeDimArg) -> Self {
        Self {
            k: KernelBuilder::new(name, cube_dim.dims()),
            frames: Vec::new(),
        }
    }

    /// The kernel, validated.
    pub fn build(self) -> Result<KernelDefinition, BuildError> {
        debug_assert!(self.frames.is_empty(), "unbalanced blocks in the expansion");
        self.k.build()
    }

    fn error(&mut self, op: &str, detail: String) {
        self.k.record_type_error(op, detail);
    }

    fn width(&mut self, name: &str, width: impl ConstCount) -> u8 {
        match width.count() {
            Some(w) if w <= 16 => w as u8,
            _ => {
                self.error(name, "vector width out of range".into());
                1
            }
        }
    }

    fn count(&mut self, name: &str, len: impl ConstCount) -> u32 {
        match len.count() {
            Some(n) => n,
            None => {
                self.error(name, "length must be a constant in 0..=u32::MAX".into());
                0
            }
        }
    }

    // ----- declarations -----

    /// A read-only buffer parameter.
    pub fn input(&mut self, name: &str, elem: ElemType, width: impl ConstCount) -> Buffer {
        let w = self.width(name, width);
        self.k.input(name, elem, w)
    }

    /// A read-write buffer parameter.
    pub fn output(&mut self, name: &str, elem: ElemType, width: impl ConstCount) -> Buffer {
        let w = self.width(name, width);
        self.k.output(name, elem, w)
    }

    /// A scalar parameter.
    pub fn scalar(&mut self, name: &str, elem: ElemType) -> Expr {
        Expr::Value(self.k.scalar(name, elem))
    }

    /// A shared memory array.
    pub fn shared(
        &mut self,
        name: &str,
        elem: ElemType,
        width: impl ConstCount,
        len: impl ConstCount,
    ) -> SharedArray {
        let w = self.width(name, width);
        let n = self.count(name, len);
        self.k.shared(name, elem, w, n)
    }

    /// A local array.
    pub fn local(
        &mut self,
        name: &str,
        elem: ElemType,
        width: impl ConstCount,
        len: impl ConstCount,
    ) -> LocalArray {
        let w = self.width(name, width);
        let n = self.count(name, len);
        self.k.local_array(name, elem, w, n)
    }

    /// A builtin.
    pub fn builtin(&mut self, b: Builtin) -> Expr {
        Expr::Value(self.k.builtin(b))
    }

    // ----- operands -----

    /// `x` as a kernel value, an untyped literal taking its default type (`u32` for a
    /// non-negative integer, `i32` for a negative one, `f32` for a float).
    pub fn value(&mut self, x: Expr) -> Value {
        match x {
            Expr::Value(v) => v,
            Expr::Const(c) => self.k.lit(c),
            Expr::Int(i) => {
                let c = if i >= 0 && i <= u32::MAX as i128 {
                    ScalarValue::U32(i as u32)
                } else {
                    self.int_const(i, ElemType::I32)
                };
                self.k.lit(c)
            }
            Expr::Float(f) => self.k.lit(ScalarValue::F32(f as f32)),
        }
    }

    /// `x` as a kernel value of `elem` where it is a literal (a typed operand keeps its type).
    pub fn value_as(&mut self, x: Expr, elem: ElemType) -> Value {
        match x {
            Expr::Int(_) | Expr::Float(_) => {
                let c = self.literal_as(x, elem);
                self.k.lit(c)
            }
            _ => self.value(x),
        }
    }

    fn int_const(&mut self, i: i128, elem: ElemType) -> ScalarValue {
        match int_scalar(i, elem) {
            Some(c) => c,
            None => {
                self.error("literal", format!("{i} does not fit {elem}"));
                ScalarValue::U32(0)
            }
        }
    }

    /// The typed constant of a literal for an operand of `elem`.
    fn literal_as(&mut self, x: Expr, elem: ElemType) -> ScalarValue {
        match x {
            Expr::Int(i) if elem.is_float() => float_scalar(i as f64, elem),
            Expr::Int(i) => self.int_const(i, elem),
            Expr::Float(f) if elem.is_float() => float_scalar(f, elem),
            Expr::Float(f) => {
                self.error("literal", format!("float literal {f} used as {elem}"));
                ScalarValue::U32(0)
            }
            Expr::Const(c) => c,
            Expr::Value(_) => unreachable!("literal_as takes literals"),
        }
    }

    /// `x` typed as `elem` (a `let x: T = ...` annotation): literals take the type, other operands
    /// must have it already.
    pub fn typed(&mut self, x: Expr, elem: ElemType) -> Expr {
        let have = match x {
            Expr::Value(v) => v.elem(),
            Expr::Const(c) => c.elem_type(),
            lit => return Expr::Const(self.literal_as(lit, elem)),
        };
        if have != elem {
            self.error(
                "let",
                format!("the value is {have}, annotated {elem} (convert with `as`)"),
            );
        }
        x
    }

    /// The element type an operand set gets: the first typed operand's.
    fn context(xs: &[Expr]) -> Option<ElemType> {
        xs.iter().find_map(|x| match x {
            Expr::Value(v) => Some(v.elem()),
            Expr::Const(c) => Some(c.elem_type()),
            _ => None,
        })
    }

    fn operands<const N: usize>(&mut self, xs: [Expr; N]) -> [Value; N] {
        let elem = Self::context(&xs);
        xs.map(|x| match elem {
            Some(e) => self.value_as(x, e),
            None => self.value(x),
        })
    }

    fn constants(&mut self, a: Expr, b: Expr) -> Option<(Num, Num)> {
        let typed = |c: ScalarValue| Num::of(c);
        match (a, b) {
            (Expr::Value(_), _) | (_, Expr::Value(_)) => None,
            (Expr::Int(x), Expr::Int(y)) => Some((Num::Int(x, None), Num::Int(y, None))),
            (Expr::Int(x), Expr::Float(y)) => {
                Some((Num::Float(x as f64, None), Num::Float(y, None)))
            }
            (Expr::Float(x), Expr::Int(y)) => {
                Some((Num::Float(x, None), Num::Float(y as f64, None)))
            }
            (Expr::Float(x), Expr::Float(y)) => Some((Num::Float(x, None), Num::Float(y, None))),
            (Expr::Const(c), lit @ (Expr::Int(_) | Expr::Float(_))) => {
                let l = self.literal_as(lit, c.elem_type());
                Some((typed(c), typed(l)))
            }
            (lit @ (Expr::Int(_) | Expr::Float(_)), Expr::Const(c)) => {
                let l = self.literal_as(lit, c.elem_type());
                Some((typed(l), typed(c)))
            }
            (Expr::Const(x), Expr::Const(y)) => Some((typed(x), typed(y))),
        }
    }

    // ----- operations -----

    /// `a op b`; `&`, `|`, `^` on bools are the logical operations.
    pub fn binary(&mut self, op: BinaryOp, a: Expr, b: Expr) -> Expr {
        if let Some((x, y)) = self.constants(a, b) {
            match fold_binary(op, x, y) {
                Ok(r) => return r,
                Err(detail) => {
                    self.error(op.name(), detail);
                    return a;
                }
            }
        }
        let [a, b] = self.operands([a, b]);
        let op = match (op, a.elem() == ElemType::Bool) {
            (BinaryOp::BitAnd, true) => BinaryOp::And,
            (BinaryOp::BitOr, true) => BinaryOp::Or,
            (BinaryOp::BitXor, true) => {
                return Expr::Value(self.k.ne(a, b));
            }
            (op, _) => op,
        };
        Expr::Value(self.k.binary(op, a, b))
    }

    /// `a op b` for a comparison.
    pub fn compare(&mut self, op: CmpOp, a: Expr, b: Expr) -> Expr {
        if let Some((x, y)) = self.constants(a, b) {
            match fold_compare(op, x, y) {
                Ok(r) => return Expr::Const(ScalarValue::Bool(r)),
                Err(detail) => {
                    self.error(op.name(), detail);
                    return Expr::Const(ScalarValue::Bool(false));
                }
            }
        }
        let [a, b] = self.operands([a, b]);
        Expr::Value(self.k.compare(op, a, b))
    }

    /// `-x`.
    pub fn neg(&mut self, x: Expr) -> Expr {
        match x {
            Expr::Int(i) => Expr::Int(-i),
            Expr::Float(f) => Expr::Float(-f),
            Expr::Const(c) => match fold_binary(BinaryOp::Sub, zero_like(c), Num::of(c)) {
                Ok(r) => r,
                Err(detail) => {
                    self.error("neg", detail);
                    x
                }
            },
            Expr::Value(v) => Expr::Value(self.k.neg(v)),
        }
    }

    /// `!x`: logical not of a bool, bitwise not of an integer.
    pub fn not(&mut self, x: Expr) -> Expr {
        match x {
            Expr::Const(ScalarValue::Bool(b)) => Expr::Const(ScalarValue::Bool(!b)),
            Expr::Const(c) if c.elem_type().is_int() => {
                let all = Num::Int(-1, None);
                fold_binary(BinaryOp::BitXor, Num::of(c), all).unwrap_or(x)
            }
            Expr::Int(i) => Expr::Int(!i),
            _ => {
                let v = self.value(x);
                Expr::Value(if v.elem() == ElemType::Bool {
                    self.k.not(v)
                } else {
                    self.k.bit_not(v)
                })
            }
        }
    }

    /// A math function of one operand.
    pub fn unary(&mut self, op: UnaryOp, x: Expr) -> Expr {
        let v = self.value(x);
        Expr::Value(self.k.unary(op, v))
    }

    /// `a * b + c`, fused (`a.mul_add(b, c)`).
    pub fn fma(&mut self, a: Expr, b: Expr, c: Expr) -> Expr {
        let [a, b, c] = self.operands([a, b, c]);
        Expr::Value(self.k.fma(a, b, c))
    }

    /// `x.clamp(lo, hi)`.
    pub fn clamp(&mut self, x: Expr, lo: Expr, hi: Expr) -> Expr {
        let [x, lo, hi] = self.operands([x, lo, hi]);
        Expr::Value(self.k.clamp(x, lo, hi))
    }

    /// `select(cond, a, b)`.
    pub fn select(&mut self, cond: Expr, a: Expr, b: Expr) -> Expr {
        let cond = self.value_as(cond, ElemType::Bool);
        let [a, b] = self.operands([a, b]);
        Expr::Value(self.k.select(cond, a, b))
    }

    /// `x as T`; a cast to the operand's own type is the operand.
    pub fn cast(&mut self, x: Expr, elem: ElemType) -> Expr {
        match x {
            Expr::Value(v) if v.elem() == elem => x,
            Expr::Value(v) => Expr::Value(self.k.cast(v, elem)),
            Expr::Int(_) | Expr::Float(_) if elem != ElemType::Bool => {
                let num = match x {
                    Expr::Int(i) => Num::Int(i, None),
                    Expr::Float(f) => Num::Float(f, None),
                    _ => unreachable!(),
                };
                Expr::Const(cast_num(num, elem))
            }
            Expr::Const(c) => Expr::Const(cast_num(Num::of(c), elem)),
            lit => {
                let v = self.value(lit);
                Expr::Value(self.k.cast(v, elem))
            }
        }
    }

    /// `[x; width]`.
    pub fn splat(&mut self, x: Expr, width: impl ConstCount) -> Expr {
        let w = self.width("splat", width);
        let v = self.value(x);
        Expr::Value(self.k.splat(v, w))
    }

    /// `[a, b, ...]`.
    pub fn vector(&mut self, parts: &[Expr]) -> Expr {
        let elem = Self::context(parts);
        let values: Vec<Value> = parts
            .iter()
            .map(|&p| match elem {
                Some(e) => self.value_as(p, e),
                None => self.value(p),
            })
            .collect();
        Expr::Value(self.k.vector(&values))
    }

    fn lane(&mut self, op: &str, lane: Expr) -> u8 {
        let n = match lane {
            Expr::Int(i) => u8::try_from(i).ok(),
            Expr::Const(c) => match Num::of(c) {
                Num::Int(i, _) => u8::try_from(i).ok(),
                _ => None,
            },
            _ => None,
        };
        n.unwrap_or_else(|| {
            self.error(op, "a vector component index must be a constant".into());
            0
        })
    }

    /// `v[lane]` of a vector value.
    pub fn extract(&mut self, v: Expr, lane: Expr) -> Expr {
        let lane = self.lane("extract", lane);
        let v = self.value(v);
        Expr::Value(self.k.extract(v, lane))
    }

    /// `v[lane] = x` of a vector variable.
    pub fn insert(&mut self, var: Var, lane: Expr, x: Expr) {
        let lane = self.lane("insert", lane);
        let v = self.k.get(var);
        let x = self.value_as(x, var.item().elem);
        let v = self.k.insert(v, lane, x);
        self.k.assign(var, v);
    }

    // ----- memory -----

    fn index(&mut self, i: Expr) -> Value {
        self.value_as(i, ElemType::U32)
    }

    fn mem_elem(&mut self, op: &str, mem: impl Memory) -> ElemType {
        self.k
            .memory_item(op, mem)
            .map_or(ElemType::U32, |i: Item| i.elem)
    }

    /// `mem[i]`.
    pub fn load(&mut self, mem: impl Memory, i: Expr) -> Expr {
        let i = self.index(i);
        Expr::Value(self.k.load(mem, i))
    }

    /// `mem[i] = x`.
    pub fn store(&mut self, mem: impl Memory, i: Expr, x: Expr) {
        let i = self.index(i);
        let elem = self.mem_elem("store", mem);
        let x = self.value_as(x, elem);
        self.k.store(mem, i, x);
    }

    /// `buffer.len()`.
    pub fn len(&mut self, b: Buffer) -> Expr {
        Expr::Value(self.k.len(b))
    }

    /// `buffer.rank()`.
    pub fn rank(&mut self, b: Buffer) -> Expr {
        Expr::Value(self.k.rank(b))
    }

    /// `buffer.shape(dim)`.
    pub fn shape(&mut self, b: Buffer, dim: Expr) -> Expr {
        let d = self.index(dim);
        Expr::Value(self.k.shape(b, d))
    }

    /// `buffer.stride(dim)`.
    pub fn stride(&mut self, b: Buffer, dim: Expr) -> Expr {
        let d = self.index(dim);
        Expr::Value(self.k.stride(b, d))
    }

    /// An atomic read-modify-write; the previous value.
    pub fn atomic(&mut self, op: AtomicOp, mem: impl Memory, i: Expr, x: Expr) -> Expr {
        let elem = self.mem_elem(op.name(), mem);
        let i = self.index(i);
        let x = self.value_as(x, elem);
        Expr::Value(self.k.atomic(op, mem, i, x, None))
    }

    /// Atomic load.
    pub fn atomic_load(&mut self, mem: impl Memory, i: Expr) -> Expr {
        let i = self.index(i);
        Expr::Value(self.k.atomic_load(mem, i))
    }

    /// Atomic store.
    pub fn atomic_store(&mut self, mem: impl Memory, i: Expr, x: Expr) {
        let elem = self.mem_elem("atomic_store", mem);
        let i = self.index(i);
        let x = self.value_as(x, elem);
        self.k.atomic_store(mem, i, x);
    }

    /// Atomic compare-exchange; the previous value.
    pub fn atomic_compare_exchange(
        &mut self,
        mem: impl Memory,
        i: Expr,
        cmp: Expr,
        x: Expr,
    ) -> Expr {
        let elem = self.mem_elem("atomic_compare_exchange", mem);
        let i = self.index(i);
        let cmp = self.value_as(cmp, elem);
        let x = self.value_as(x, elem);
        Expr::Value(self.k.atomic_compare_exchange(mem, i, cmp, x))
    }

    // ----- variables -----

    /// `let mut name = init;`
    pub fn var(&mut self, name: &str, init: Expr) -> Var {
        let v = self.value(init);
        self.k.var_named(name, v)
    }

    /// `let mut name: T = init;`
    pub fn var_typed(&mut self, name: &str, init: Expr, elem: ElemType) -> Var {
        let init = self.typed(init, elem);
        let v = self.value(init);
        self.k.var_named(name, v)
    }

    /// The variable's current value.
    pub fn get(&mut self, var: Var) -> Expr {
        Expr::Value(self.k.get(var))
    }

    /// `var = x`.
    pub fn assign(&mut self, var: Var, x: Expr) {
        let v = self.value_as(x, var.item().elem);
        self.k.assign(var, v);
    }

    // ----- plane, barrier -----

    /// A plane reduction.
    pub fn plane(&mut self, op: PlaneOp, x: Expr) -> Expr {
        let v = self.value(x);
        Expr::Value(self.k.plane(op, v))
    }

    /// `plane_broadcast(x, lane)`.
    pub fn plane_broadcast(&mut self, x: Expr, lane: Expr) -> Expr {
        let v = self.value(x);
        let l = self.index(lane);
        Expr::Value(self.k.plane_broadcast(v, l))
    }

    /// `plane_shuffle(x, lane)`.
    pub fn plane_shuffle(&mut self, x: Expr, lane: Expr) -> Expr {
        let v = self.value(x);
        let l = self.index(lane);
        Expr::Value(self.k.plane_shuffle(v, l))
    }

    /// `plane_ballot(cond)`.
    pub fn ballot(&mut self, cond: Expr) -> Expr {
        let c = self.value_as(cond, ElemType::Bool);
        Expr::Value(self.k.ballot(c))
    }

    /// `sync_units()`.
    pub fn barrier(&mut self) {
        self.k.barrier();
    }

    // ----- control flow -----

    /// The value of a condition known at build time (`if`/`while` on constants only).
    pub fn const_bool(&mut self, c: Expr) -> bool {
        match c {
            Expr::Const(ScalarValue::Bool(b)) => b,
            _ => {
                self.error(
                    "if",
                    "a condition on build-time constants is not a constant bool".into(),
                );
                false
            }
        }
    }

    /// Open `if cond {`.
    pub fn begin_if(&mut self, cond: Expr) {
        let c = self.value_as(cond, ElemType::Bool);
        let open = self.k.begin_if(c);
        self.frames.push(Frame::If(open));
    }

    /// `} else {`.
    pub fn begin_else(&mut self) {
        if let Some(Frame::If(open)) = self.frames.pop() {
            let open = self.k.begin_else(open);
            self.frames.push(Frame::If(open));
        } else {
            unreachable!("else without if in the expansion");
        }
    }

    /// Close the `if`.
    pub fn end_if(&mut self) {
        if let Some(Frame::If(open)) = self.frames.pop() {
            self.k.end_if(open);
        } else {
            unreachable!("end of if without if in the expansion");
        }
    }

    /// Open `for i in (start..end).step_by(step) {`; the counter.
    pub fn begin_range(&mut self, start: Expr, end: Expr, step: Expr) -> Expr {
        let [start, end, step] = self.operands([start, end, step]);
        let open = self.k.begin_range(start, end, step);
        self.frames.push(Frame::Range(open));
        Expr::Value(open.var)
    }

    /// Close the range loop.
    pub fn end_range(&mut self) {
        if let Some(Frame::Range(open)) = self.frames.pop() {
            self.k.end_range(open);
        } else {
            unreachable!("end of range without range in the expansion");
        }
    }

    /// Open `loop {`.
    pub fn begin_loop(&mut self) {
        self.k.begin_loop();
        self.frames.push(Frame::Loop);
    }

    /// `if !cond { break }` (the head of a `while`).
    pub fn break_unless(&mut self, cond: Expr) {
        let c = self.value_as(cond, ElemType::Bool);
        let stop = self.k.not(c);
        let open = self.k.begin_if(stop);
        self.k.break_();
        let open = self.k.begin_else(open);
        self.k.end_if(open);
    }

    /// Close the loop.
    pub fn end_loop(&mut self) {
        if let Some(Frame::Loop) = self.frames.pop() {
            self.k.end_loop();
        } else {
            unreachable!("end of loop without loop in the expansion");
        }
    }

    /// `break`.
    pub fn break_(&mut self) {
        self.k.break_();
    }

    /// `continue`.
    pub fn continue_(&mut self) {
        self.k.continue_();
    }

    /// `return`.
    pub fn return_(&mut self) {
        self.k.return_();
    }

    /// The values of a loop unrolled at build time: `(start..end).step_by(step)` on constants.
    pub fn unroll(&mut self, start: Expr, end: Expr, step: Expr) -> Vec<Expr> {
        let elem = Self::context(&[start, end, step]).unwrap_or(ElemType::U32);
        let mut num = |x: Expr| -> Option<i128> {
            let c = match x {
                Expr::Value(_) => None,
                Expr::Const(c) => Some(c),
                lit => Some(self.literal_as(lit, elem)),
            }?;
            match Num::of(c) {
                Num::Int(i, _) => Some(i),
                _ => None,
            }
        };
        let (Some(s), Some(e), Some(st)) = (num(start), num(end), num(step)) else {
            self.error(
                "unroll",
                "an unrolled loop needs integer bounds and step known at build time".into(),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut i = s;
        while (st > 0 && i < e) || (st < 0 && i > e) {
            out.push(Expr::Const(self.int_const(i, elem)));
            i += st;
        }
        out
    }

    /// Open the right side of `l && r` (`and`) or `l || r`: it runs only where it decides.
    pub fn begin_short(&mut self, l: Expr, and: bool) {
        let l = self.value_as(l, ElemType::Bool);
        let name = if and { "and" } else { "or" };
        let result = self.k.var_named(name, l);
        let cond = if and { l } else { self.k.not(l) };
        let open = self.k.begin_if(cond);
        self.frames.push(Frame::Short(result, open));
    }

    /// Close the right side of `&&` / `||`; the result.
    pub fn end_short(&mut self, r: Expr) -> Expr {
        if let Some(Frame::Short(result, open)) = self.frames.pop() {
            self.assign(result, r);
            let open = self.k.begin_else(open);
            self.k.end_if(open);
            Expr::Value(self.k.get(result))
        } else {
            unreachable!("end of && without its start in the expansion");
        }
    }
}

/// A constant, for folding: an integer or a float, with its type (`None`: an untyped literal).
#[derive(Debug, Clone, Copy)]
enum Num {
    Int(i128, Option<ElemType>),
    Float(f64, Option<ElemType>),
    Bool(bool),
}

impl Num {
    fn of(c: ScalarValue) -> Num {
        use ScalarValue as S;
        let e = Some(c.elem_type());
        match c {
            S::Bool(b) => Num::Bool(b),
            S::I8(v) => Num::Int(v.into(), e),
            S::I16(v) => Num::Int(v.into(), e),
            S::I32(v) => Num::Int(v.into(), e),
            S::I64(v) => Num::Int(v.into(), e),
            S::U8(v) => Num::Int(v.into(), e),
            S::U16(v) => Num::Int(v.into(), e),
            S::U32(v) => Num::Int(v.into(), e),
            S::U64(v) => Num::Int(v.into(), e),
            S::F16(v) => Num::Float(v.to_f64(), e),
            S::BF16(v) => Num::Float(v.to_f64(), e),
            S::F32(v) => Num::Float(v.into(), e),
            S::F64(v) => Num::Float(v, e),
        }
    }
}

fn zero_like(c: ScalarValue) -> Num {
    match Num::of(c) {
        Num::Int(_, e) => Num::Int(0, e),
        Num::Float(_, e) => Num::Float(0.0, e),
        Num::Bool(_) => Num::Bool(false),
    }
}

/// An integer constant of `elem`, `None` when it does not fit.
fn int_scalar(i: i128, elem: ElemType) -> Option<ScalarValue> {
    use ScalarValue as S;
    Some(match elem {
        ElemType::I8 => S::I8(i.try_into().ok()?),
        ElemType::I16 => S::I16(i.try_into().ok()?),
        ElemType::I32 => S::I32(i.try_into().ok()?),
        ElemType::I64 => S::I64(i.try_into().ok()?),
        ElemType::U8 => S::U8(i.try_into().ok()?),
        ElemType::U16 => S::U16(i.try_into().ok()?),
        ElemType::U32 => S::U32(i.try_into().ok()?),
        ElemType::U64 => S::U64(i.try_into().ok()?),
        _ => return None,
    })
}

/// A float constant of `elem` (a float type).
fn float_scalar(f: f64, elem: ElemType) -> ScalarValue {
    match elem {
        ElemType::F16 => ScalarValue::F16(half::f16::from_f64(f)),
        ElemType::BF16 => ScalarValue::BF16(half::bf16::from_f64(f)),
        ElemType::F64 => ScalarValue::F64(f),
        _ => ScalarValue::F32(f as f32),
    }
}

/// `i` wrapped to the integer type `elem`, as the IR's integer arithmetic wraps.
fn wrap(i: i128, elem: ElemType) -> ScalarValue {
    let bits = (elem.size() * 8) as u32;
    let masked = i & ((1i128 << bits) - 1);
    let v = if elem.is_signed_int() && masked >> (bits - 1) == 1 {
        masked - (1i128 << bits)
    } else {
        masked
    };
    int_scalar(v, elem).unwrap_or(ScalarValue::U32(0))
}

/// `Rust`'s `as` on a constant (saturating float to integer, NaN to 0, as the IR casts).
fn cast_num(n: Num, elem: ElemType) -> ScalarValue {
    match (n, elem) {
        (Num::Bool(b), ElemType::Bool) => ScalarValue::Bool(b),
        (Num::Bool(b), e) if e.is_float() => float_scalar(b as u8 as f64, e),
        (Num::Bool(b), e) => wrap(b as i128, e),
        (Num::Int(i, _), ElemType::Bool) => ScalarValue::Bool(i != 0),
        (Num::Float(f, _), ElemType::Bool) => ScalarValue::Bool(f != 0.0),
        (Num::Int(i, _), e) if e.is_float() => float_scalar(i as f64, e),
        (Num::Int(i, _), e) => wrap(i, e),
        (Num::Float(f, _), e) if e.is_float() => float_scalar(f, e),
        (Num::Float(f, _), e) => {
            let (lo, hi) = int_bounds(e);
            let i = if f.is_nan() {
                0
            } else {
                (f as i128).clamp(lo, hi)
            };
            wrap(i, e)
        }
    }
}

fn int_bounds(e: ElemType) -> (i128, i128) {
    let bits = (e.size() * 8) as u32;
    if e.is_signed_int() {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

fn same_type(x: Option<ElemType>, y: Option<ElemType>) -> Result<Option<ElemType>, String> {
    match (x, y) {
        (Some(a), Some(b)) if a != b => Err(format!("operand types differ: {a} and {b}")),
        (a, b) => Ok(a.or(b)),
    }
}

/// `x op y` on constants with the IR's semantics (wrapping, `x / 0 == x`, `x % 0 == 0`).
fn fold_binary(op: BinaryOp, x: Num, y: Num) -> Result<Expr, String> {
    use BinaryOp as B;
    match (x, y) {
        (Num::Int(a, ea), Num::Int(b, eb)) => {
            let elem = same_type(ea, eb)?;
            let bits = elem.map_or(128, |e| (e.size() * 8) as u32);
            let r = match op {
                B::Add => a.wrapping_add(b),
                B::Sub => a.wrapping_sub(b),
                B::Mul => a.wrapping_mul(b),
                B::Div if b == 0 => a,
                B::Div => a.wrapping_div(b),
                B::Rem if b == 0 => 0,
                B::Rem => a.wrapping_rem(b),
                B::Min => a.min(b),
                B::Max => a.max(b),
                B::BitAnd => a & b,
                B::BitOr => a | b,
                B::BitXor => a ^ b,
                B::Shl => a.wrapping_shl(b.rem_euclid(bits as i128) as u32),
                B::Shr => {
                    // An unsigned value is non-negative here, so `>>` is the logical shift.
                    a >> b.rem_euclid(bits as i128) as u32
                }
                B::Pow | B::And | B::Or => {
                    return Err(format!("`{}` does not take integers", op.name()));
                }
            };
            Ok(match elem {
                Some(e) => Expr::Const(wrap(r, e)),
                None => Expr::Int(r),
            })
        }
        (Num::Bool(a), Num::Bool(b)) => {
            let r = match op {
                B::And | B::BitAnd => a & b,
                B::Or | B::BitOr => a | b,
                B::BitXor => a ^ b,
                _ => return Err(format!("`{}` does not take bools", op.name())),
            };
            Ok(Expr::Const(ScalarValue::Bool(r)))
        }
        (Num::Float(a, ea), Num::Float(b, eb)) => {
            let elem = same_type(ea, eb)?;
            let single = elem != Some(ElemType::F64) && elem.is_some();
            let r = if single {
                let (a, b) = (a as f32, b as f32);
                f64::from(match op {
                    B::Add => a + b,
                    B::Sub => a - b,
                    B::Mul => a * b,
                    B::Div => a / b,
                    B::Rem => a % b,
                    B::Min => a.min(b),
                    B::Max => a.max(b),
                    B::Pow => a.powf(b),
                    _ => return Err(format!("`{}` does not take floats", op.name())),
                })
            } else {
                match op {
                    B::Add => a + b,
                    B::Sub => a - b,
                    B::Mul => a * b,
                    B::Div => a / b,
                    B::Rem => a % b,
                    B::Min => a.min(b),
                    B::Max => a.max(b),
                    B::Pow => a.powf(b),
                    _ => return Err(format!("`{}` does not take floats", op.name())),
                }
            };
            Ok(match elem {
                Some(e) => Expr::Const(float_scalar(r, e)),
                None => Expr::Float(r),
            })
        }
        (x, y) => Err(format!("operands of different kinds: {x:?} and {y:?}")),
    }
}

/// `x op y` on constants.
fn fold_compare(op: CmpOp, x: Num, y: Num) -> Result<bool, String> {
    use core::cmp::Ordering;
    let ord = match (x, y) {
        (Num::Int(a, ea), Num::Int(b, eb)) => {
            same_type(ea, eb)?;
            Some(a.cmp(&b))
        }
        (Num::Float(a, ea), Num::Float(b, eb)) => {
            same_type(ea, eb)?;
            a.partial_cmp(&b)
        }
        (Num::Bool(a), Num::Bool(b)) => Some(a.cmp(&b)),
        (x, y) => return Err(format!("operands of different kinds: {x:?} and {y:?}")),
    };
    Ok(match (op, ord) {
        (CmpOp::Ne, None) => true,
        (_, None) => false,
        (CmpOp::Eq, Some(o)) => o == Ordering::Equal,
        (CmpOp::Ne, Some(o)) => o != Ordering::Equal,
        (CmpOp::Lt, Some(o)) => o == Ordering::Less,
        (CmpOp::Le, Some(o)) => o != Ordering::Greater,
        (CmpOp::Gt, Some(o)) => o == Ordering::Greater,
        (CmpOp::Ge, Some(o)) => o != Ordering::Less,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_follows_the_ir_semantics() {
        let u = |v: u32| Num::of(ScalarValue::U32(v));
        assert_eq!(
            fold_binary(BinaryOp::Sub, u(0), u(1)).unwrap(),
            Expr::Const(ScalarValue::U32(u32::MAX))
        );
        assert_eq!(
            fold_binary(BinaryOp::Div, u(7), u(0)).unwrap(),
            Expr::Const(ScalarValue::U32(7))
        );
        assert_eq!(
            fold_binary(BinaryOp::Shl, u(1), u(33)).unwrap(),
            Expr::Const(ScalarValue::U32(2))
        );
        let i = |v: i32| Num::of(ScalarValue::I32(v));
        assert_eq!(
            fold_binary(BinaryOp::Div, i(i32::MIN), i(-1)).unwrap(),
            Expr::Const(ScalarValue::I32(i32::MIN))
        );
        assert_eq!(
            fold_binary(BinaryOp::Shr, i(-8), i(1)).unwrap(),
            Expr::Const(ScalarValue::I32(-4))
        );
        assert!(fold_binary(BinaryOp::Add, u(1), i(1)).is_err());
        assert!(fold_compare(CmpOp::Lt, u(1), u(2)).unwrap());
        assert!(
            !fold_compare(
                CmpOp::Eq,
                Num::Float(f64::NAN, None),
                Num::Float(f64::NAN, None)
            )
            .unwrap()
        );
        assert_eq!(
            cast_num(Num::Float(-3.7, None), ElemType::U32),
            ScalarValue::U32(0)
        );
        assert_eq!(
            cast_num(Num::Float(1e20, None), ElemType::I32),
            ScalarValue::I32(i32::MAX)
        );
        assert_eq!(
            cast_num(Num::Int(300, None), ElemType::U8),
            ScalarValue::U8(44)
        );
    }

    #[test]
    fn literals_take_the_other_operands_type() {
        let mut k = Ctx::new("lit", 1u32);
        let out = k.output("out", ElemType::F32, 1u32);
        let x = k.load(out, Expr::Int(0));
        let y = k.binary(BinaryOp::Mul, x, Expr::Int(2));
        k.store(out, Expr::Int(0), y);
        let z = k.binary(
            BinaryOp::Add,
            Expr::Int(2),
            Expr::Const(ScalarValue::U32(3)),
        );
        assert_eq!(z, Expr::Const(ScalarValue::U32(5)));
        let def = k.build().unwrap();
        let lits: Vec<ScalarValue> = def
            .body()
            .stmts
            .iter()
            .filter_map(|s| match s {
                super::super::Stmt::Let {
                    op: super::super::Op::Literal(c),
                    ..
                } => Some(*c),
                _ => None,
            })
            .collect();
        assert_eq!(
            lits,
            vec![
                ScalarValue::U32(0),
                ScalarValue::F32(2.0),
                ScalarValue::U32(0)
            ]
        );
    }

    #[test]
    fn mismatched_annotation_is_a_build_error() {
        let mut k = Ctx::new("ann", 1u32);
        let out = k.output("out", ElemType::F32, 1u32);
        let x = k.load(out, Expr::Int(0));
        let _ = k.typed(x, ElemType::U32);
        let e = k.build().unwrap_err();
        assert!(
            matches!(e, BuildError::Type { ref op, .. } if op == "let"),
            "{e}"
        );
    }
}
