//! Lowering of a kernel body: each statement becomes Rust code that calls the expansion builder
//! (`__k`, a `compute_core::kernel::expand::Ctx`); each expression becomes Rust code of type
//! `Expr` (a kernel value or a build-time constant).
//!
//! What is known here, statically, is what every name is (a buffer, a variable, a value, a
//! build-time value, or a Rust item such as a `const`) and whether an expression depends on the
//! unit (`runtime`): an `if` or `while` on build-time values only is decided while building.
//!
//! Size: one arm per Rust statement and expression form the kernel macro accepts; they share
//! the lowering context and read best side by side.

use std::collections::HashMap;

use proc_macro2::TokenStream as Tokens;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{BinOp, Error, Expr, Ident, Pat, Result, Stmt, Type, UnOp};

use crate::SUPPORTED;

/// What a name of the kernel body is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sym {
    /// An `Expr` (a `let`, a scalar parameter, a loop counter); `runtime` when it depends on the unit.
    Value { runtime: bool },
    /// A kernel variable (`let mut`).
    Var,
    /// A build-time mutable `Expr` (`#[comptime] let mut`).
    Comptime,
    /// A global buffer parameter.
    Buffer { writable: bool },
    /// A shared memory array.
    Shared,
    /// A local array.
    Local,
}

impl Sym {
    fn is_memory(self) -> bool {
        matches!(self, Sym::Buffer { .. } | Sym::Shared | Sym::Local)
    }
}

/// A lowered expression: Rust code of type `Expr`, and whether it depends on the unit.
struct Lowered {
    ts: Tokens,
    runtime: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum LoopKind {
    Kernel,
    Unrolled,
}

pub(crate) struct Lowerer {
    scopes: Vec<HashMap<String, Sym>>,
    loops: Vec<LoopKind>,
}

fn unsupported(node: impl quote::ToTokens, what: &str) -> Error {
    Error::new_spanned(
        node,
        format!("{what} is not supported in a #[kernel] function; {SUPPORTED}"),
    )
}

fn m() -> Tokens {
    quote!(::compute_core::kernel::expand)
}

fn ir() -> Tokens {
    quote!(::compute_core::kernel)
}

/// `<T as KernelElem>::ELEM`, with `usize` standing for the kernel index type `u32`.
fn elem_of(ty: &Type) -> Tokens {
    let k = ir();
    if let Type::Path(p) = ty
        && p.path.is_ident("usize")
    {
        return quote!(::compute_core::ElemType::U32);
    }
    quote_spanned!(ty.span()=> <#ty as #k::KernelElem>::ELEM)
}

const BUILTINS: &[(&str, &str)] = &[
    ("ABSOLUTE_POS", "AbsolutePos"),
    ("ABSOLUTE_POS_X", "AbsolutePosX"),
    ("ABSOLUTE_POS_Y", "AbsolutePosY"),
    ("ABSOLUTE_POS_Z", "AbsolutePosZ"),
    ("UNIT_POS", "UnitPos"),
    ("UNIT_POS_X", "UnitPosX"),
    ("UNIT_POS_Y", "UnitPosY"),
    ("UNIT_POS_Z", "UnitPosZ"),
    ("CUBE_POS", "CubePos"),
    ("CUBE_POS_X", "CubePosX"),
    ("CUBE_POS_Y", "CubePosY"),
    ("CUBE_POS_Z", "CubePosZ"),
    ("CUBE_DIM", "CubeDim"),
    ("CUBE_DIM_X", "CubeDimX"),
    ("CUBE_DIM_Y", "CubeDimY"),
    ("CUBE_DIM_Z", "CubeDimZ"),
    ("CUBE_COUNT", "CubeCount"),
    ("CUBE_COUNT_X", "CubeCountX"),
    ("CUBE_COUNT_Y", "CubeCountY"),
    ("CUBE_COUNT_Z", "CubeCountZ"),
    ("PLANE_DIM", "PlaneSize"),
    ("UNIT_POS_PLANE", "UnitPosPlane"),
];

const UNARY_METHODS: &[(&str, &str)] = &[
    ("sqrt", "Sqrt"),
    ("rsqrt", "Rsqrt"),
    ("exp", "Exp"),
    ("ln", "Log"),
    ("ln_1p", "Log1p"),
    ("sin", "Sin"),
    ("cos", "Cos"),
    ("tanh", "Tanh"),
    ("erf", "Erf"),
    ("floor", "Floor"),
    ("ceil", "Ceil"),
    ("round_ties_even", "Round"),
    ("recip", "Recip"),
    ("abs", "Abs"),
];

const BINARY_METHODS: &[(&str, &str)] = &[("min", "Min"), ("max", "Max"), ("powf", "Pow")];

const PLANE_OPS: &[(&str, &str)] = &[
    ("plane_sum", "Sum"),
    ("plane_prod", "Prod"),
    ("plane_min", "Min"),
    ("plane_max", "Max"),
    ("plane_all", "All"),
    ("plane_any", "Any"),
];

const ATOMICS: &[(&str, &str)] = &[
    ("atomic_add", "Add"),
    ("atomic_sub", "Sub"),
    ("atomic_min", "Min"),
    ("atomic_max", "Max"),
    ("atomic_exchange", "Exchange"),
    ("atomic_and", "And"),
    ("atomic_or", "Or"),
    ("atomic_xor", "Xor"),
];

fn lookup(table: &[(&str, &str)], name: &str) -> Option<Ident> {
    table
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| Ident::new(v, proc_macro2::Span::call_site()))
}

/// Whether evaluating `e` reads memory or calls something (then `&&`/`||` must not evaluate it
/// where the left side already decided).
fn has_effects(e: &Expr) -> bool {
    struct V(bool);
    impl<'a> Visit<'a> for V {
        fn visit_expr(&mut self, e: &'a Expr) {
            if matches!(e, Expr::Index(_) | Expr::Call(_) | Expr::MethodCall(_)) {
                self.0 = true;
            }
            syn::visit::visit_expr(self, e);
        }
    }
    let mut v = V(false);
    v.visit_expr(e);
    v.0
}

/// The operation of a binary operator, `(method, op)` in `Ctx`.
fn binary_op(op: &BinOp) -> Option<(&'static str, &'static str)> {
    Some(match op {
        BinOp::Add(_) | BinOp::AddAssign(_) => ("binary", "Add"),
        BinOp::Sub(_) | BinOp::SubAssign(_) => ("binary", "Sub"),
        BinOp::Mul(_) | BinOp::MulAssign(_) => ("binary", "Mul"),
        BinOp::Div(_) | BinOp::DivAssign(_) => ("binary", "Div"),
        BinOp::Rem(_) | BinOp::RemAssign(_) => ("binary", "Rem"),
        BinOp::BitAnd(_) | BinOp::BitAndAssign(_) => ("binary", "BitAnd"),
        BinOp::BitOr(_) | BinOp::BitOrAssign(_) => ("binary", "BitOr"),
        BinOp::BitXor(_) | BinOp::BitXorAssign(_) => ("binary", "BitXor"),
        BinOp::Shl(_) | BinOp::ShlAssign(_) => ("binary", "Shl"),
        BinOp::Shr(_) | BinOp::ShrAssign(_) => ("binary", "Shr"),
        BinOp::Eq(_) => ("compare", "Eq"),
        BinOp::Ne(_) => ("compare", "Ne"),
        BinOp::Lt(_) => ("compare", "Lt"),
        BinOp::Le(_) => ("compare", "Le"),
        BinOp::Gt(_) => ("compare", "Gt"),
        BinOp::Ge(_) => ("compare", "Ge"),
        _ => return None,
    })
}

fn is_compound_assign(op: &BinOp) -> bool {
    matches!(
        op,
        BinOp::AddAssign(_)
            | BinOp::SubAssign(_)
            | BinOp::MulAssign(_)
            | BinOp::DivAssign(_)
            | BinOp::RemAssign(_)
            | BinOp::BitAndAssign(_)
            | BinOp::BitOrAssign(_)
            | BinOp::BitXorAssign(_)
            | BinOp::ShlAssign(_)
            | BinOp::ShrAssign(_)
    )
}

fn op_tokens(method: &str, op: &str) -> Tokens {
    let k = ir();
    let op = Ident::new(op, proc_macro2::Span::call_site());
    if method == "binary" {
        quote!(#k::BinaryOp::#op)
    } else {
        quote!(#k::CmpOp::#op)
    }
}

fn single_ident(e: &Expr) -> Option<&Ident> {
    match e {
        Expr::Path(p) if p.qself.is_none() => p.path.get_ident(),
        Expr::Paren(p) => single_ident(&p.expr),
        _ => None,
    }
}

/// `SharedMemory::<T>::new(len)` / `LocalArray::<T>::new(len)`: `(shared?, element type, len)`.
fn array_decl(e: &Expr) -> Option<Result<(bool, Type, &Expr)>> {
    let Expr::Call(call) = e else { return None };
    let Expr::Path(p) = &*call.func else {
        return None;
    };
    let segs: Vec<_> = p.path.segments.iter().collect();
    if segs.len() != 2 || segs[1].ident != "new" {
        return None;
    }
    let shared = match segs[0].ident.to_string().as_str() {
        "SharedMemory" => true,
        "LocalArray" => false,
        _ => return None,
    };
    let ty = match &segs[0].arguments {
        syn::PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
            syn::GenericArgument::Type(t) => t.clone(),
            other => {
                return Some(Err(Error::new_spanned(
                    other,
                    "expected an element type: `SharedMemory::<f32>` or `SharedMemory::<[f32; 4]>`",
                )));
            }
        },
        _ => {
            return Some(Err(Error::new_spanned(
                segs[0],
                "name the element type: `SharedMemory::<f32>::new(len)`, `LocalArray::<[f32; 4]>::new(len)`",
            )));
        }
    };
    if call.args.len() != 1 {
        return Some(Err(Error::new_spanned(
            &call.args,
            "`new` takes the number of entries (a build-time constant)",
        )));
    }
    Some(Ok((shared, ty, &call.args[0])))
}

impl Lowerer {
    pub(crate) fn new() -> Self {
        Self {
            scopes: vec![HashMap::new()],
            loops: Vec::new(),
        }
    }

    pub(crate) fn declare(&mut self, name: &Ident, sym: Sym) {
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name.to_string(), sym);
        }
    }

    fn find(&self, name: &Ident) -> Option<Sym> {
        let n = name.to_string();
        self.scopes.iter().rev().find_map(|s| s.get(&n).copied())
    }

    fn memory(&self, e: &Expr) -> Option<(Ident, Sym)> {
        let id = single_ident(e)?;
        let sym = self.find(id)?;
        sym.is_memory().then(|| (id.clone(), sym))
    }

    /// The statements of a block, in a new scope, as Rust statements (no braces).
    pub(crate) fn block_stmts(&mut self, stmts: &[Stmt]) -> Result<Tokens> {
        self.scopes.push(HashMap::new());
        let out: Result<Vec<Tokens>> = stmts.iter().map(|s| self.stmt(s)).collect();
        self.scopes.pop();
        let out = out?;
        Ok(quote!(#(#out)*))
    }

    fn block(&mut self, b: &syn::Block) -> Result<Tokens> {
        let inner = self.block_stmts(&b.stmts)?;
        Ok(quote!({ #inner }))
    }

    fn stmt(&mut self, s: &Stmt) -> Result<Tokens> {
        match s {
            Stmt::Local(l) => self.local(l),
            Stmt::Expr(e, _) => self.expr_stmt(e),
            Stmt::Item(syn::Item::Const(c)) => Ok(quote!(#c)),
            Stmt::Item(i) => Err(unsupported(i, "an item other than `const`")),
            Stmt::Macro(mac) => Err(unsupported(mac, "a macro call")),
        }
    }

    fn local(&mut self, l: &syn::Local) -> Result<Tokens> {
        let m = m();
        let comptime = l.attrs.iter().any(|a| a.path().is_ident("comptime"));
        if let Some(a) = l.attrs.iter().find(|a| !a.path().is_ident("comptime")) {
            return Err(unsupported(
                a,
                "this attribute on `let` (only `#[comptime]`)",
            ));
        }
        let (pat, ty) = match &l.pat {
            Pat::Type(pt) => (&*pt.pat, Some(&*pt.ty)),
            p => (p, None),
        };
        let Pat::Ident(pi) = pat else {
            return Err(unsupported(pat, "this pattern (a `let` binds one name)"));
        };
        if pi.by_ref.is_some() || pi.subpat.is_some() {
            return Err(unsupported(pat, "this pattern (a `let` binds one name)"));
        }
        let name = &pi.ident;
        let name_str = name.to_string();
        let Some(init) = &l.init else {
            return Err(Error::new_spanned(
                l,
                "a kernel `let` needs a value (`let x = ...;`)",
            ));
        };
        if let Some((_, d)) = &init.diverge {
            return Err(unsupported(d, "`let ... else`"));
        }
        let init = &*init.expr;
        if let Some(decl) = array_decl(init) {
            let (shared, elem_ty, len) = decl?;
            let (elem, width) = crate::elem_and_width(&elem_ty);
            let elem = elem_of(&elem);
            let (method, sym) = if shared {
                (quote!(shared), Sym::Shared)
            } else {
                (quote!(local), Sym::Local)
            };
            self.declare(name, sym);
            return Ok(quote_spanned! {init.span()=>
                let #name = __k.#method(#name_str, #elem, #width, #len);
            });
        }
        let v = self.expr(init)?;
        let ts = v.ts;
        let out = if comptime {
            if pi.mutability.is_none() {
                return Err(Error::new_spanned(
                    l,
                    "`#[comptime]` marks a `let mut` whose value is known while building (plain `let`s of constants are build-time already)",
                ));
            }
            self.declare(name, Sym::Comptime);
            match ty {
                Some(t) => {
                    let e = elem_of(t);
                    quote!(let mut #name: #m::Expr = { let __v = #ts; __k.typed(__v, #e) };)
                }
                None => quote!(let mut #name: #m::Expr = #ts;),
            }
        } else if pi.mutability.is_some() {
            self.declare(name, Sym::Var);
            match ty {
                Some(t) => {
                    let e = elem_of(t);
                    quote!(let #name = { let __v = #ts; __k.var_typed(#name_str, __v, #e) };)
                }
                None => quote!(let #name = { let __v = #ts; __k.var(#name_str, __v) };),
            }
        } else {
            self.declare(name, Sym::Value { runtime: v.runtime });
            match ty {
                Some(t) => {
                    let e = elem_of(t);
                    quote!(let #name: #m::Expr = { let __v = #ts; __k.typed(__v, #e) };)
                }
                None => quote!(let #name: #m::Expr = #ts;),
            }
        };
        Ok(out)
    }

    fn expr_stmt(&mut self, e: &Expr) -> Result<Tokens> {
        match e {
            Expr::Assign(a) => self.assign(&a.left, None, &a.right, e),
            Expr::Binary(b) if is_compound_assign(&b.op) => {
                self.assign(&b.left, Some(&b.op), &b.right, e)
            }
            Expr::If(i) => self.if_stmt(i),
            Expr::ForLoop(f) => self.for_loop(f),
            Expr::While(w) => self.while_loop(w),
            Expr::Loop(l) => {
                if let Some(label) = &l.label {
                    return Err(unsupported(label, "a loop label"));
                }
                self.loops.push(LoopKind::Kernel);
                let body = self.block(&l.body);
                self.loops.pop();
                let body = body?;
                Ok(quote!({ __k.begin_loop(); #body __k.end_loop(); }))
            }
            Expr::Block(b) => {
                if b.label.is_some() {
                    return Err(unsupported(b, "a labelled block"));
                }
                self.block(&b.block)
            }
            Expr::Break(b) => {
                if b.label.is_some() || b.expr.is_some() {
                    return Err(unsupported(b, "`break` with a label or a value"));
                }
                self.check_loop(e, "break")?;
                Ok(quote!(__k.break_();))
            }
            Expr::Continue(c) => {
                if c.label.is_some() {
                    return Err(unsupported(c, "`continue` with a label"));
                }
                self.check_loop(e, "continue")?;
                Ok(quote!(__k.continue_();))
            }
            Expr::Return(r) => {
                if let Some(v) = &r.expr {
                    return Err(unsupported(
                        v,
                        "returning a value (a kernel writes its results to `&mut [T]` parameters)",
                    ));
                }
                Ok(quote!(__k.return_();))
            }
            Expr::Call(c) if single_ident(&c.func).is_some_and(|f| f == "sync_units") => {
                if !c.args.is_empty() {
                    return Err(Error::new_spanned(
                        &c.args,
                        "`sync_units()` takes no arguments",
                    ));
                }
                Ok(quote!(__k.barrier();))
            }
            Expr::MethodCall(mc) if mc.method == "atomic_store" => {
                let Some((mem, sym)) = self.memory(&mc.receiver) else {
                    return Err(Error::new_spanned(
                        &mc.receiver,
                        "atomics work on buffers and shared memory",
                    ));
                };
                self.check_writable(&mc.receiver, sym)?;
                let [i, v] = self.args::<2>(mc)?;
                Ok(quote!({ let __i = #i; let __v = #v; __k.atomic_store(#mem, __i, __v); }))
            }
            other => {
                let v = self.expr(other)?;
                let ts = v.ts;
                Ok(quote!(let _ = #ts;))
            }
        }
    }

    fn check_loop(&self, e: &Expr, what: &str) -> Result<()> {
        match self.loops.last() {
            None => Err(Error::new_spanned(e, format!("`{what}` outside a loop"))),
            Some(LoopKind::Unrolled) => Err(Error::new_spanned(
                e,
                format!(
                    "`{what}` in a loop unrolled while building (`#[unroll]` or a `while` on build-time values) is not supported"
                ),
            )),
            Some(LoopKind::Kernel) => Ok(()),
        }
    }

    fn check_writable(&self, e: &Expr, sym: Sym) -> Result<()> {
        if let Sym::Buffer { writable: false } = sym {
            return Err(Error::new_spanned(
                e,
                "this buffer is read-only (`&[T]`); declare the parameter `&mut [T]` to write it",
            ));
        }
        Ok(())
    }

    fn assign(
        &mut self,
        left: &Expr,
        op: Option<&BinOp>,
        right: &Expr,
        whole: &Expr,
    ) -> Result<Tokens> {
        let r = self.expr(right)?.ts;
        let combine = |old: Tokens| -> Tokens {
            match op {
                Some(op) => {
                    let (method, name) = binary_op(op).unwrap_or(("binary", "Add"));
                    let method = Ident::new(method, proc_macro2::Span::call_site());
                    let op = op_tokens("binary", name);
                    quote!({ let __old = #old; __k.#method(#op, __old, __r) })
                }
                None => quote!(__r),
            }
        };
        if let Some(id) = single_ident(left) {
            return match self.find(id) {
                Some(Sym::Var) => {
                    let new = combine(quote!(__k.get(#id)));
                    Ok(quote!({ let __r = #r; let __n = #new; __k.assign(#id, __n); }))
                }
                Some(Sym::Comptime) => {
                    let new = combine(quote!(#id));
                    Ok(quote!({ let __r = #r; #id = #new; }))
                }
                Some(Sym::Value { .. }) => Err(Error::new_spanned(
                    left,
                    format!("`{id}` is immutable; declare it `let mut {id}` to assign it"),
                )),
                Some(_) => Err(Error::new_spanned(
                    left,
                    "assign entries of memory (`x[i] = v`), not the memory",
                )),
                None => Err(Error::new_spanned(
                    left,
                    format!("`{id}` is not a kernel variable"),
                )),
            };
        }
        if let Expr::Index(ix) = left {
            if let Some((mem, sym)) = self.memory(&ix.expr) {
                self.check_writable(&ix.expr, sym)?;
                let i = self.expr(&ix.index)?.ts;
                let new = combine(quote!(__k.load(#mem, __i)));
                return Ok(
                    quote!({ let __r = #r; let __i = #i; let __n = #new; __k.store(#mem, __i, __n); }),
                );
            }
            if let Some(id) = single_ident(&ix.expr)
                && let Some(Sym::Var) = self.find(id)
            {
                let lane = self.expr(&ix.index)?.ts;
                let new = combine(quote!({ let __v = __k.get(#id); __k.extract(__v, __l) }));
                return Ok(
                    quote!({ let __r = #r; let __l = #lane; let __n = #new; __k.insert(#id, __l, __n); }),
                );
            }
        }
        Err(unsupported(
            whole,
            "this assignment target (a `let mut` variable, `x[i]` of memory, or `v[c]` of a vector variable)",
        ))
    }

    fn if_stmt(&mut self, i: &syn::ExprIf) -> Result<Tokens> {
        let cond = self.expr(&i.cond)?;
        let then = self.block(&i.then_branch)?;
        let otherwise = match &i.else_branch {
            None => quote!(),
            Some((_, e)) => match &**e {
                Expr::If(nested) => self.if_stmt(nested)?,
                Expr::Block(b) => self.block(&b.block)?,
                other => return Err(unsupported(other, "this `else`")),
            },
        };
        let c = cond.ts;
        if cond.runtime {
            Ok(quote!({
                let __c = #c;
                __k.begin_if(__c);
                #then
                __k.begin_else();
                #otherwise
                __k.end_if();
            }))
        } else {
            Ok(quote!({
                let __c = #c;
                if __k.const_bool(__c) #then else { #otherwise }
            }))
        }
    }

    /// `a..b` or `(a..b).step_by(s)`: `(start, end, step)`.
    fn range_parts<'e>(&self, e: &'e Expr) -> Result<(&'e Expr, &'e Expr, Option<&'e Expr>)> {
        let (range, step) = match e {
            Expr::MethodCall(mc) if mc.method == "step_by" && mc.args.len() == 1 => {
                (&*mc.receiver, Some(&mc.args[0]))
            }
            other => (other, None),
        };
        let range = match range {
            Expr::Paren(p) => &*p.expr,
            r => r,
        };
        match range {
            Expr::Range(r) if matches!(r.limits, syn::RangeLimits::HalfOpen(_)) => {
                match (&r.start, &r.end) {
                    (Some(s), Some(e)) => Ok((s, e, step)),
                    _ => Err(unsupported(r, "an open range")),
                }
            }
            other => Err(unsupported(
                other,
                "this loop (a kernel `for` runs over `a..b` or `(a..b).step_by(s)`)",
            )),
        }
    }

    fn for_loop(&mut self, f: &syn::ExprForLoop) -> Result<Tokens> {
        if let Some(label) = &f.label {
            return Err(unsupported(label, "a loop label"));
        }
        let unroll = f.attrs.iter().any(|a| a.path().is_ident("unroll"));
        if let Some(a) = f.attrs.iter().find(|a| !a.path().is_ident("unroll")) {
            return Err(unsupported(a, "this attribute on `for` (only `#[unroll]`)"));
        }
        let var = match &*f.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() && p.mutability.is_none() => {
                p.ident.clone()
            }
            Pat::Wild(w) => Ident::new("__unused", w.span()),
            other => return Err(unsupported(other, "this loop pattern (a name or `_`)")),
        };
        let (start, end, step) = self.range_parts(&f.expr)?;
        let s = self.expr(start)?;
        let e = self.expr(end)?;
        let st = match step {
            Some(st) => self.expr(st)?,
            None => Lowered {
                ts: {
                    let m = m();
                    quote!(#m::Expr::Int(1))
                },
                runtime: false,
            },
        };
        let runtime_bounds = s.runtime || e.runtime || st.runtime;
        if unroll && runtime_bounds {
            return Err(Error::new_spanned(
                &f.expr,
                "`#[unroll]` needs bounds and step known while building (constants, const generics, `#[comptime]` values)",
            ));
        }
        let (s, e, st) = (s.ts, e.ts, st.ts);
        self.scopes.push(HashMap::new());
        self.declare(&var, Sym::Value { runtime: !unroll });
        self.loops.push(if unroll {
            LoopKind::Unrolled
        } else {
            LoopKind::Kernel
        });
        let body = self.block(&f.body);
        self.loops.pop();
        self.scopes.pop();
        let body = body?;
        let m = m();
        if unroll {
            Ok(quote!({
                let (__s, __e, __st) = (#s, #e, #st);
                for #var in __k.unroll(__s, __e, __st) {
                    let #var: #m::Expr = #var;
                    #body
                }
            }))
        } else {
            Ok(quote!({
                let (__s, __e, __st) = (#s, #e, #st);
                let #var: #m::Expr = __k.begin_range(__s, __e, __st);
                #body
                __k.end_range();
            }))
        }
    }

    fn while_loop(&mut self, w: &syn::ExprWhile) -> Result<Tokens> {
        if let Some(label) = &w.label {
            return Err(unsupported(label, "a loop label"));
        }
        let cond = self.expr(&w.cond)?;
        let kind = if cond.runtime {
            LoopKind::Kernel
        } else {
            LoopKind::Unrolled
        };
        self.loops.push(kind);
        let body = self.block(&w.body);
        self.loops.pop();
        let body = body?;
        let c = cond.ts;
        if cond.runtime {
            Ok(quote!({
                __k.begin_loop();
                let __c = #c;
                __k.break_unless(__c);
                #body
                __k.end_loop();
            }))
        } else {
            Ok(quote!({
                while { let __c = #c; __k.const_bool(__c) } #body
            }))
        }
    }

    fn args<const N: usize>(&mut self, mc: &syn::ExprMethodCall) -> Result<[Tokens; N]> {
        if mc.args.len() != N {
            return Err(Error::new_spanned(
                mc,
                format!("`{}` takes {N} argument(s)", mc.method),
            ));
        }
        let mut out = Vec::with_capacity(N);
        for a in &mc.args {
            out.push(self.expr(a)?.ts);
        }
        Ok(out.try_into().unwrap_or_else(|_| unreachable!()))
    }

    fn call_args<const N: usize>(&mut self, c: &syn::ExprCall, name: &str) -> Result<[Tokens; N]> {
        if c.args.len() != N {
            return Err(Error::new_spanned(
                c,
                format!("`{name}` takes {N} argument(s)"),
            ));
        }
        let mut out = Vec::with_capacity(N);
        for a in &c.args {
            out.push(self.expr(a)?.ts);
        }
        Ok(out.try_into().unwrap_or_else(|_| unreachable!()))
    }

    fn expr(&mut self, e: &Expr) -> Result<Lowered> {
        let m = m();
        let k = ir();
        let lit = |ts: Tokens| Lowered { ts, runtime: false };
        let run = |ts: Tokens| Lowered { ts, runtime: true };
        match e {
            Expr::Lit(l) => match &l.lit {
                syn::Lit::Int(i) if i.suffix().is_empty() => {
                    let digits: Tokens = i.base10_digits().parse().unwrap_or_default();
                    Ok(lit(quote_spanned!(i.span()=> #m::Expr::Int(#digits))))
                }
                syn::Lit::Float(f) if f.suffix().is_empty() => {
                    Ok(lit(quote_spanned!(f.span()=> #m::Expr::Float(#f))))
                }
                syn::Lit::Int(_) | syn::Lit::Float(_) | syn::Lit::Bool(_) => {
                    Ok(lit(quote_spanned!(l.span()=> #m::Expr::constant(#l))))
                }
                other => Err(unsupported(other, "this literal")),
            },
            Expr::Paren(p) => self.expr(&p.expr),
            Expr::Group(g) => self.expr(&g.expr),
            Expr::Path(p) => {
                if let Some(id) = p.path.get_ident().filter(|_| p.qself.is_none()) {
                    if let Some(sym) = self.find(id) {
                        return match sym {
                            Sym::Value { runtime } => Ok(Lowered {
                                ts: quote!(#id),
                                runtime,
                            }),
                            Sym::Comptime => Ok(lit(quote!(#id))),
                            Sym::Var => Ok(run(quote!(__k.get(#id)))),
                            _ => Err(Error::new_spanned(
                                e,
                                format!(
                                    "`{id}` is memory: index it (`{id}[i]`) or call `{id}.len()`"
                                ),
                            )),
                        };
                    }
                    if let Some(b) = lookup(BUILTINS, &id.to_string()) {
                        return Ok(run(
                            quote_spanned!(id.span()=> __k.builtin(#k::Builtin::#b)),
                        ));
                    }
                }
                // A Rust item: a `const`, a const generic, an associated constant.
                Ok(lit(quote_spanned!(e.span()=> #m::Expr::constant(#p))))
            }
            Expr::Binary(b) => {
                let l = self.expr(&b.left)?;
                match &b.op {
                    BinOp::And(_) | BinOp::Or(_) => {
                        let and = matches!(b.op, BinOp::And(_));
                        let r = self.expr(&b.right)?;
                        let runtime = l.runtime || r.runtime;
                        let (lt, rt) = (l.ts, r.ts);
                        if l.runtime && has_effects(&b.right) {
                            return Ok(run(quote!({
                                let __l = #lt;
                                __k.begin_short(__l, #and);
                                let __r = #rt;
                                __k.end_short(__r)
                            })));
                        }
                        let op = if and {
                            quote!(#k::BinaryOp::BitAnd)
                        } else {
                            quote!(#k::BinaryOp::BitOr)
                        };
                        Ok(Lowered {
                            ts: quote!({ let __l = #lt; let __r = #rt; __k.binary(#op, __l, __r) }),
                            runtime,
                        })
                    }
                    op => {
                        let Some((method, name)) =
                            binary_op(op).filter(|_| !is_compound_assign(op))
                        else {
                            return Err(unsupported(
                                op,
                                "this operator here (compound assignments are statements)",
                            ));
                        };
                        let r = self.expr(&b.right)?;
                        let method = Ident::new(method, b.op.span());
                        let op = op_tokens(&method.to_string(), name);
                        let (lt, rt) = (l.ts, r.ts);
                        Ok(Lowered {
                            ts: quote_spanned!(b.op.span()=> { let __l = #lt; let __r = #rt; __k.#method(#op, __l, __r) }),
                            runtime: l.runtime || r.runtime,
                        })
                    }
                }
            }
            Expr::Unary(u) => {
                let x = self.expr(&u.expr)?;
                let ts = x.ts;
                let ts = match u.op {
                    UnOp::Neg(_) => quote!({ let __x = #ts; __k.neg(__x) }),
                    UnOp::Not(_) => quote!({ let __x = #ts; __k.not(__x) }),
                    _ => return Err(unsupported(u, "this unary operator (`*`)")),
                };
                Ok(Lowered {
                    ts,
                    runtime: x.runtime,
                })
            }
            Expr::Cast(c) => {
                let x = self.expr(&c.expr)?;
                let elem = elem_of(&c.ty);
                let ts = x.ts;
                Ok(Lowered {
                    ts: quote_spanned!(c.ty.span()=> { let __x = #ts; __k.cast(__x, #elem) }),
                    runtime: x.runtime,
                })
            }
            Expr::Index(ix) => {
                let i = self.expr(&ix.index)?;
                let it = i.ts;
                if let Some((mem, _)) = self.memory(&ix.expr) {
                    return Ok(run(
                        quote_spanned!(ix.span()=> { let __i = #it; __k.load(#mem, __i) }),
                    ));
                }
                let v = self.expr(&ix.expr)?;
                let vt = v.ts;
                Ok(Lowered {
                    ts: quote_spanned!(ix.span()=> { let __v = #vt; let __i = #it; __k.extract(__v, __i) }),
                    runtime: v.runtime,
                })
            }
            Expr::Array(a) => {
                let mut parts = Vec::new();
                let mut runtime = false;
                for x in &a.elems {
                    let l = self.expr(x)?;
                    runtime |= l.runtime;
                    parts.push(l.ts);
                }
                Ok(Lowered {
                    ts: quote!({ let __parts = [#(#parts),*]; __k.vector(&__parts) }),
                    runtime,
                })
            }
            Expr::Repeat(r) => {
                let x = self.expr(&r.expr)?;
                let xt = x.ts;
                let len = &r.len;
                Ok(Lowered {
                    ts: quote!({ let __x = #xt; __k.splat(__x, #len) }),
                    runtime: x.runtime,
                })
            }
            Expr::MethodCall(mc) => self.method_call(mc),
            Expr::Call(c) => self.call(c),
            Expr::If(i) => Err(unsupported(
                i,
                "`if` as a value (use `select(cond, a, b)`, or assign a `let mut` in each branch)",
            )),
            Expr::Closure(c) => Err(unsupported(c, "a closure")),
            Expr::Reference(r) => Err(unsupported(r, "a reference")),
            Expr::Macro(mac) => Err(unsupported(mac, "a macro call")),
            Expr::Match(mt) => Err(unsupported(mt, "`match`")),
            Expr::Tuple(t) => Err(unsupported(t, "a tuple")),
            Expr::Field(f) => Err(unsupported(f, "a field access")),
            Expr::Range(r) => Err(unsupported(r, "a range outside `for`")),
            Expr::Block(b) => Err(unsupported(b, "a block as a value")),
            other => Err(unsupported(other, "this expression")),
        }
    }

    fn method_call(&mut self, mc: &syn::ExprMethodCall) -> Result<Lowered> {
        let k = ir();
        let run = |ts: Tokens| Lowered { ts, runtime: true };
        let name = mc.method.to_string();
        let span = mc.method.span();
        if let Some((mem, sym)) = self.memory(&mc.receiver) {
            let is_buffer = matches!(sym, Sym::Buffer { .. });
            match name.as_str() {
                "len" | "rank" if is_buffer => {
                    self.args::<0>(mc)?;
                    let method = Ident::new(&name, span);
                    return Ok(run(quote_spanned!(span=> __k.#method(#mem))));
                }
                "shape" | "stride" if is_buffer => {
                    let [d] = self.args::<1>(mc)?;
                    let method = Ident::new(&name, span);
                    return Ok(run(
                        quote_spanned!(span=> { let __d = #d; __k.#method(#mem, __d) }),
                    ));
                }
                "atomic_load" => {
                    let [i] = self.args::<1>(mc)?;
                    return Ok(run(
                        quote_spanned!(span=> { let __i = #i; __k.atomic_load(#mem, __i) }),
                    ));
                }
                "atomic_compare_exchange" => {
                    self.check_writable(&mc.receiver, sym)?;
                    let [i, c, v] = self.args::<3>(mc)?;
                    return Ok(run(quote_spanned!(span=> {
                        let __i = #i; let __c = #c; let __v = #v;
                        __k.atomic_compare_exchange(#mem, __i, __c, __v)
                    })));
                }
                "atomic_store" => {
                    return Err(Error::new_spanned(
                        mc,
                        "`atomic_store` is a statement (it has no value)",
                    ));
                }
                _ => {}
            }
            if let Some(op) = lookup(ATOMICS, &name) {
                self.check_writable(&mc.receiver, sym)?;
                let [i, v] = self.args::<2>(mc)?;
                return Ok(run(quote_spanned!(span=> {
                    let __i = #i; let __v = #v;
                    __k.atomic(#k::AtomicOp::#op, #mem, __i, __v)
                })));
            }
            return Err(Error::new_spanned(
                &mc.method,
                format!(
                    "`{name}` is not a method of kernel memory; buffers have len, rank, shape, stride; buffers and shared memory have atomic_add/sub/min/max/and/or/xor/exchange/load/store/compare_exchange"
                ),
            ));
        }
        let recv = self.expr(&mc.receiver)?;
        let rt = recv.ts;
        let mut runtime = recv.runtime;
        let mut args = Vec::new();
        for a in &mc.args {
            let l = self.expr(a)?;
            runtime |= l.runtime;
            args.push(l.ts);
        }
        let n = args.len();
        let want = |want: usize| -> Result<()> {
            if n != want {
                return Err(Error::new_spanned(
                    mc,
                    format!("`{name}` takes {want} argument(s)"),
                ));
            }
            Ok(())
        };
        if name == "round" {
            return Err(Error::new_spanned(
                &mc.method,
                "`round` rounds half away from zero, the IR rounds half to even: write `round_ties_even()`",
            ));
        }
        let ts = if let Some(op) = lookup(UNARY_METHODS, &name) {
            want(0)?;
            quote_spanned!(span=> { let __x = #rt; __k.unary(#k::UnaryOp::#op, __x) })
        } else if let Some(op) = lookup(BINARY_METHODS, &name) {
            want(1)?;
            let b = &args[0];
            quote_spanned!(span=> { let __a = #rt; let __b = #b; __k.binary(#k::BinaryOp::#op, __a, __b) })
        } else if name == "mul_add" {
            want(2)?;
            let (b, c) = (&args[0], &args[1]);
            quote_spanned!(span=> { let __a = #rt; let __b = #b; let __c = #c; __k.fma(__a, __b, __c) })
        } else if name == "clamp" {
            want(2)?;
            let (lo, hi) = (&args[0], &args[1]);
            quote_spanned!(span=> { let __x = #rt; let __lo = #lo; let __hi = #hi; __k.clamp(__x, __lo, __hi) })
        } else {
            return Err(unsupported(&mc.method, &format!("the method `{name}`")));
        };
        // A math function of constants is still computed by the kernel (not folded).
        runtime |= lookup(UNARY_METHODS, &name).is_some() || name == "mul_add" || name == "clamp";
        Ok(Lowered { ts, runtime })
    }

    fn call(&mut self, c: &syn::ExprCall) -> Result<Lowered> {
        let k = ir();
        let run = |ts: Tokens| Lowered { ts, runtime: true };
        let Some(f) = single_ident(&c.func) else {
            return Err(unsupported(&c.func, "calling this function"));
        };
        let name = f.to_string();
        let span = f.span();
        if let Some(op) = lookup(PLANE_OPS, &name) {
            let [x] = self.call_args::<1>(c, &name)?;
            return Ok(run(
                quote_spanned!(span=> { let __x = #x; __k.plane(#k::PlaneOp::#op, __x) }),
            ));
        }
        match name.as_str() {
            "plane_broadcast" | "plane_shuffle" => {
                let [x, lane] = self.call_args::<2>(c, &name)?;
                let method = Ident::new(&name, span);
                Ok(run(
                    quote_spanned!(span=> { let __x = #x; let __l = #lane; __k.#method(__x, __l) }),
                ))
            }
            "plane_ballot" => {
                let [x] = self.call_args::<1>(c, &name)?;
                Ok(run(
                    quote_spanned!(span=> { let __x = #x; __k.ballot(__x) }),
                ))
            }
            "select" => {
                let [cond, a, b] = self.call_args::<3>(c, &name)?;
                Ok(run(
                    quote_spanned!(span=> { let __c = #cond; let __a = #a; let __b = #b; __k.select(__c, __a, __b) }),
                ))
            }
            "sync_units" => Err(Error::new_spanned(
                c,
                "`sync_units()` is a statement (it has no value)",
            )),
            _ => Err(unsupported(
                &c.func,
                &format!("calling `{name}` (kernels call no other functions yet)"),
            )),
        }
    }
}
