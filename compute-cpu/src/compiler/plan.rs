//! Compiling a kernel into a [`Plan`]: a tree of control nodes over flat register instructions,
//! each instruction a lane kernel chosen for its types.
//!
//! Size: the compiler from IR to plan is one pass over the statement tree; its per-operation
//! arms and the register allocation they share stay together.

use compute_core::elem::ElemType;
use compute_core::error::ServerError;
use compute_core::kernel::{
    AtomicOp, BinaryOp, Block, Builtin, Item, KernelDefinition, MemRef, Op, ScalarValue, Stmt,
    ValueId, VarId,
};

use std::sync::Arc;

use super::global::{
    self, AtomicFn, F32Atomic, GlobalLoadFn, GlobalStoreFn, RunLoadFn, RunStoreFn,
};
use super::jit::{self, JitKernel};
use super::lanes::{self, AccFn, BinFn, IndexFn, TerFn, UnFn};
use super::plane::{self, PlaneFn};
use super::range::{RangeFns, range_fns};
use super::words::{
    self, ArrayAccess, ArrayLoadFn, ArrayStoreFn, FillFn, MaskedFn, Shape, ShapeFn, by_size,
};
use super::{MAX_SHARED_MEMORY_BYTES, MAX_UNITS_PER_CUBE};

pub(crate) type Reg = usize;

/// One straight-line instruction over all units of a cube.
#[derive(Debug, Clone)]
pub(crate) enum Inst {
    Fill {
        out: Reg,
        bits: u64,
        f: FillFn,
        n: usize,
    },
    Scalar {
        index: usize,
        out: Reg,
        f: FillFn,
        n: usize,
    },
    Builtin {
        builtin: Builtin,
        out: Reg,
    },
    Unary {
        f: UnFn,
        x: Reg,
        out: Reg,
        n: usize,
    },
    Binary {
        f: BinFn,
        a: Reg,
        b: Reg,
        out: Reg,
        n: usize,
    },
    Ternary {
        f: TerFn,
        a: Reg,
        b: Reg,
        c: Reg,
        out: Reg,
        n: usize,
    },
    Copy {
        src: Reg,
        dst: Reg,
    },
    Assign {
        f: MaskedFn,
        src: Reg,
        dst: Reg,
        width: usize,
    },
    Reshape {
        f: ShapeFn,
        x: Reg,
        out: Reg,
        shape: Shape,
        arg: usize,
    },
    /// Copy `base` to `out`, then insert each `(scalar, component)`.
    Compose {
        base: Option<Reg>,
        parts: Vec<(Reg, usize)>,
        f: ShapeFn,
        out: Reg,
        shape: Shape,
    },
    /// `run`: the index is `absolute_pos`, so full cubes access one contiguous run.
    LoadGlobal {
        buf: usize,
        index: Reg,
        idx: IndexFn,
        out: Reg,
        f: GlobalLoadFn,
        run: Option<RunLoadFn>,
    },
    StoreGlobal {
        buf: usize,
        index: Reg,
        idx: IndexFn,
        value: Reg,
        f: GlobalStoreFn,
        run: Option<RunStoreFn>,
    },
    LoadArray {
        shared: bool,
        arr: usize,
        index: Reg,
        idx: IndexFn,
        out: Reg,
        f: ArrayLoadFn,
        access: ArrayAccess,
    },
    StoreArray {
        shared: bool,
        arr: usize,
        index: Reg,
        idx: IndexFn,
        value: Reg,
        f: ArrayStoreFn,
        access: ArrayAccess,
    },
    Len {
        buf: usize,
        out: Reg,
    },
    Rank {
        buf: usize,
        out: Reg,
    },
    Meta {
        buf: usize,
        dim: Reg,
        idx: IndexFn,
        out: Reg,
        stride: bool,
    },
    Atomic {
        mem: MemRef,
        op: AtomicOp,
        index: Reg,
        idx: IndexFn,
        value: Reg,
        compare: Reg,
        out: Reg,
        f: AtomicFn,
        len: u64,
    },
    Plane {
        f: PlaneFn,
        x: Reg,
        lane: Reg,
        out: Reg,
        width: usize,
    },
    /// `t = op(a, b, var); var = t` (an assignment right after the operation whose result
    /// nothing else reads) in place on the variable's register `acc`; `tmp` is `t`'s register,
    /// used (with `masked`) when some units are inactive.
    Accumulate {
        f: AccFn,
        a: Reg,
        b: Reg,
        acc: Reg,
        tmp: Reg,
        masked: MaskedFn,
        width: usize,
    },
}

/// Structured control flow; the executor keeps one active-unit mask per level.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    Inst(Inst),
    If {
        cond: Reg,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
    Loop(Vec<Node>),
    Range {
        var: Reg,
        start: Reg,
        end: Reg,
        step: Reg,
        fns: RangeFns,
        body: Vec<Node>,
    },
    Break,
    Continue,
    Return,
}

#[derive(Debug, Clone)]
pub(crate) struct BufferInfo {
    pub name: String,
    pub elem: ElemType,
    pub width: usize,
}

/// A kernel compiled for the CPU executor. Immutable, `Send + Sync`: share it across launches.
#[derive(Debug, Clone)]
pub struct Plan {
    pub(crate) name: String,
    pub(crate) cube_dim: [u32; 3],
    pub(crate) lanes: usize,
    pub(crate) reg_words: Vec<usize>,
    /// Once per worker: constants, scalar arguments, unit builtins, buffer lengths.
    pub(crate) init: Vec<Inst>,
    /// Once per cube: cube builtins.
    pub(crate) per_cube: Vec<Inst>,
    pub(crate) body: Vec<Node>,
    pub(crate) buffers: Vec<BufferInfo>,
    pub(crate) scalars: Vec<(String, ElemType)>,
    pub(crate) shared_words: Vec<usize>,
    pub(crate) local_words: Vec<usize>,
    /// The kernel as machine code, where the JIT covers it and is enabled.
    pub(crate) jit: Option<Arc<JitKernel>>,
    /// Why the JIT does not run this kernel (`None` when it does).
    pub(crate) jit_fallback: Option<String>,
}

/// Which executor runs a plan's launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Executor {
    /// The kernel compiled to machine code by the cranelift JIT.
    Jit,
    /// The lockstep interpreter.
    Interpreter,
}

impl Plan {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Units per cube.
    pub fn cube_dim(&self) -> [u32; 3] {
        self.cube_dim
    }

    /// Which executor runs this plan's launches.
    pub fn executor(&self) -> Executor {
        if self.jit.is_some() {
            Executor::Jit
        } else {
            Executor::Interpreter
        }
    }

    /// Why the JIT does not run this kernel: `None` when it does, or when the JIT is switched
    /// off (`COMPUTE_CPU_JIT=0`, or [`compile_interpreted`]).
    pub fn jit_fallback(&self) -> Option<&str> {
        self.jit_fallback.as_deref()
    }

    /// Microseconds the JIT took to compile this kernel (`None` without JIT code).
    pub fn jit_compile_us(&self) -> Option<f64> {
        self.jit.as_ref().map(|j| j.compile_us)
    }
}

/// Compile a kernel into a plan: machine code where the JIT covers the kernel and is enabled
/// (see [`jit`](super::jit)), the interpreter otherwise. Fails with [`ServerError::Compilation`] on IR that does not
/// validate (possible for deserialised kernels) and [`ServerError::Unsupported`] on cubes or
/// shared memory beyond this executor's limits.
pub fn compile(def: &KernelDefinition) -> Result<Plan, ServerError> {
    compile_with(def, jit::enabled())
}

/// [`compile`] for the interpreter only, whatever `COMPUTE_CPU_JIT` says (the reference the JIT
/// is checked against).
pub fn compile_interpreted(def: &KernelDefinition) -> Result<Plan, ServerError> {
    compile_with(def, false)
}

/// [`compile`] with the JIT, whatever `COMPUTE_CPU_JIT` says (the plan still falls back to the
/// interpreter for kernels the JIT does not cover: see [`Plan::executor`]).
pub fn compile_jit(def: &KernelDefinition) -> Result<Plan, ServerError> {
    compile_with(def, true)
}

pub(crate) fn compile_with(def: &KernelDefinition, use_jit: bool) -> Result<Plan, ServerError> {
    let lanes = def.cube_size() as usize;
    if lanes == 0 || lanes > MAX_UNITS_PER_CUBE as usize {
        return Err(ServerError::Unsupported(format!(
            "kernel `{}`: cube dimension {:?} has {lanes} units, the CPU executor allows 1 to {MAX_UNITS_PER_CUBE}",
            def.name(),
            def.cube_dim()
        )));
    }
    if def.shared_memory_bytes() as u64 > MAX_SHARED_MEMORY_BYTES {
        return Err(ServerError::Unsupported(format!(
            "kernel `{}` uses {} bytes of shared memory, the CPU executor allows {MAX_SHARED_MEMORY_BYTES}",
            def.name(),
            def.shared_memory_bytes()
        )));
    }
    let words = |bytes: usize| bytes.div_ceil(8);
    let nvalues = def.values().len();
    let mut reg_words: Vec<usize> = def
        .values()
        .iter()
        .map(|i| words(i.size() * lanes))
        .collect();
    reg_words.extend(def.vars().iter().map(|v| words(v.item.size() * lanes)));
    let mut c = Compiler {
        def,
        lanes,
        nvalues,
        init: Vec::new(),
        per_cube: Vec::new(),
        linear: vec![false; nvalues],
        alias: vec![None; nvalues],
    };
    let body = c.block(def.body(), 0)?;
    let (jit, jit_fallback) = if use_jit {
        match jit::compile(def) {
            Ok(k) => {
                if compute_core::env::flag("COMPUTE_CPU_JIT_LOG", false) {
                    eprintln!(
                        "compute-cpu: kernel `{}` compiled to machine code in {:.0} us",
                        def.name(),
                        k.compile_us
                    );
                }
                (Some(Arc::new(k)), None)
            }
            Err(why) => {
                if compute_core::env::flag("COMPUTE_CPU_JIT_LOG", false) {
                    eprintln!(
                        "compute-cpu: kernel `{}` runs on the interpreter: {why}",
                        def.name()
                    );
                }
                (None, Some(why))
            }
        }
    } else {
        (None, None)
    };
    Ok(Plan {
        jit,
        jit_fallback,
        name: def.name().to_owned(),
        cube_dim: def.cube_dim(),
        lanes,
        reg_words,
        init: c.init,
        per_cube: c.per_cube,
        body,
        buffers: def
            .buffers()
            .iter()
            .map(|b| BufferInfo {
                name: b.name.clone(),
                elem: b.elem,
                width: b.vector_width as usize,
            })
            .collect(),
        scalars: def
            .scalars()
            .iter()
            .map(|s| (s.name.clone(), s.elem))
            .collect(),
        shared_words: def.shared().iter().map(|s| words(s.size_bytes())).collect(),
        local_words: def
            .local_arrays()
            .iter()
            .map(|a| words(a.item.size() * a.len as usize * lanes))
            .collect(),
    })
}

/// The bits of a scalar, as its register stores them (compute-core's one encoding).
pub(crate) fn scalar_bits(v: ScalarValue) -> u64 {
    v.native_bits()
}

struct Compiler<'a> {
    def: &'a KernelDefinition,
    lanes: usize,
    nvalues: usize,
    init: Vec<Inst>,
    per_cube: Vec<Inst>,
    /// Values that are `absolute_pos`.
    linear: Vec<bool>,
    /// Values read from a variable that is not written while they are live: they use the
    /// variable's register instead of a copy.
    alias: Vec<Option<Reg>>,
}

impl Compiler<'_> {
    /// The register of a value.
    fn reg(&self, v: ValueId) -> Reg {
        self.alias
            .get(v.0 as usize)
            .copied()
            .flatten()
            .unwrap_or(v.0 as usize)
    }

    fn is_linear(&self, v: Reg) -> bool {
        self.linear.get(v).copied().unwrap_or(false)
    }

    fn err<T>(&self, msg: impl core::fmt::Display) -> Result<T, ServerError> {
        Err(ServerError::Compilation(format!(
            "kernel `{}`: {msg}",
            self.def.name()
        )))
    }

    fn item(&self, v: ValueId) -> Result<Item, ServerError> {
        match self.def.values().get(v.0 as usize) {
            Some(&i) => Ok(i),
            None => self.err(format!("value %{} is not defined", v.0)),
        }
    }

    fn expect(&self, v: ValueId, item: Item, what: &str) -> Result<Reg, ServerError> {
        let got = self.item(v)?;
        if got != item {
            return self.err(format!("{what}: %{} is {got}, expected {item}", v.0));
        }
        Ok(self.reg(v))
    }

    fn index(&self, v: ValueId, what: &str) -> Result<(Reg, IndexFn), ServerError> {
        let item = self.item(v)?;
        match lanes::index_fn(item.elem) {
            Some(f) if item.width == 1 => Ok((self.reg(v), f)),
            _ => self.err(format!(
                "{what}: index %{} is {item}, expected an integer scalar",
                v.0
            )),
        }
    }

    fn n(&self, item: Item) -> usize {
        self.lanes * item.width as usize
    }

    fn shape(&self, item: Item) -> Shape {
        Shape {
            lanes: self.lanes,
            width: item.width as usize,
        }
    }

    fn block(&mut self, block: &Block, depth: u32) -> Result<Vec<Node>, ServerError> {
        let mut nodes = Vec::with_capacity(block.stmts.len());
        let mut skip = 0;
        for (p, stmt) in block.stmts.iter().enumerate() {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if let Some((inst, used)) = self.fuse(&block.stmts, p)? {
                nodes.push(Node::Inst(inst));
                skip = used - 1;
                continue;
            }
            match stmt {
                Stmt::Let { out, op } => {
                    let inst = self.op(*out, op)?;
                    if let (Op::ReadVar(var), Some(Inst::Copy { src, .. })) = (op, &inst)
                        && forwardable(&block.stmts[p + 1..], *out, *var)
                    {
                        self.alias[out.0 as usize] = Some(*src);
                        continue;
                    }
                    if let Some(inst) = inst {
                        nodes.push(Node::Inst(inst));
                    }
                }
                Stmt::Store { mem, index, value } => {
                    let (index, idx) = self.index(*index, "store")?;
                    let inst = match *mem {
                        MemRef::Global(b) => {
                            let Some(decl) = self.def.buffers().get(b as usize) else {
                                return self.err(format!("store to unknown buffer #{b}"));
                            };
                            if decl.access != compute_core::kernel::Access::ReadWrite {
                                return self
                                    .err(format!("store to read-only buffer `{}`", decl.name));
                            }
                            let value = self.expect(*value, decl.item(), "store")?;
                            Inst::StoreGlobal {
                                buf: b as usize,
                                index,
                                idx,
                                value,
                                f: store_fn(decl.elem.size()),
                                run: self
                                    .is_linear(index)
                                    .then(|| store_run_fn(decl.elem.size())),
                            }
                        }
                        MemRef::Shared(_) | MemRef::Local(_) => {
                            let (shared, arr, item, access) = self.array(*mem)?;
                            let value = self.expect(*value, item, "store")?;
                            Inst::StoreArray {
                                shared,
                                arr,
                                index,
                                idx,
                                value,
                                f: by_size!(item.elem.size(), array_store_w),
                                access,
                            }
                        }
                    };
                    nodes.push(Node::Inst(inst));
                }
                Stmt::DeclareVar { var, init } => {
                    let Some(decl) = self.def.vars().get(var.0 as usize) else {
                        return self.err(format!("variable {} is not declared", var.0));
                    };
                    let src = self.expect(*init, decl.item, "var")?;
                    nodes.push(Node::Inst(Inst::Copy {
                        src,
                        dst: self.nvalues + var.0 as usize,
                    }));
                }
                Stmt::Assign { var, value } => {
                    let Some(decl) = self.def.vars().get(var.0 as usize) else {
                        return self.err(format!("variable {} is not declared", var.0));
                    };
                    let src = self.expect(*value, decl.item, "assign")?;
                    nodes.push(Node::Inst(Inst::Assign {
                        f: by_size!(decl.item.elem.size(), masked_copy_w),
                        src,
                        dst: self.nvalues + var.0 as usize,
                        width: decl.item.width as usize,
                    }));
                }
                Stmt::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    let cond = self.expect(*cond, Item::scalar(ElemType::Bool), "if")?;
                    nodes.push(Node::If {
                        cond,
                        then: self.block(then, depth)?,
                        otherwise: self.block(otherwise, depth)?,
                    });
                }
                Stmt::Range {
                    var,
                    start,
                    end,
                    step,
                    body,
                } => {
                    let item = self.item(*start)?;
                    let Some(fns) = range_fns(item.elem).filter(|_| item.width == 1) else {
                        return self.err(format!("range over {item}"));
                    };
                    nodes.push(Node::Range {
                        var: self.expect(*var, item, "range")?,
                        start: self.reg(*start),
                        end: self.expect(*end, item, "range")?,
                        step: self.expect(*step, item, "range")?,
                        fns,
                        body: self.block(body, depth + 1)?,
                    });
                }
                Stmt::Loop { body } => nodes.push(Node::Loop(self.block(body, depth + 1)?)),
                Stmt::Break | Stmt::Continue if depth == 0 => {
                    return self.err("break or continue outside a loop");
                }
                Stmt::Break => nodes.push(Node::Break),
                Stmt::Continue => nodes.push(Node::Continue),
                Stmt::Return => nodes.push(Node::Return),
                // Units of a cube run in lockstep: every unit has finished the previous
                // instruction before any starts the next, which is all a barrier promises.
                Stmt::Barrier => {}
            }
        }
        Ok(nodes)
    }

    /// An [`Inst::Accumulate`] for the statements at `p`: `t = fma(a, b, read(v))` or
    /// `t = read(v) + x` (either order), optionally after `s = splat(x)` used only as the fma's
    /// first operand, then `v = t`, with `t` read nowhere else. Returns the statements used.
    fn fuse(&mut self, stmts: &[Stmt], p: usize) -> Result<Option<(Inst, usize)>, ServerError> {
        let Stmt::Let { out: first, op } = &stmts[p] else {
            return Ok(None);
        };
        let (splat, q) = match op {
            Op::Splat(x, _) => (Some((*first, *x)), p + 1),
            _ => (None, p),
        };
        let (Some(Stmt::Let { out: t, op }), Some(Stmt::Assign { var, value })) =
            (stmts.get(q), stmts.get(q + 1))
        else {
            return Ok(None);
        };
        if value != t || !matches!(op, Op::Fma(..) | Op::Binary(BinaryOp::Add, ..)) {
            return Ok(None);
        }
        let rest = &stmts[q + 2..];
        if rest.iter().any(|s| stmt_uses(s, *t)) {
            return Ok(None);
        }
        let Some(decl) = self.def.vars().get(var.0 as usize) else {
            return Ok(None);
        };
        let item = decl.item;
        let acc = self.nvalues + var.0 as usize;
        if self.item(*t)? != item {
            return Ok(None);
        }
        // Compile the statements as usual first: that validates their types.
        let splat = match splat {
            Some((s, _)) => match self.op(s, op_at(&stmts[p]))? {
                Some(Inst::Reshape { x, .. })
                    if !rest.iter().any(|st| stmt_uses(st, s)) && !op_uses_twice(op, s) =>
                {
                    Some((s.0 as usize, x))
                }
                _ => return Ok(None),
            },
            None => None,
        };
        let (f, a, b, used) = match (self.op(*t, op)?, splat) {
            (Some(Inst::Ternary { a, b, c, .. }), None) if matches!(op, Op::Fma(..)) => {
                if c != acc || a == acc || b == acc {
                    return Ok(None);
                }
                (lanes::acc_fma_fn(item.elem, false), a, b, 2)
            }
            (Some(Inst::Ternary { a, b, c, .. }), Some((s, src))) if matches!(op, Op::Fma(..)) => {
                if a != s || c != acc || b == acc || src == acc {
                    return Ok(None);
                }
                (lanes::acc_fma_fn(item.elem, true), src, b, 3)
            }
            (Some(Inst::Binary { a, b, .. }), None) => {
                let other = if a == acc { b } else { a };
                if (a != acc && b != acc) || other == acc {
                    return Ok(None);
                }
                (lanes::acc_add_fn(item.elem), other, other, 2)
            }
            _ => return Ok(None),
        };
        let Some(f) = f else {
            return Ok(None);
        };
        Ok(Some((
            Inst::Accumulate {
                f,
                a,
                b,
                acc,
                tmp: t.0 as usize,
                masked: by_size!(item.elem.size(), masked_copy_w),
                width: item.width as usize,
            },
            used,
        )))
    }

    fn array(&self, mem: MemRef) -> Result<(bool, usize, Item, ArrayAccess), ServerError> {
        let (shared, i, decl) = match mem {
            MemRef::Shared(i) => (
                true,
                i,
                self.def.shared().get(i as usize).map(|s| (s.item, s.len)),
            ),
            MemRef::Local(i) => (
                false,
                i,
                self.def
                    .local_arrays()
                    .get(i as usize)
                    .map(|s| (s.item, s.len)),
            ),
            MemRef::Global(_) => unreachable!("global memory is not an array"),
        };
        let Some((item, len)) = decl else {
            return self.err(format!("unknown array #{i}"));
        };
        Ok((
            shared,
            i as usize,
            item,
            ArrayAccess {
                len: len as u64,
                width: item.width as usize,
                per_unit: !shared,
            },
        ))
    }

    /// The instruction of `out = op`; hoisted ones go to `init` / `per_cube` and return `None`.
    fn op(&mut self, out_id: ValueId, op: &Op) -> Result<Option<Inst>, ServerError> {
        let item = self.item(out_id)?;
        let out = out_id.0 as usize;
        let n = self.n(item);
        let inst = match op {
            Op::Literal(v) => {
                self.expect(out_id, Item::scalar(v.elem_type()), "literal")?;
                self.init.push(Inst::Fill {
                    out,
                    bits: scalar_bits(*v),
                    f: by_size!(item.elem.size(), fill_w),
                    n,
                });
                return Ok(None);
            }
            Op::Scalar(i) => {
                let Some(decl) = self.def.scalars().get(*i as usize) else {
                    return self.err(format!("unknown scalar #{i}"));
                };
                self.expect(out_id, Item::scalar(decl.elem), "scalar")?;
                self.init.push(Inst::Scalar {
                    index: *i as usize,
                    out,
                    f: by_size!(item.elem.size(), fill_w),
                    n,
                });
                return Ok(None);
            }
            Op::Builtin(b) => {
                self.expect(out_id, Item::scalar(ElemType::U32), "builtin")?;
                if *b == Builtin::AbsolutePos {
                    self.linear[out] = true;
                }
                let inst = Inst::Builtin { builtin: *b, out };
                if per_cube(*b) {
                    self.per_cube.push(inst);
                } else {
                    self.init.push(inst);
                }
                return Ok(None);
            }
            Op::Len(b) | Op::Rank(b) => {
                self.expect(out_id, Item::scalar(ElemType::U32), "len")?;
                if self.def.buffers().get(*b as usize).is_none() {
                    return self.err(format!("unknown buffer #{b}"));
                }
                let buf = *b as usize;
                self.init.push(if matches!(op, Op::Len(_)) {
                    Inst::Len { buf, out }
                } else {
                    Inst::Rank { buf, out }
                });
                return Ok(None);
            }
            Op::Shape { buffer, dim } | Op::Stride { buffer, dim } => {
                self.expect(out_id, Item::scalar(ElemType::U32), "shape")?;
                if self.def.buffers().get(*buffer as usize).is_none() {
                    return self.err(format!("unknown buffer #{buffer}"));
                }
                let (dim, idx) = self.index(*dim, "shape")?;
                Inst::Meta {
                    buf: *buffer as usize,
                    dim,
                    idx,
                    out,
                    stride: matches!(op, Op::Stride { .. }),
                }
            }
            Op::Load { mem, index } => {
                let (index, idx) = self.index(*index, "load")?;
                match *mem {
                    MemRef::Global(b) => {
                        let Some(decl) = self.def.buffers().get(b as usize) else {
                            return self.err(format!("load from unknown buffer #{b}"));
                        };
                        self.expect(out_id, decl.item(), "load")?;
                        Inst::LoadGlobal {
                            buf: b as usize,
                            index,
                            idx,
                            out,
                            f: load_fn(decl.elem),
                            run: (self.is_linear(index) && decl.elem != ElemType::Bool)
                                .then(|| load_run_fn(decl.elem.size())),
                        }
                    }
                    _ => {
                        let (shared, arr, aitem, access) = self.array(*mem)?;
                        self.expect(out_id, aitem, "load")?;
                        Inst::LoadArray {
                            shared,
                            arr,
                            index,
                            idx,
                            out,
                            f: by_size!(aitem.elem.size(), array_load_w),
                            access,
                        }
                    }
                }
            }
            Op::ReadVar(var) => {
                let Some(decl) = self.def.vars().get(var.0 as usize) else {
                    return self.err(format!("variable {} is not declared", var.0));
                };
                self.expect(out_id, decl.item, "get")?;
                Inst::Copy {
                    src: self.nvalues + var.0 as usize,
                    dst: out,
                }
            }
            Op::Unary(u, x) => {
                let x = self.expect(*x, item, u.name())?;
                let Some(f) = lanes::unary_fn(*u, item.elem) else {
                    return self.err(format!("`{}` on {item}", u.name()));
                };
                Inst::Unary { f, x, out, n }
            }
            Op::Binary(b, x, y) => {
                let a = self.expect(*x, item, b.name())?;
                let bb = self.expect(*y, item, b.name())?;
                let Some(f) = lanes::binary_fn(*b, item.elem) else {
                    return self.err(format!("`{}` on {item}", b.name()));
                };
                Inst::Binary {
                    f,
                    a,
                    b: bb,
                    out,
                    n,
                }
            }
            Op::Compare(cmp, x, y) => {
                let operand = self.item(*x)?;
                let a = self.expect(*x, operand, cmp.name())?;
                let b = self.expect(*y, operand, cmp.name())?;
                self.expect(out_id, operand.with_elem(ElemType::Bool), cmp.name())?;
                Inst::Binary {
                    f: lanes::compare_fn(*cmp, operand.elem),
                    a,
                    b,
                    out,
                    n,
                }
            }
            Op::Fma(x, y, z) | Op::Clamp(x, y, z) => {
                let name = if matches!(op, Op::Fma(..)) {
                    "fma"
                } else {
                    "clamp"
                };
                let a = self.expect(*x, item, name)?;
                let b = self.expect(*y, item, name)?;
                let c = self.expect(*z, item, name)?;
                let f = if name == "fma" {
                    lanes::fma_fn(item.elem)
                } else {
                    lanes::clamp_fn(item.elem)
                };
                let Some(f) = f else {
                    return self.err(format!("`{name}` on {item}"));
                };
                Inst::Ternary { f, a, b, c, out, n }
            }
            Op::Select(cond, x, y) => {
                let c = self.expect(*cond, item.with_elem(ElemType::Bool), "select")?;
                let a = self.expect(*x, item, "select")?;
                let b = self.expect(*y, item, "select")?;
                Inst::Ternary {
                    f: by_size!(item.elem.size(), select_w),
                    a: c,
                    b: a,
                    c: b,
                    out,
                    n,
                }
            }
            Op::Cast(x, to) => {
                let from = self.item(*x)?;
                if from.with_elem(*to) != item {
                    return self.err(format!("cast of {from} to {item}"));
                }
                Inst::Unary {
                    f: lanes::cast_fn(from.elem, *to),
                    x: self.reg(*x),
                    out,
                    n,
                }
            }
            Op::Bitcast(x, _, _) => {
                let from = self.item(*x)?;
                if from.size() != item.size() {
                    return self.err(format!("bitcast of {from} to {item}"));
                }
                Inst::Copy {
                    src: self.reg(*x),
                    dst: out,
                }
            }
            Op::Splat(x, _) => {
                let x = self.expect(*x, Item::scalar(item.elem), "splat")?;
                Inst::Reshape {
                    f: by_size!(item.elem.size(), splat_w),
                    x,
                    out,
                    shape: self.shape(item),
                    arg: 0,
                }
            }
            Op::Extract(x, comp) => {
                let from = self.item(*x)?;
                if from.elem != item.elem || item.width != 1 || *comp >= from.width {
                    return self.err(format!("component {comp} of {from} as {item}"));
                }
                Inst::Reshape {
                    f: by_size!(item.elem.size(), extract_w),
                    x: self.reg(*x),
                    out,
                    shape: self.shape(from),
                    arg: *comp as usize,
                }
            }
            Op::Insert(v, comp, x) => {
                let base = self.expect(*v, item, "insert")?;
                let x = self.expect(*x, Item::scalar(item.elem), "insert")?;
                if *comp >= item.width {
                    return self.err(format!("component {comp} of {item}"));
                }
                Inst::Compose {
                    base: Some(base),
                    parts: vec![(x, *comp as usize)],
                    f: by_size!(item.elem.size(), insert_w),
                    out,
                    shape: self.shape(item),
                }
            }
            Op::Vector(parts) => {
                if parts.len() != item.width as usize {
                    return self.err(format!("{} parts for {item}", parts.len()));
                }
                let mut regs = Vec::with_capacity(parts.len());
                for (c, p) in parts.iter().enumerate() {
                    regs.push((self.expect(*p, Item::scalar(item.elem), "vector")?, c));
                }
                Inst::Compose {
                    base: None,
                    parts: regs,
                    f: by_size!(item.elem.size(), insert_w),
                    out,
                    shape: self.shape(item),
                }
            }
            Op::Atomic {
                op: aop,
                mem,
                index,
                value,
                compare,
            } => {
                let (index, idx) = self.index(*index, aop.name())?;
                let (mem_item, len) = match *mem {
                    MemRef::Global(b) => match self.def.buffers().get(b as usize) {
                        Some(d)
                            if d.access == compute_core::kernel::Access::ReadWrite
                                || *aop == AtomicOp::Load =>
                        {
                            (d.item(), 0)
                        }
                        _ => return self.err(format!("`{}` on buffer #{b}", aop.name())),
                    },
                    MemRef::Shared(s) => match self.def.shared().get(s as usize) {
                        Some(d) => (d.item, d.len as u64),
                        None => return self.err(format!("unknown shared array #{s}")),
                    },
                    MemRef::Local(_) => return self.err("atomics on a local array"),
                };
                self.expect(out_id, mem_item, aop.name())?;
                let value = self.expect(*value, mem_item, aop.name())?;
                let compare = match compare {
                    Some(c) => self.expect(*c, mem_item, aop.name())?,
                    None => value,
                };
                let Some(f) = atomic_fn(*aop, mem_item) else {
                    return self.err(format!("`{}` on {mem_item}", aop.name()));
                };
                Inst::Atomic {
                    mem: *mem,
                    op: *aop,
                    index,
                    idx,
                    value,
                    compare,
                    out,
                    f,
                    len,
                }
            }
            Op::Plane(p, x) => {
                let x = self.expect(*x, item, p.name())?;
                let Some(f) = plane::reduce_fn(*p, item.elem) else {
                    return self.err(format!("`{}` on {item}", p.name()));
                };
                Inst::Plane {
                    f,
                    x,
                    lane: x,
                    out,
                    width: item.width as usize,
                }
            }
            Op::PlaneBroadcast(x, lane) | Op::PlaneShuffle(x, lane) => {
                let x = self.expect(*x, item, "plane_shuffle")?;
                let lane = self.expect(*lane, Item::scalar(ElemType::U32), "plane_shuffle")?;
                Inst::Plane {
                    f: by_size!(item.elem.size(), plane_shuffle_w),
                    x,
                    lane,
                    out,
                    width: item.width as usize,
                }
            }
            Op::Ballot(x) => {
                let x = self.expect(*x, Item::scalar(ElemType::Bool), "ballot")?;
                self.expect(out_id, Item::new(ElemType::U32, 4), "ballot")?;
                Inst::Plane {
                    f: plane::ballot,
                    x,
                    lane: x,
                    out,
                    width: 4,
                }
            }
        };
        Ok(Some(inst))
    }
}

/// Whether `out = read(var)` can share `var`'s register: `var` is not written (assigned or
/// declared again, at any depth) from the read through the last statement that uses `out`.
fn forwardable(rest: &[Stmt], out: ValueId, var: VarId) -> bool {
    let Some(last) = rest.iter().rposition(|s| stmt_uses(s, out)) else {
        return true;
    };
    !rest[..=last].iter().any(|s| stmt_writes(s, var))
}

fn op_at(s: &Stmt) -> &Op {
    match s {
        Stmt::Let { op, .. } => op,
        _ => unreachable!("a `let` statement"),
    }
}

/// Whether `s` is more than one operand of `op` (a splat fused into one operand must not feed
/// another).
fn op_uses_twice(op: &Op, s: ValueId) -> bool {
    match op {
        Op::Fma(a, b, c) => [a, b, c].iter().filter(|&&&x| x == s).count() > 1,
        _ => true,
    }
}

fn block_uses(b: &Block, v: ValueId) -> bool {
    b.stmts.iter().any(|s| stmt_uses(s, v))
}

fn stmt_uses(s: &Stmt, v: ValueId) -> bool {
    match s {
        Stmt::Let { op, .. } => op_uses(op, v),
        Stmt::Store { index, value, .. } => *index == v || *value == v,
        Stmt::DeclareVar { init, .. } => *init == v,
        Stmt::Assign { value, .. } => *value == v,
        Stmt::If {
            cond,
            then,
            otherwise,
        } => *cond == v || block_uses(then, v) || block_uses(otherwise, v),
        Stmt::Range {
            start,
            end,
            step,
            body,
            ..
        } => *start == v || *end == v || *step == v || block_uses(body, v),
        Stmt::Loop { body } => block_uses(body, v),
        Stmt::Break | Stmt::Continue | Stmt::Return | Stmt::Barrier => false,
    }
}

fn op_uses(op: &Op, v: ValueId) -> bool {
    match op {
        Op::Literal(_)
        | Op::Builtin(_)
        | Op::Scalar(_)
        | Op::Len(_)
        | Op::Rank(_)
        | Op::ReadVar(_) => false,
        Op::Load { index: x, .. }
        | Op::Shape { dim: x, .. }
        | Op::Stride { dim: x, .. }
        | Op::Unary(_, x)
        | Op::Cast(x, _)
        | Op::Bitcast(x, _, _)
        | Op::Splat(x, _)
        | Op::Extract(x, _)
        | Op::Plane(_, x)
        | Op::Ballot(x) => *x == v,
        Op::Binary(_, a, b)
        | Op::Compare(_, a, b)
        | Op::Insert(a, _, b)
        | Op::PlaneBroadcast(a, b)
        | Op::PlaneShuffle(a, b) => *a == v || *b == v,
        Op::Fma(a, b, c) | Op::Clamp(a, b, c) | Op::Select(a, b, c) => {
            *a == v || *b == v || *c == v
        }
        Op::Vector(parts) => parts.contains(&v),
        Op::Atomic {
            index,
            value,
            compare,
            ..
        } => *index == v || *value == v || *compare == Some(v),
    }
}

fn block_writes(b: &Block, var: VarId) -> bool {
    b.stmts.iter().any(|s| stmt_writes(s, var))
}

fn stmt_writes(s: &Stmt, var: VarId) -> bool {
    match s {
        Stmt::DeclareVar { var: w, .. } | Stmt::Assign { var: w, .. } => *w == var,
        Stmt::If {
            then, otherwise, ..
        } => block_writes(then, var) || block_writes(otherwise, var),
        Stmt::Range { body, .. } | Stmt::Loop { body } => block_writes(body, var),
        _ => false,
    }
}

fn per_cube(b: Builtin) -> bool {
    matches!(
        b,
        Builtin::AbsolutePos
            | Builtin::AbsolutePosX
            | Builtin::AbsolutePosY
            | Builtin::AbsolutePosZ
            | Builtin::CubePos
            | Builtin::CubePosX
            | Builtin::CubePosY
            | Builtin::CubePosZ
    )
}

fn load_fn(elem: ElemType) -> GlobalLoadFn {
    match elem {
        ElemType::Bool => global::load_bool,
        e => match e.size() {
            1 => global::load::<u8>,
            2 => global::load::<u16>,
            4 => global::load::<u32>,
            _ => global::load::<u64>,
        },
    }
}

fn store_fn(size: usize) -> GlobalStoreFn {
    match size {
        1 => global::store::<u8>,
        2 => global::store::<u16>,
        4 => global::store::<u32>,
        _ => global::store::<u64>,
    }
}

fn load_run_fn(size: usize) -> RunLoadFn {
    match size {
        1 => global::load_run::<u8>,
        2 => global::load_run::<u16>,
        4 => global::load_run::<u32>,
        _ => global::load_run::<u64>,
    }
}

fn store_run_fn(size: usize) -> RunStoreFn {
    match size {
        1 => global::store_run::<u8>,
        2 => global::store_run::<u16>,
        4 => global::store_run::<u32>,
        _ => global::store_run::<u64>,
    }
}

fn atomic_fn(op: AtomicOp, item: Item) -> Option<AtomicFn> {
    if item.width != 1 {
        return None;
    }
    let f: AtomicFn = match item.elem {
        ElemType::I32 => global::atomic::<i32>,
        ElemType::U32 => global::atomic::<u32>,
        ElemType::I64 => global::atomic::<i64>,
        ElemType::U64 => global::atomic::<u64>,
        ElemType::F32
            if matches!(
                op,
                AtomicOp::Load
                    | AtomicOp::Store
                    | AtomicOp::Exchange
                    | AtomicOp::CompareExchange
                    | AtomicOp::Add
            ) =>
        {
            global::atomic::<F32Atomic>
        }
        _ => return None,
    };
    Some(f)
}

// Instances the `by_size!` macro names; each is a generic kernel at one component size.
use plane::shuffle as plane_shuffle_w;
use words::{
    array_load as array_load_w, array_store as array_store_w, extract as extract_w, fill as fill_w,
    insert as insert_w, masked_copy as masked_copy_w, select as select_w, splat as splat_w,
};
