//! The statements and operations of the kernel IR.
//!
//! A kernel body is a tree of [`Block`]s. Every operation defines a new SSA value ([`ValueId`]),
//! whose type is recorded in [`KernelDefinition::values`](super::KernelDefinition::values); a value
//! is visible in the block that defines it (after its definition) and in the blocks nested there.
//! Mutable state lives in variables ([`VarId`]), local arrays, shared memory and global buffers.
//!
//! Semantics that backends must agree on:
//! - integer arithmetic wraps; `x / 0 == x` and `x % 0 == 0` for integers (as in WGSL), as is
//!   `MIN / -1 == MIN`; shifts use the shift amount modulo the bit width;
//! - float to integer casts saturate, NaN casts to 0; integer to float casts round to nearest;
//! - `round` rounds half to even;
//! - a range loop `range(start, end, step)` runs `i = start; i < end; i += step` for a positive
//!   step, `i > end` for a negative step, no iteration for a zero step, and stops when `i + step`
//!   overflows;
//! - out-of-range accesses to shared memory and local arrays read 0 and drop the store, always;
//!   global buffers do so in checked launches.

use serde::{Deserialize, Serialize};

use super::scalar::ScalarValue;
use super::types::Builtin;
use crate::elem::ElemType;

/// Index of an SSA value in the kernel's value table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

/// Index of a mutable variable in the kernel's variable table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VarId(pub u32);

/// Memory that loads, stores and atomics address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemRef {
    /// A global buffer parameter, by declaration index.
    Global(u32),
    /// A shared memory array, by declaration index.
    Shared(u32),
    /// A local array, by declaration index.
    Local(u32),
}

/// Operations of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnaryOp {
    /// Arithmetic negation (signed integers and floats).
    Neg,
    /// Absolute value (signed integers and floats).
    Abs,
    /// Logical not (bool).
    Not,
    /// Bitwise not (integers).
    BitNot,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// `ln(1 + x)`.
    Log1p,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Hyperbolic tangent.
    Tanh,
    /// The error function.
    Erf,
    /// Round toward negative infinity.
    Floor,
    /// Round toward positive infinity.
    Ceil,
    /// Round to nearest, half to even.
    Round,
    /// `1 / x`.
    Recip,
}

impl UnaryOp {
    /// The operation's name, as the builder method.
    pub const fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Not => "not",
            UnaryOp::BitNot => "bit_not",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Recip => "recip",
        }
    }

    /// Whether the operation is a float-only math function.
    pub const fn is_float_math(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not | UnaryOp::BitNot
        )
    }
}

/// Operations of two operands of the same type, giving that type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    /// Addition.
    Add,
    /// Subtraction.
    Sub,
    /// Multiplication.
    Mul,
    /// Division.
    Div,
    /// Remainder (truncated, sign of the dividend).
    Rem,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Power (floats).
    Pow,
    /// Logical and (bool).
    And,
    /// Logical or (bool).
    Or,
    /// Bitwise and (integers).
    BitAnd,
    /// Bitwise or (integers).
    BitOr,
    /// Bitwise xor (integers).
    BitXor,
    /// Shift left (integers).
    Shl,
    /// Shift right, arithmetic for signed integers (integers).
    Shr,
}

impl BinaryOp {
    /// The operation's name, as the builder method.
    pub const fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
            BinaryOp::Pow => "pow",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::BitAnd => "bit_and",
            BinaryOp::BitOr => "bit_or",
            BinaryOp::BitXor => "bit_xor",
            BinaryOp::Shl => "shl",
            BinaryOp::Shr => "shr",
        }
    }
}

/// Comparisons: two operands of the same type, a bool of the same width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CmpOp {
    /// The operation's name, as the builder method.
    pub const fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

/// Atomic read-modify-write operations; each returns the previous value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AtomicOp {
    /// Read the value.
    Load,
    /// Write the value (returns the previous value).
    Store,
    /// Add (integers, and f32).
    Add,
    /// Subtract (integers).
    Sub,
    /// Minimum (integers).
    Min,
    /// Maximum (integers).
    Max,
    /// Swap in the value.
    Exchange,
    /// Write `value` where the current value equals `compare`.
    CompareExchange,
    /// Bitwise and.
    And,
    /// Bitwise or.
    Or,
    /// Bitwise xor.
    Xor,
}

impl AtomicOp {
    /// The operation's name, as the builder method.
    pub const fn name(self) -> &'static str {
        match self {
            AtomicOp::Load => "atomic_load",
            AtomicOp::Store => "atomic_store",
            AtomicOp::Add => "atomic_add",
            AtomicOp::Sub => "atomic_sub",
            AtomicOp::Min => "atomic_min",
            AtomicOp::Max => "atomic_max",
            AtomicOp::Exchange => "atomic_exchange",
            AtomicOp::CompareExchange => "atomic_compare_exchange",
            AtomicOp::And => "atomic_and",
            AtomicOp::Or => "atomic_or",
            AtomicOp::Xor => "atomic_xor",
        }
    }
}

/// Reductions over the active units of a plane; every unit receives the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PlaneOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Whether every active unit's bool is true.
    All,
    /// Whether any active unit's bool is true.
    Any,
}

impl PlaneOp {
    /// The operation's name, as the builder method.
    pub const fn name(self) -> &'static str {
        match self {
            PlaneOp::Sum => "plane_sum",
            PlaneOp::Prod => "plane_prod",
            PlaneOp::Min => "plane_min",
            PlaneOp::Max => "plane_max",
            PlaneOp::All => "plane_all",
            PlaneOp::Any => "plane_any",
        }
    }
}

/// An operation that defines one value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// A constant scalar.
    Literal(ScalarValue),
    /// A builtin (`u32`).
    Builtin(Builtin),
    /// A scalar parameter, by declaration index.
    Scalar(u32),
    /// Load the entry `index` (an integer scalar) of memory; an item of the memory's item.
    Load {
        /// The memory.
        mem: MemRef,
        /// Index in entries (vectors) of the memory.
        index: ValueId,
    },
    /// Length of a global buffer in entries of its vector width (`u32`, saturating).
    Len(u32),
    /// Rank of a buffer's tensor metadata (`u32`, 0 when the launch attached none).
    Rank(u32),
    /// Size of dimension `dim` of a buffer's tensor (`u32`; 0 past the rank).
    Shape {
        /// Buffer declaration index.
        buffer: u32,
        /// Dimension, an integer scalar.
        dim: ValueId,
    },
    /// Stride in elements of dimension `dim` of a buffer's tensor (`u32`; 0 past the rank).
    Stride {
        /// Buffer declaration index.
        buffer: u32,
        /// Dimension, an integer scalar.
        dim: ValueId,
    },
    /// The current value of a variable.
    ReadVar(VarId),
    /// A unary operation.
    Unary(UnaryOp, ValueId),
    /// A binary operation on operands of the same item.
    Binary(BinaryOp, ValueId, ValueId),
    /// A comparison; a bool of the operands' width.
    Compare(CmpOp, ValueId, ValueId),
    /// `a * b + c`, fused where the hardware fuses.
    Fma(ValueId, ValueId, ValueId),
    /// `min(max(x, lo), hi)`.
    Clamp(ValueId, ValueId, ValueId),
    /// `cond ? a : b`, per component (`cond` is a bool of the same width as `a` and `b`).
    Select(ValueId, ValueId, ValueId),
    /// Value conversion to another element type, same width.
    Cast(ValueId, ElemType),
    /// Reinterpretation of the bits as another item of the same size in bytes.
    Bitcast(ValueId, ElemType, u8),
    /// A vector with every component equal to a scalar.
    Splat(ValueId, u8),
    /// One component of a vector.
    Extract(ValueId, u8),
    /// A vector with one component replaced: `(vector, component, scalar)`.
    Insert(ValueId, u8, ValueId),
    /// A vector from scalars of one element type.
    Vector(Vec<ValueId>),
    /// An atomic operation on an integer (or f32 for add) scalar entry; the previous value.
    Atomic {
        /// The operation.
        op: AtomicOp,
        /// Global (read-write) or shared memory.
        mem: MemRef,
        /// Index of the entry.
        index: ValueId,
        /// The operand (ignored by `Load`).
        value: ValueId,
        /// The expected value of `CompareExchange`.
        compare: Option<ValueId>,
    },
    /// A reduction over the active units of the plane.
    Plane(PlaneOp, ValueId),
    /// The value of the unit `lane` (a uniform `u32`) of the plane.
    PlaneBroadcast(ValueId, ValueId),
    /// The value of the unit `lane` (per unit `u32`) of the plane.
    PlaneShuffle(ValueId, ValueId),
    /// A bitmask (`u32x4`) of the active units whose bool is true.
    Ballot(ValueId),
}

/// A sequence of statements.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// The statements, in order.
    pub stmts: Vec<Stmt>,
}

/// A statement of the kernel body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Stmt {
    /// Define `out` as the result of `op`.
    Let {
        /// The defined value.
        out: ValueId,
        /// The operation.
        op: Op,
    },
    /// Store `value` to entry `index` of memory.
    Store {
        /// The memory.
        mem: MemRef,
        /// Index in entries.
        index: ValueId,
        /// The stored value, of the memory's item.
        value: ValueId,
    },
    /// Declare a variable with an initial value; it is visible in the enclosing block.
    DeclareVar {
        /// The variable.
        var: VarId,
        /// Its initial value.
        init: ValueId,
    },
    /// Assign a variable.
    Assign {
        /// The variable.
        var: VarId,
        /// The new value.
        value: ValueId,
    },
    /// Two-way branch on a bool scalar.
    If {
        /// The condition.
        cond: ValueId,
        /// Run where the condition is true.
        then: Block,
        /// Run where it is false.
        otherwise: Block,
    },
    /// A counted loop; `var` is the loop counter, visible in `body`.
    Range {
        /// The counter, defined by the loop.
        var: ValueId,
        /// First value.
        start: ValueId,
        /// Bound (exclusive).
        end: ValueId,
        /// Increment.
        step: ValueId,
        /// The body.
        body: Block,
    },
    /// A loop that runs until `break` or `return`.
    Loop {
        /// The body.
        body: Block,
    },
    /// Leave the innermost loop.
    Break,
    /// Start the next iteration of the innermost loop.
    Continue,
    /// Stop the unit.
    Return,
    /// Wait until every unit of the cube reaches this barrier; orders shared and global memory.
    Barrier,
}
