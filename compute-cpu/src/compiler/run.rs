//! Running a plan: cubes over worker threads, the units of a cube in lockstep under masks.

use core::mem::take;
use core::ops::Range;

use compute_core::kernel::{Builtin, MemRef, ScalarValue};
use rayon::prelude::*;

use super::PLANE_SIZE;
use super::global::{self, AtomicArgs, AtomicTarget, GlobalMem};
use super::lanes::view_mut;
use super::plan::{Inst, Node, Plan, scalar_bits};

/// Everything a launch binds, shared by all workers.
pub(crate) struct Launch<'a> {
    pub bufs: Vec<GlobalMem>,
    pub shapes: Vec<&'a [usize]>,
    pub strides: Vec<&'a [usize]>,
    pub scalars: &'a [ScalarValue],
    pub cube_count: [u32; 3],
    pub checked: bool,
}

/// One worker's registers and memories.
struct State {
    regs: Vec<Vec<u64>>,
    shared: Vec<Vec<u64>>,
    locals: Vec<Vec<u64>>,
    idx: Vec<u64>,
    pool: Vec<Vec<u8>>,
    continues: Vec<Vec<u8>>,
    returned: Vec<u8>,
    cube: [u32; 3],
    cube_linear: u32,
}

impl State {
    fn new(plan: &Plan) -> Self {
        Self {
            regs: plan.reg_words.iter().map(|&w| vec![0; w]).collect(),
            shared: plan.shared_words.iter().map(|&w| vec![0; w]).collect(),
            locals: plan.local_words.iter().map(|&w| vec![0; w]).collect(),
            idx: vec![0; plan.lanes],
            pool: Vec::new(),
            continues: Vec::new(),
            returned: vec![0; plan.lanes],
            cube: [0; 3],
            cube_linear: 0,
        }
    }

    fn mask_like(&mut self, src: &[u8]) -> Vec<u8> {
        let mut m = self.pool.pop().unwrap_or_default();
        m.clear();
        m.extend_from_slice(src);
        m
    }
}

fn any(mask: &[u8]) -> bool {
    mask.iter().any(|&m| m != 0)
}

impl Plan {
    /// Run every cube of the launch.
    pub(crate) fn run_launch(&self, launch: &Launch<'_>) {
        let [x, y, z] = launch.cube_count;
        let total = x as u64 * y as u64 * z as u64;
        let (chunk, chunks, threads) = super::split(total);
        if chunks <= 1 || threads == 1 {
            self.run_cubes(launch, 0..total);
        } else {
            (0..chunks).into_par_iter().for_each(|c| {
                self.run_cubes(launch, c * chunk..((c + 1) * chunk).min(total));
            });
        }
    }

    fn run_cubes(&self, launch: &Launch<'_>, cubes: Range<u64>) {
        let mut st = State::new(self);
        let mut mask = vec![1u8; self.lanes];
        for inst in &self.init {
            self.exec(inst, &mut st, launch, &mask);
        }
        let [cx, cy, _] = launch.cube_count;
        for cube in cubes {
            st.cube_linear = cube as u32;
            st.cube = [
                (cube % cx as u64) as u32,
                ((cube / cx as u64) % cy as u64) as u32,
                (cube / (cx as u64 * cy as u64)) as u32,
            ];
            mask.fill(1);
            for inst in &self.per_cube {
                self.exec(inst, &mut st, launch, &mask);
            }
            st.returned.fill(0);
            self.run_block(&self.body, &mut st, launch, &mut mask);
        }
    }

    fn run_block(&self, nodes: &[Node], st: &mut State, launch: &Launch<'_>, mask: &mut [u8]) {
        for node in nodes {
            match node {
                Node::Inst(inst) => self.exec(inst, st, launch, mask),
                Node::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    let mut t = st.mask_like(mask);
                    let mut e = st.mask_like(mask);
                    let c = &st.regs[*cond];
                    let c: &[u8] = &bytemuck::cast_slice(c)[..self.lanes];
                    for ((t, e), &c) in t.iter_mut().zip(e.iter_mut()).zip(c) {
                        *t &= c;
                        *e &= c ^ 1;
                    }
                    if any(&t) {
                        self.run_block(then, st, launch, &mut t);
                    }
                    if !otherwise.is_empty() && any(&e) {
                        self.run_block(otherwise, st, launch, &mut e);
                    }
                    for ((m, &t), &e) in mask.iter_mut().zip(&t).zip(&e) {
                        *m = t | e;
                    }
                    st.pool.push(t);
                    st.pool.push(e);
                    if !any(mask) {
                        return;
                    }
                }
                Node::Loop(body) => {
                    let mut m = st.mask_like(mask);
                    let cont = st.mask_like(mask);
                    st.continues.push(cont);
                    if let Some(c) = st.continues.last_mut() {
                        c.fill(0);
                    }
                    while any(&m) {
                        self.run_block(body, st, launch, &mut m);
                        self.rejoin_continues(st, &mut m);
                    }
                    self.leave_loop(st, m, mask);
                    if !any(mask) {
                        return;
                    }
                }
                Node::Range {
                    var,
                    start,
                    end,
                    step,
                    fns,
                    body,
                } => {
                    let words = st.regs[*var].len();
                    let src = take(&mut st.regs[*start]);
                    st.regs[*var][..words].copy_from_slice(&src[..words]);
                    st.regs[*start] = src;
                    let mut m = st.mask_like(mask);
                    let cont = st.mask_like(mask);
                    st.continues.push(cont);
                    if let Some(c) = st.continues.last_mut() {
                        c.fill(0);
                    }
                    (fns.test)(&st.regs[*var], &st.regs[*end], &st.regs[*step], &mut m);
                    while any(&m) {
                        self.run_block(body, st, launch, &mut m);
                        self.rejoin_continues(st, &mut m);
                        let mut v = take(&mut st.regs[*var]);
                        (fns.advance)(&mut v, &st.regs[*step], &mut m);
                        (fns.test)(&v, &st.regs[*end], &st.regs[*step], &mut m);
                        st.regs[*var] = v;
                    }
                    self.leave_loop(st, m, mask);
                    if !any(mask) {
                        return;
                    }
                }
                Node::Break => {
                    mask.fill(0);
                    return;
                }
                Node::Continue => {
                    if let Some(c) = st.continues.last_mut() {
                        for (c, &m) in c.iter_mut().zip(mask.iter()) {
                            *c |= m;
                        }
                    }
                    mask.fill(0);
                    return;
                }
                Node::Return => {
                    for (r, &m) in st.returned.iter_mut().zip(mask.iter()) {
                        *r |= m;
                    }
                    mask.fill(0);
                    return;
                }
            }
        }
    }

    /// Units that continued come back for the next iteration.
    fn rejoin_continues(&self, st: &mut State, m: &mut [u8]) {
        if let Some(c) = st.continues.last_mut() {
            for (m, c) in m.iter_mut().zip(c.iter_mut()) {
                *m |= *c;
                *c = 0;
            }
        }
    }

    /// Units that broke out resume after the loop; units that returned stay stopped.
    fn leave_loop(&self, st: &mut State, m: Vec<u8>, mask: &mut [u8]) {
        if let Some(c) = st.continues.pop() {
            st.pool.push(c);
        }
        st.pool.push(m);
        for (m, &r) in mask.iter_mut().zip(&st.returned) {
            *m &= r ^ 1;
        }
    }

    fn exec(&self, inst: &Inst, st: &mut State, launch: &Launch<'_>, mask: &[u8]) {
        let lanes = self.lanes;
        match inst {
            Inst::Fill { out, bits, f, n } => f(&mut st.regs[*out], *bits, *n),
            Inst::Scalar { index, out, f, n } => {
                f(&mut st.regs[*out], scalar_bits(launch.scalars[*index]), *n)
            }
            Inst::Builtin { builtin, out } => self.builtin(
                *builtin,
                &mut st.regs[*out],
                st.cube,
                st.cube_linear,
                launch,
            ),
            Inst::Unary { f, x, out, n } => {
                let mut o = take(&mut st.regs[*out]);
                f(&st.regs[*x], &mut o, *n);
                st.regs[*out] = o;
            }
            Inst::Binary { f, a, b, out, n } => {
                let mut o = take(&mut st.regs[*out]);
                f(&st.regs[*a], &st.regs[*b], &mut o, *n);
                st.regs[*out] = o;
            }
            Inst::Ternary { f, a, b, c, out, n } => {
                let mut o = take(&mut st.regs[*out]);
                f(&st.regs[*a], &st.regs[*b], &st.regs[*c], &mut o, *n);
                st.regs[*out] = o;
            }
            Inst::Copy { src, dst } => {
                let mut o = take(&mut st.regs[*dst]);
                let s = &st.regs[*src];
                let w = o.len().min(s.len());
                o[..w].copy_from_slice(&s[..w]);
                st.regs[*dst] = o;
            }
            Inst::Assign { f, src, dst, width } => {
                let mut o = take(&mut st.regs[*dst]);
                f(&st.regs[*src], &mut o, mask, *width);
                st.regs[*dst] = o;
            }
            Inst::Reshape {
                f,
                x,
                out,
                shape,
                arg,
            } => {
                let mut o = take(&mut st.regs[*out]);
                f(&st.regs[*x], &mut o, *shape, *arg);
                st.regs[*out] = o;
            }
            Inst::Compose {
                base,
                parts,
                f,
                out,
                shape,
            } => {
                let mut o = take(&mut st.regs[*out]);
                if let Some(b) = base {
                    let w = o.len();
                    o.copy_from_slice(&st.regs[*b][..w]);
                }
                for &(p, c) in parts {
                    f(&st.regs[p], &mut o, *shape, c);
                }
                st.regs[*out] = o;
            }
            Inst::LoadGlobal {
                buf,
                index,
                idx,
                out,
                f,
                run,
            } => {
                let mem = &launch.bufs[*buf];
                if let Some(first) = self.linear_run(*run, mem, st.cube_linear, mask) {
                    let mut o = take(&mut st.regs[*out]);
                    if let Some(run) = run {
                        run(mem, first, &mut o, lanes);
                    }
                    st.regs[*out] = o;
                    return;
                }
                idx(&st.regs[*index], &mut st.idx, lanes);
                let mut o = take(&mut st.regs[*out]);
                f(&launch.bufs[*buf], &st.idx, &mut o, mask, launch.checked);
                st.regs[*out] = o;
            }
            Inst::StoreGlobal {
                buf,
                index,
                idx,
                value,
                f,
                run,
            } => {
                let mem = &launch.bufs[*buf];
                if let Some(first) = self.linear_run(*run, mem, st.cube_linear, mask) {
                    if let Some(run) = run {
                        run(mem, first, &st.regs[*value], lanes);
                    }
                    return;
                }
                idx(&st.regs[*index], &mut st.idx, lanes);
                f(
                    &launch.bufs[*buf],
                    &st.idx,
                    &st.regs[*value],
                    mask,
                    launch.checked,
                );
            }
            Inst::LoadArray {
                shared,
                arr,
                index,
                idx,
                out,
                f,
                access,
            } => {
                idx(&st.regs[*index], &mut st.idx, lanes);
                let mut o = take(&mut st.regs[*out]);
                let a = if *shared {
                    &st.shared[*arr]
                } else {
                    &st.locals[*arr]
                };
                f(a, &st.idx, &mut o, mask, *access);
                st.regs[*out] = o;
            }
            Inst::StoreArray {
                shared,
                arr,
                index,
                idx,
                value,
                f,
                access,
            } => {
                idx(&st.regs[*index], &mut st.idx, lanes);
                let a = if *shared {
                    &mut st.shared[*arr]
                } else {
                    &mut st.locals[*arr]
                };
                f(a, &st.idx, &st.regs[*value], mask, *access);
            }
            Inst::Len { buf, out } => {
                let len = launch.bufs[*buf].len().min(u32::MAX as u64) as u32;
                view_mut::<u32>(&mut st.regs[*out], lanes).fill(len);
            }
            Inst::Rank { buf, out } => {
                let rank = launch.shapes[*buf].len() as u32;
                view_mut::<u32>(&mut st.regs[*out], lanes).fill(rank);
            }
            Inst::Meta {
                buf,
                dim,
                idx,
                out,
                stride,
            } => {
                idx(&st.regs[*dim], &mut st.idx, lanes);
                let meta = if *stride {
                    launch.strides[*buf]
                } else {
                    launch.shapes[*buf]
                };
                let o = view_mut::<u32>(&mut st.regs[*out], lanes);
                for (o, &d) in o.iter_mut().zip(&st.idx) {
                    let v = usize::try_from(d)
                        .ok()
                        .and_then(|d| meta.get(d))
                        .copied()
                        .unwrap_or(0);
                    *o = v.min(u32::MAX as usize) as u32;
                }
            }
            Inst::Atomic {
                mem,
                op,
                index,
                idx,
                value,
                compare,
                out,
                f,
                len,
            } => {
                idx(&st.regs[*index], &mut st.idx, lanes);
                let target = match mem {
                    MemRef::Global(b) => {
                        AtomicTarget::global(&launch.bufs[*b as usize], launch.checked)
                    }
                    MemRef::Shared(s) => {
                        let arr = &mut st.shared[*s as usize];
                        AtomicTarget {
                            ptr: arr.as_mut_ptr().cast(),
                            len: *len,
                            checked: true,
                        }
                    }
                    MemRef::Local(_) => {
                        unreachable!("the compiler rejects atomics on local arrays")
                    }
                };
                let mut o = take(&mut st.regs[*out]);
                let args = AtomicArgs {
                    op: *op,
                    idx: &st.idx,
                    value: &st.regs[*value],
                    compare: &st.regs[*compare],
                    mask,
                };
                // SAFETY: global targets come from `GlobalMem` (valid and aligned for the launch,
                // out-of-range entries skipped when checked or promised absent when unchecked);
                // shared targets point at this worker's own array of `len` entries, which no
                // reference aliases during the call.
                unsafe { f(&target, &args, &mut o) };
                st.regs[*out] = o;
            }
            Inst::Accumulate {
                f,
                a,
                b,
                acc,
                tmp,
                masked,
                width,
            } => {
                let mut v = take(&mut st.regs[*acc]);
                if global::all_active(mask) {
                    f(&st.regs[*a], &st.regs[*b], &mut v, lanes, *width);
                } else {
                    let mut t = take(&mut st.regs[*tmp]);
                    t.copy_from_slice(&v);
                    f(&st.regs[*a], &st.regs[*b], &mut t, lanes, *width);
                    masked(&t, &mut v, mask, *width);
                    st.regs[*tmp] = t;
                }
                st.regs[*acc] = v;
            }
            Inst::Plane {
                f,
                x,
                lane,
                out,
                width,
            } => {
                let mut o = take(&mut st.regs[*out]);
                f(&st.regs[*x], &st.regs[*lane], &mut o, mask, *width);
                st.regs[*out] = o;
            }
        }
    }

    /// The first entry when an `absolute_pos`-indexed access of this cube is one contiguous,
    /// in-range run with every unit active.
    fn linear_run<F>(
        &self,
        run: Option<F>,
        mem: &GlobalMem,
        cube: u32,
        mask: &[u8],
    ) -> Option<u64> {
        run?;
        let first = cube as u64 * self.lanes as u64;
        // `absolute_pos` is a wrapping u32: past 2^32 it is not contiguous.
        let fits = first + self.lanes as u64 <= 1 << 32;
        (fits && global::run_in_range(mem, first, self.lanes) && global::all_active(mask))
            .then_some(first)
    }

    fn builtin(
        &self,
        b: Builtin,
        out: &mut [u64],
        cube: [u32; 3],
        cube_linear: u32,
        launch: &Launch<'_>,
    ) {
        let [dx, dy, dz] = self.cube_dim;
        let [cx, cy, cz] = launch.cube_count;
        let o = view_mut::<u32>(out, self.lanes);
        let unit = |l: usize| {
            let l = l as u32;
            [l % dx, (l / dx) % dy, l / (dx * dy)]
        };
        let uniform = |o: &mut [u32], v: u32| o.fill(v);
        match b {
            Builtin::UnitPos => o.iter_mut().enumerate().for_each(|(l, o)| *o = l as u32),
            Builtin::UnitPosX => o.iter_mut().enumerate().for_each(|(l, o)| *o = unit(l)[0]),
            Builtin::UnitPosY => o.iter_mut().enumerate().for_each(|(l, o)| *o = unit(l)[1]),
            Builtin::UnitPosZ => o.iter_mut().enumerate().for_each(|(l, o)| *o = unit(l)[2]),
            Builtin::UnitPosPlane => o
                .iter_mut()
                .enumerate()
                .for_each(|(l, o)| *o = l as u32 % PLANE_SIZE),
            Builtin::PlaneSize => uniform(o, PLANE_SIZE),
            Builtin::CubeDim => uniform(o, dx * dy * dz),
            Builtin::CubeDimX => uniform(o, dx),
            Builtin::CubeDimY => uniform(o, dy),
            Builtin::CubeDimZ => uniform(o, dz),
            Builtin::CubeCount => uniform(o, cx.wrapping_mul(cy).wrapping_mul(cz)),
            Builtin::CubeCountX => uniform(o, cx),
            Builtin::CubeCountY => uniform(o, cy),
            Builtin::CubeCountZ => uniform(o, cz),
            Builtin::CubePos => uniform(o, cube_linear),
            Builtin::CubePosX => uniform(o, cube[0]),
            Builtin::CubePosY => uniform(o, cube[1]),
            Builtin::CubePosZ => uniform(o, cube[2]),
            Builtin::AbsolutePos => {
                let base = cube_linear.wrapping_mul(dx * dy * dz);
                o.iter_mut()
                    .enumerate()
                    .for_each(|(l, o)| *o = base.wrapping_add(l as u32));
            }
            Builtin::AbsolutePosX => {
                let base = cube[0].wrapping_mul(dx);
                o.iter_mut()
                    .enumerate()
                    .for_each(|(l, o)| *o = base.wrapping_add(unit(l)[0]));
            }
            Builtin::AbsolutePosY => {
                let base = cube[1].wrapping_mul(dy);
                o.iter_mut()
                    .enumerate()
                    .for_each(|(l, o)| *o = base.wrapping_add(unit(l)[1]));
            }
            Builtin::AbsolutePosZ => {
                let base = cube[2].wrapping_mul(dz);
                o.iter_mut()
                    .enumerate()
                    .for_each(|(l, o)| *o = base.wrapping_add(unit(l)[2]));
            }
        }
    }
}
