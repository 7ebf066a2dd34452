//! The one validator of the kernel IR, run by every backend before it compiles a kernel.
//!
//! A [`KernelDefinition`] can reach a backend without going through
//! [`KernelBuilder::build`](super::KernelBuilder::build): it is plain data that deserialises from
//! anything. [`KernelDefinition::validate`] checks every rule of the IR once, for every backend:
//!
//! - the device limits: cube dimensions (no zero axis, each axis and the unit count within
//!   [`HardwareProperties`], the count computed without overflow), shared memory per cube and
//!   local-array memory per unit;
//! - the structure, by replaying the kernel through a [`KernelBuilder`]: every value defined once
//!   and before its use, in a scope that encloses the use; every buffer, scalar, shared array,
//!   local array and variable index declared; operand types as each operation requires; no store
//!   or atomic to a read-only buffer; `break`/`continue` inside loops. The builder holds these
//!   rules, so they are written once: the replay must produce the very same kernel (same
//!   [`KernelId`](super::KernelId)), which also checks that the declared type of every value is
//!   the one its operation gives.

use hashbrown::HashMap;

use super::builder::{KernelBuilder, Value, Var};
use super::definition::KernelDefinition;
use super::error::BuildError;
use super::ir::{Block, Op, Stmt, ValueId, VarId};
use super::types::Item;
use crate::error::{LaunchError, ServerError};
use crate::properties::HardwareProperties;

/// A kernel that breaks a rule of the IR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// A rule the builder enforces (types, scopes, access modes, declarations, loops).
    #[error(transparent)]
    Rule(#[from] BuildError),
    /// A value used before (or without) its definition.
    #[error("kernel `{kernel}`: value %{value} is used before it is defined")]
    UseBeforeDefinition {
        /// The kernel.
        kernel: String,
        /// The value's id.
        value: u32,
    },
    /// A value defined by two statements.
    #[error("kernel `{kernel}`: value %{value} is defined twice")]
    DefinedTwice {
        /// The kernel.
        kernel: String,
        /// The value's id.
        value: u32,
    },
    /// A value, variable or scalar index outside its table.
    #[error("kernel `{kernel}`: {what} #{index} is not declared")]
    Undeclared {
        /// The kernel.
        kernel: String,
        /// `scalar`, `variable`, `value`.
        what: &'static str,
        /// The index.
        index: u32,
    },
    /// A value whose declared type is not the type its operation gives.
    #[error(
        "kernel `{kernel}`: value %{value} is declared {declared}, its operation gives {computed}"
    )]
    TypeMismatch {
        /// The kernel.
        kernel: String,
        /// The value's id.
        value: u32,
        /// The type in the kernel's value table.
        declared: Item,
        /// The type the operation gives.
        computed: Item,
    },
    /// Tables (declarations, value numbering) that do not match the body.
    #[error("kernel `{kernel}`: {detail}")]
    Inconsistent {
        /// The kernel.
        kernel: String,
        /// What differs.
        detail: String,
    },
}

impl KernelDefinition {
    /// Bytes of local arrays one unit uses, `None` on overflow.
    pub fn private_memory_bytes(&self) -> Option<u64> {
        self.locals.iter().try_fold(0u64, |sum, l| {
            sum.checked_add((l.item.size() as u64).checked_mul(u64::from(l.len))?)
        })
    }

    /// Check the kernel's cube dimensions, shared memory and private memory against `hardware`.
    pub fn check_limits(&self, hardware: &HardwareProperties) -> Result<(), LaunchError> {
        let kernel = || self.name.clone();
        let dim = self.cube_dim;
        if dim.contains(&0) {
            return Err(LaunchError::CubeDimZero {
                kernel: kernel(),
                cube_dim: dim,
            });
        }
        if dim.iter().zip(hardware.max_cube_dim).any(|(&d, m)| d > m) {
            return Err(LaunchError::CubeDimTooLarge {
                kernel: kernel(),
                cube_dim: dim,
                maximum: hardware.max_cube_dim,
            });
        }
        let units: u64 = dim.iter().map(|&d| u64::from(d)).product();
        if units > u64::from(hardware.max_units_per_cube) {
            return Err(LaunchError::TooManyUnits {
                kernel: kernel(),
                units,
                maximum: hardware.max_units_per_cube,
            });
        }
        let shared = self.shared.iter().try_fold(0u64, |sum, s| {
            let bytes = (s.item.size() as u64).checked_mul(u64::from(s.len))?;
            sum.checked_add(bytes.checked_next_multiple_of(16)?)
        });
        let shared = shared.unwrap_or(u64::MAX);
        if shared > hardware.max_shared_memory_bytes {
            return Err(LaunchError::SharedMemory {
                kernel: kernel(),
                bytes: shared,
                maximum: hardware.max_shared_memory_bytes,
            });
        }
        let private = self.private_memory_bytes().unwrap_or(u64::MAX);
        if private > hardware.max_private_bytes_per_unit {
            return Err(LaunchError::PrivateMemory {
                kernel: kernel(),
                bytes: private,
                maximum: hardware.max_private_bytes_per_unit,
            });
        }
        Ok(())
    }

    /// Check every rule of the IR (see the [module docs](self)) and the device limits. Backends
    /// call this once per kernel, before compiling it; a kernel that passes is cached.
    pub fn validate(&self, hardware: &HardwareProperties) -> Result<(), ServerError> {
        self.check_limits(hardware)?;
        self.check_structure()?;
        Ok(())
    }

    /// The structural rules: replay the kernel through a builder and compare.
    pub fn check_structure(&self) -> Result<(), ValidationError> {
        let mut replay = Replay {
            def: self,
            values: HashMap::new(),
            vars: HashMap::new(),
            error: None,
        };
        let mut k = KernelBuilder::new(&self.name, self.cube_dim);
        for b in &self.buffers {
            k.buffer(&b.name, b.elem, b.vector_width, b.access);
        }
        for s in &self.shared {
            k.shared(&s.name, s.item.elem, s.item.width, s.len);
        }
        for l in &self.locals {
            k.local_array(&l.name, l.item.elem, l.item.width, l.len);
        }
        replay.block(&mut k, &self.body);
        if let Some(e) = replay.error {
            return Err(e);
        }
        let rebuilt = k.build()?;
        // Hashed afresh (not `id()`, which a definition may carry from before an edit).
        if super::hash::stable_hash(&rebuilt) == super::hash::stable_hash(self) {
            return Ok(());
        }
        Err(self.difference(&rebuilt))
    }

    /// What differs between this kernel and its replay (which passed the builder's rules).
    fn difference(&self, rebuilt: &KernelDefinition) -> ValidationError {
        let kernel = self.name.clone();
        if let Some((value, (&declared, &computed))) = self
            .values
            .iter()
            .zip(&rebuilt.values)
            .enumerate()
            .find(|(_, (a, b))| a != b)
        {
            return ValidationError::TypeMismatch {
                kernel,
                value: value as u32,
                declared,
                computed,
            };
        }
        let detail = if self.values.len() != rebuilt.values.len() {
            format!(
                "the value table has {} entries, the body defines {}",
                self.values.len(),
                rebuilt.values.len()
            )
        } else if self.scalars != rebuilt.scalars {
            "the scalar declarations do not match the scalars the body reads, in order".into()
        } else if self.vars != rebuilt.vars {
            "the variable declarations do not match the variables the body declares".into()
        } else {
            "the value numbering does not follow the order of definitions".into()
        };
        ValidationError::Inconsistent { kernel, detail }
    }
}

/// The state of a replay: the builder's value for each of the kernel's values and variables.
struct Replay<'d> {
    def: &'d KernelDefinition,
    values: HashMap<ValueId, Value>,
    vars: HashMap<VarId, Var>,
    error: Option<ValidationError>,
}

impl Replay<'_> {
    fn fail(&mut self, error: ValidationError) {
        if self.error.is_none() {
            self.error = Some(error);
        }
    }

    fn kernel(&self) -> String {
        self.def.name.clone()
    }

    /// The builder's value for `id`, or `None` (and the error) when it is not defined yet.
    fn value(&mut self, id: ValueId) -> Option<Value> {
        let found = self.values.get(&id).copied();
        if found.is_none() {
            let error = if (id.0 as usize) < self.def.values.len() {
                ValidationError::UseBeforeDefinition {
                    kernel: self.kernel(),
                    value: id.0,
                }
            } else {
                ValidationError::Undeclared {
                    kernel: self.kernel(),
                    what: "value",
                    index: id.0,
                }
            };
            self.fail(error);
        }
        found
    }

    fn var(&mut self, id: VarId) -> Option<Var> {
        let found = self.vars.get(&id).copied();
        if found.is_none() {
            let error = ValidationError::Undeclared {
                kernel: self.kernel(),
                what: "variable",
                index: id.0,
            };
            self.fail(error);
        }
        found
    }

    fn define(&mut self, id: ValueId, value: Value) {
        if self.values.insert(id, value).is_some() {
            let error = ValidationError::DefinedTwice {
                kernel: self.kernel(),
                value: id.0,
            };
            self.fail(error);
        }
    }

    fn block(&mut self, k: &mut KernelBuilder, block: &Block) {
        for stmt in &block.stmts {
            if self.error.is_some() {
                return;
            }
            self.stmt(k, stmt);
        }
    }

    fn stmt(&mut self, k: &mut KernelBuilder, stmt: &Stmt) {
        match stmt {
            Stmt::Let { out, op } => {
                if self.values.contains_key(out) {
                    let error = ValidationError::DefinedTwice {
                        kernel: self.kernel(),
                        value: out.0,
                    };
                    return self.fail(error);
                }
                if let Some(value) = self.op(k, op) {
                    self.define(*out, value);
                }
            }
            Stmt::Store { mem, index, value } => {
                let (Some(index), Some(value)) = (self.value(*index), self.value(*value)) else {
                    return;
                };
                let mem = k.raw_memory(*mem);
                k.store(mem, index, value);
            }
            Stmt::DeclareVar { var, init } => {
                let Some(init) = self.value(*init) else {
                    return;
                };
                let name = match self.def.vars.get(var.0 as usize) {
                    Some(decl) => decl.name.clone(),
                    None => {
                        let error = ValidationError::Undeclared {
                            kernel: self.kernel(),
                            what: "variable",
                            index: var.0,
                        };
                        return self.fail(error);
                    }
                };
                if self.vars.contains_key(var) {
                    let error = ValidationError::Inconsistent {
                        kernel: self.kernel(),
                        detail: format!("variable #{} is declared twice", var.0),
                    };
                    return self.fail(error);
                }
                let declared = k.var_named(&name, init);
                self.vars.insert(*var, declared);
            }
            Stmt::Assign { var, value } => {
                let (Some(var), Some(value)) = (self.var(*var), self.value(*value)) else {
                    return;
                };
                k.assign(var, value);
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                let Some(cond) = self.value(*cond) else {
                    return;
                };
                // Both branches replay through the same state, one after the other.
                let me = core::cell::RefCell::new(&mut *self);
                k.if_else(
                    cond,
                    |k| me.borrow_mut().block(k, then),
                    |k| me.borrow_mut().block(k, otherwise),
                );
            }
            Stmt::Range {
                var,
                start,
                end,
                step,
                body,
            } => {
                let (Some(start), Some(end), Some(step)) =
                    (self.value(*start), self.value(*end), self.value(*step))
                else {
                    return;
                };
                k.range(start, end, step, |k, i| {
                    self.define(*var, i);
                    self.block(k, body);
                });
            }
            Stmt::Loop { body } => k.loop_(|k| self.block(k, body)),
            Stmt::Break => k.break_(),
            Stmt::Continue => k.continue_(),
            Stmt::Return => k.return_(),
            Stmt::Barrier => k.barrier(),
        }
    }

    /// Replay one operation; `None` when an operand is missing (the error is recorded).
    fn op(&mut self, k: &mut KernelBuilder, op: &Op) -> Option<Value> {
        Some(match op {
            Op::Literal(v) => k.lit(*v),
            Op::Builtin(b) => k.builtin(*b),
            Op::Scalar(i) => {
                let Some(decl) = self.def.scalars.get(*i as usize) else {
                    let error = ValidationError::Undeclared {
                        kernel: self.kernel(),
                        what: "scalar",
                        index: *i,
                    };
                    self.fail(error);
                    return None;
                };
                k.scalar(&decl.name, decl.elem)
            }
            Op::Load { mem, index } => {
                let index = self.value(*index)?;
                let mem = k.raw_memory(*mem);
                k.load(mem, index)
            }
            Op::Len(b) => {
                let b = k.raw_buffer(*b);
                k.len(b)
            }
            Op::Rank(b) => {
                let b = k.raw_buffer(*b);
                k.rank(b)
            }
            Op::Shape { buffer, dim } => {
                let dim = self.value(*dim)?;
                let b = k.raw_buffer(*buffer);
                k.shape(b, dim)
            }
            Op::Stride { buffer, dim } => {
                let dim = self.value(*dim)?;
                let b = k.raw_buffer(*buffer);
                k.stride(b, dim)
            }
            Op::ReadVar(v) => {
                let v = self.var(*v)?;
                k.get(v)
            }
            Op::Unary(op, x) => {
                let x = self.value(*x)?;
                k.unary(*op, x)
            }
            Op::Binary(op, a, b) => {
                let (a, b) = (self.value(*a)?, self.value(*b)?);
                k.binary(*op, a, b)
            }
            Op::Compare(op, a, b) => {
                let (a, b) = (self.value(*a)?, self.value(*b)?);
                k.compare(*op, a, b)
            }
            Op::Fma(a, b, c) => {
                let (a, b, c) = (self.value(*a)?, self.value(*b)?, self.value(*c)?);
                k.fma(a, b, c)
            }
            Op::Clamp(x, lo, hi) => {
                let (x, lo, hi) = (self.value(*x)?, self.value(*lo)?, self.value(*hi)?);
                k.clamp(x, lo, hi)
            }
            Op::Select(c, a, b) => {
                let (c, a, b) = (self.value(*c)?, self.value(*a)?, self.value(*b)?);
                k.select(c, a, b)
            }
            Op::Cast(x, elem) => {
                let x = self.value(*x)?;
                k.cast(x, *elem)
            }
            Op::Bitcast(x, elem, _) => {
                let x = self.value(*x)?;
                k.bitcast(x, *elem)
            }
            Op::Splat(x, width) => {
                let x = self.value(*x)?;
                k.splat(x, *width)
            }
            Op::Extract(x, lane) => {
                let x = self.value(*x)?;
                k.extract(x, *lane)
            }
            Op::Insert(x, lane, v) => {
                let (x, v) = (self.value(*x)?, self.value(*v)?);
                k.insert(x, *lane, v)
            }
            Op::Vector(parts) => {
                let parts = parts
                    .iter()
                    .map(|&p| self.value(p))
                    .collect::<Option<Vec<_>>>()?;
                k.vector(&parts)
            }
            Op::Atomic {
                op,
                mem,
                index,
                value,
                compare,
            } => {
                let (index, value) = (self.value(*index)?, self.value(*value)?);
                let compare = match compare {
                    Some(c) => Some(self.value(*c)?),
                    None => None,
                };
                let mem = k.raw_memory(*mem);
                k.atomic(*op, mem, index, value, compare)
            }
            Op::Plane(op, x) => {
                let x = self.value(*x)?;
                k.plane(*op, x)
            }
            Op::PlaneBroadcast(x, lane) => {
                let (x, lane) = (self.value(*x)?, self.value(*lane)?);
                k.plane_broadcast(x, lane)
            }
            Op::PlaneShuffle(x, lane) => {
                let (x, lane) = (self.value(*x)?, self.value(*lane)?);
                k.plane_shuffle(x, lane)
            }
            Op::Ballot(c) => {
                let c = self.value(*c)?;
                k.ballot(c)
            }
        })
    }
}
