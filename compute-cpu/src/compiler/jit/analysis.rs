//! The shape of a kernel for code generation: which values are uniform over a cube, where the
//! kernel splits at barriers, and what crosses from one split to the next.
//!
//! The generated function runs one cube. Code between barriers (a *segment*) becomes a loop over
//! the cube's units, each unit running the segment's statements as plain scalar (or 128-bit
//! vector) code. A barrier ends the segment: every unit finishes it before any starts the next,
//! which is all a barrier promises. Barriers may sit at the top level of the body or inside `if`s
//! and range loops whose condition or bounds are uniform (the same for every unit of a cube:
//! built from literals, scalars, cube builtins and lengths); those statements run once per cube
//! around the segments they hold. Values computed in one segment and used in a later one, and
//! variables used in more than one segment, live in a per-unit slot of the worker's state.

use compute_core::kernel::{Builtin, KernelDefinition, Op, Stmt, ValueId, VarId};

/// Statement trees over segments, run once per cube.
pub(super) enum CubeNode<'a> {
    /// Run segment `n` for every unit.
    Seg(usize),
    /// A branch holding barriers or plane operations. With `masks` (a per-unit condition),
    /// each side runs with a per-unit active mask: `(then, otherwise)` mask slots.
    If {
        cond: ValueId,
        then: Vec<CubeNode<'a>>,
        otherwise: Vec<CubeNode<'a>>,
        masks: Option<(u32, u32)>,
    },
    /// A `loop` holding barriers or plane operations: it runs while any unit is active;
    /// `break` and `continue` in unit code clear the unit's `active` mask slot (`continue`
    /// also sets its `resume` slot, which reactivates it for the next iteration).
    Loop {
        body: Vec<CubeNode<'a>>,
        active: u32,
        resume: u32,
    },
    /// A plane operation at the top level of the kernel's cube code: every unit has computed
    /// its operands (in slots) before it runs over the cube, and its result goes to a slot.
    Plane { out: ValueId, op: &'a Op },
    /// A uniform range loop holding barriers.
    Range {
        var: ValueId,
        start: ValueId,
        end: ValueId,
        step: ValueId,
        body: Vec<CubeNode<'a>>,
    },
}

/// Straight-line code between barriers, run by each unit.
#[derive(Default)]
pub(super) struct Segment<'a> {
    /// The statements in order (uniform `let`s among them are skipped: they are hoisted).
    pub stmts: Vec<&'a Stmt>,
    /// Uniform `let`s, evaluated once per cube before the units run.
    pub hoisted: Vec<(ValueId, &'a Op)>,
    /// Values defined in another segment that this one reads.
    pub live_in: Vec<ValueId>,
}

pub(super) struct Analysis<'a> {
    pub tree: Vec<CubeNode<'a>>,
    pub segs: Vec<Segment<'a>>,
    pub uniform: Vec<bool>,
    /// Values read by a later segment: stored to a per-unit slot when defined.
    pub spilled: Vec<bool>,
    /// Unit builtins: recomputed in each segment rather than spilled.
    pub unit_builtin: Vec<Option<Builtin>>,
    /// Variables used in more than one segment: kept in a per-unit slot.
    pub var_in_memory: Vec<bool>,
    /// Whether units may return while later segments remain (a per-unit flag then skips them).
    pub needs_return_flag: bool,
    /// Per-unit mask bytes of masked cube-level control.
    pub mask_slots: u32,
    /// Kinds of the enclosing cube-level loops (`true` for `loop`, `false` for range loops).
    cube_loops: Vec<bool>,
    seg_of: Vec<usize>,
    var_seg: Vec<Option<usize>>,
    has_return: bool,
}

const NONE: usize = usize::MAX;

/// Whether a statement must run at cube level: it is or holds a barrier or a plane operation.
fn has_barrier(s: &Stmt) -> bool {
    match s {
        Stmt::Barrier => true,
        Stmt::Let { op, .. } => is_plane(op),
        Stmt::If {
            then, otherwise, ..
        } => then.stmts.iter().any(has_barrier) || otherwise.stmts.iter().any(has_barrier),
        Stmt::Range { body, .. } | Stmt::Loop { body } => body.stmts.iter().any(has_barrier),
        _ => false,
    }
}

fn is_plane(op: &Op) -> bool {
    matches!(
        op,
        Op::Plane(..) | Op::PlaneBroadcast(..) | Op::PlaneShuffle(..) | Op::Ballot(_)
    )
}

fn cube_builtin(b: Builtin) -> bool {
    matches!(
        b,
        Builtin::CubePos
            | Builtin::CubePosX
            | Builtin::CubePosY
            | Builtin::CubePosZ
            | Builtin::CubeDim
            | Builtin::CubeDimX
            | Builtin::CubeDimY
            | Builtin::CubeDimZ
            | Builtin::CubeCount
            | Builtin::CubeCountX
            | Builtin::CubeCountY
            | Builtin::CubeCountZ
            | Builtin::PlaneSize
    )
}

/// The operands of an operation.
pub(super) fn operands(op: &Op) -> Vec<ValueId> {
    match op {
        Op::Literal(_)
        | Op::Builtin(_)
        | Op::Scalar(_)
        | Op::Len(_)
        | Op::Rank(_)
        | Op::ReadVar(_) => vec![],
        Op::Load { index: x, .. }
        | Op::Shape { dim: x, .. }
        | Op::Stride { dim: x, .. }
        | Op::Unary(_, x)
        | Op::Cast(x, _)
        | Op::Bitcast(x, _, _)
        | Op::Splat(x, _)
        | Op::Extract(x, _)
        | Op::Plane(_, x)
        | Op::Ballot(x) => vec![*x],
        Op::Binary(_, a, b)
        | Op::Compare(_, a, b)
        | Op::Insert(a, _, b)
        | Op::PlaneBroadcast(a, b)
        | Op::PlaneShuffle(a, b) => vec![*a, *b],
        Op::Fma(a, b, c) | Op::Clamp(a, b, c) | Op::Select(a, b, c) => vec![*a, *b, *c],
        Op::Vector(parts) => parts.clone(),
        Op::Atomic {
            index,
            value,
            compare,
            ..
        } => {
            let mut v = vec![*index, *value];
            v.extend(compare.iter().copied());
            v
        }
    }
}

impl<'a> Analysis<'a> {
    pub(super) fn new(def: &'a KernelDefinition) -> Result<Self, String> {
        let n = def.values().len();
        let mut a = Analysis {
            tree: Vec::new(),
            segs: Vec::new(),
            uniform: vec![false; n],
            spilled: vec![false; n],
            unit_builtin: vec![None; n],
            var_in_memory: vec![false; def.vars().len()],
            needs_return_flag: false,
            mask_slots: 0,
            cube_loops: Vec::new(),
            seg_of: vec![NONE; n],
            var_seg: vec![None; def.vars().len()],
            has_return: false,
        };
        a.tree = a.cube_block(&def.body().stmts)?;
        a.needs_return_flag = a.has_return && a.segs.len() > 1;

        Ok(a)
    }

    fn new_seg(&mut self) -> usize {
        self.segs.push(Segment::default());
        self.segs.len() - 1
    }

    fn check(&self, v: ValueId) -> Result<usize, String> {
        let i = v.0 as usize;
        if i >= self.uniform.len() {
            return Err(format!("value %{} is not defined", v.0));
        }
        Ok(i)
    }

    fn require_uniform(&self, v: ValueId, what: &str) -> Result<(), String> {
        let i = self.check(v)?;
        if self.uniform[i] {
            Ok(())
        } else {
            Err(format!(
                "a barrier or plane operation under {what} that is not uniform over the cube"
            ))
        }
    }

    fn cube_block(&mut self, stmts: &'a [Stmt]) -> Result<Vec<CubeNode<'a>>, String> {
        let mut nodes = Vec::new();
        let mut cur: Option<usize> = None;
        for s in stmts {
            if let Stmt::Let { out, op } = s
                && is_plane(op)
            {
                cur = None;
                let id = self.new_seg();
                for v in operands(op) {
                    let i = self.check(v)?;
                    self.use_(v, id)?;
                    // Uniform operands are written to every unit's slot by the step itself.
                    self.spilled[i] = true;
                }
                let i = self.check(*out)?;
                self.seg_of[i] = id;
                self.spilled[i] = true;
                nodes.push(CubeNode::Plane { out: *out, op });
                continue;
            }
            if !has_barrier(s) {
                let seg = match cur {
                    Some(c) => c,
                    None => {
                        let c = self.new_seg();
                        nodes.push(CubeNode::Seg(c));
                        cur = Some(c);
                        c
                    }
                };
                self.segs[seg].stmts.push(s);
                self.unit_stmt(s, seg, 0)?;
                continue;
            }
            cur = None;
            match s {
                Stmt::Barrier => {}
                Stmt::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    let i = self.check(*cond)?;
                    let masks = if self.uniform[i] {
                        None
                    } else {
                        // Each unit's condition is read from its slot at cube level.
                        let id = self.new_seg();
                        self.use_(*cond, id)?;
                        self.spilled[i] = true;
                        self.mask_slots += 2;
                        Some((self.mask_slots - 2, self.mask_slots - 1))
                    };
                    let then = self.cube_block(&then.stmts)?;
                    let otherwise = self.cube_block(&otherwise.stmts)?;
                    nodes.push(CubeNode::If {
                        cond: *cond,
                        then,
                        otherwise,
                        masks,
                    });
                }
                Stmt::Range {
                    var,
                    start,
                    end,
                    step,
                    body,
                } => {
                    for v in [start, end, step] {
                        self.require_uniform(*v, "a range loop")?;
                    }
                    let i = self.check(*var)?;
                    self.uniform[i] = true;
                    self.cube_loops.push(false);
                    let body = self.cube_block(&body.stmts);
                    self.cube_loops.pop();
                    let body = body?;
                    nodes.push(CubeNode::Range {
                        var: *var,
                        start: *start,
                        end: *end,
                        step: *step,
                        body,
                    });
                }
                Stmt::Loop { body } => {
                    self.mask_slots += 2;
                    let (active, resume) = (self.mask_slots - 2, self.mask_slots - 1);
                    self.cube_loops.push(true);
                    let body = self.cube_block(&body.stmts);
                    self.cube_loops.pop();
                    nodes.push(CubeNode::Loop {
                        body: body?,
                        active,
                        resume,
                    });
                }
                _ => unreachable!("only blocks hold barriers"),
            }
        }
        Ok(nodes)
    }

    fn use_(&mut self, v: ValueId, seg: usize) -> Result<(), String> {
        let i = self.check(v)?;
        if self.uniform[i] || self.seg_of[i] == seg {
            return Ok(());
        }
        if self.seg_of[i] == NONE {
            return Err(format!("value %{} is used before its definition", v.0));
        }
        if self.unit_builtin[i].is_none() {
            self.spilled[i] = true;
        }
        if !self.segs[seg].live_in.contains(&v) {
            self.segs[seg].live_in.push(v);
        }
        Ok(())
    }

    fn touch_var(&mut self, var: VarId, seg: usize) -> Result<(), String> {
        let i = var.0 as usize;
        if i >= self.var_seg.len() {
            return Err(format!("variable {i} is not declared"));
        }
        match self.var_seg[i] {
            None => self.var_seg[i] = Some(seg),
            Some(s) if s != seg => self.var_in_memory[i] = true,
            Some(_) => {}
        }
        Ok(())
    }

    fn unit_stmt(&mut self, s: &'a Stmt, seg: usize, loops: u32) -> Result<(), String> {
        match s {
            Stmt::Let { out, op } => {
                if is_plane(op) {
                    return Err("plane operations under control flow".into());
                }
                let ops = operands(op);
                for &v in &ops {
                    self.use_(v, seg)?;
                }
                if let Op::ReadVar(var) = op {
                    self.touch_var(*var, seg)?;
                }
                let i = self.check(*out)?;
                let pure = match op {
                    Op::Literal(_) | Op::Scalar(_) | Op::Len(_) | Op::Rank(_) => true,
                    Op::Builtin(b) => cube_builtin(*b),
                    Op::Load { .. } | Op::ReadVar(_) | Op::Atomic { .. } => false,
                    Op::Plane(..)
                    | Op::PlaneBroadcast(..)
                    | Op::PlaneShuffle(..)
                    | Op::Ballot(_) => false,
                    _ => ops.iter().all(|v| self.uniform[v.0 as usize]),
                };
                if pure {
                    self.uniform[i] = true;
                    self.segs[seg].hoisted.push((*out, op));
                } else {
                    self.seg_of[i] = seg;
                    if let Op::Builtin(b) = op {
                        self.unit_builtin[i] = Some(*b);
                    }
                }
            }
            Stmt::Store { index, value, .. } => {
                self.use_(*index, seg)?;
                self.use_(*value, seg)?;
            }
            Stmt::DeclareVar { var, init } => {
                self.use_(*init, seg)?;
                self.touch_var(*var, seg)?;
            }
            Stmt::Assign { var, value } => {
                self.use_(*value, seg)?;
                self.touch_var(*var, seg)?;
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.use_(*cond, seg)?;
                for s in then.stmts.iter().chain(&otherwise.stmts) {
                    self.unit_stmt(s, seg, loops)?;
                }
            }
            Stmt::Range {
                var,
                start,
                end,
                step,
                body,
            } => {
                for v in [start, end, step] {
                    self.use_(*v, seg)?;
                }
                let i = self.check(*var)?;
                self.seg_of[i] = seg;
                for s in &body.stmts {
                    self.unit_stmt(s, seg, loops + 1)?;
                }
            }
            Stmt::Loop { body } => {
                for s in &body.stmts {
                    self.unit_stmt(s, seg, loops + 1)?;
                }
            }
            Stmt::Break | Stmt::Continue if loops == 0 && self.cube_loops.last() != Some(&true) => {
                return Err(
                    "`break` or `continue` out of a range loop that holds a barrier".into(),
                );
            }
            Stmt::Break | Stmt::Continue => {}
            Stmt::Return => self.has_return = true,
            Stmt::Barrier => unreachable!("barrier statements run at cube level"),
        }
        Ok(())
    }
}
