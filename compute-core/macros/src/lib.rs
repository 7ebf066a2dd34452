//! `#[kernel]`: kernels written as Rust functions, lowered to `compute_core`'s portable IR.
//!
//! Use it through `compute_core::kernel::kernel`; the documentation is there.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote, quote_spanned};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Error, FnArg, GenericParam, Ident, ItemFn, Pat, Result, Token, Type};

mod lower;

use lower::{Lowerer, Sym};

/// What a `#[kernel]` body may contain, appended to every "not supported" error.
pub(crate) const SUPPORTED: &str = "a #[kernel] body supports: `let`/`let mut` (and \
`#[comptime] let mut` for build-time values), arithmetic, comparison, bit and logical operators and \
their compound assignments, `as` casts, methods sqrt exp ln ln_1p sin cos tanh erf floor ceil \
round_ties_even recip rsqrt abs min max powf mul_add clamp, `if`/`else`, `for i in a..b` (with \
`.step_by(s)`, `#[unroll]`), `while`, `loop`, `break`, `continue`, `return`, indexing of slices, \
`SharedMemory::<T>::new(n)`, `LocalArray::<T>::new(n)` and vectors, vectors `[x; W]` and `[a, b, ..]`, \
builtins ABSOLUTE_POS UNIT_POS CUBE_POS CUBE_DIM CUBE_COUNT (and _X/_Y/_Z) PLANE_DIM UNIT_POS_PLANE, \
sync_units(), select(c, a, b), plane_sum/prod/min/max/all/any/broadcast/shuffle/ballot, \
`buf.len()`, `buf.rank()`, `buf.shape(d)`, `buf.stride(d)`, `buf.atomic_add(i, v)` and the other atomics";

/// A kernel written as a Rust function, lowered to `compute_core`'s portable IR.
///
/// ```
/// use compute_core::kernel::kernel;
///
/// /// `y = a * x + y`.
/// #[kernel(cube_dim = 256)]
/// fn saxpy(x: &[f32], y: &mut [f32], a: f32) {
///     let i = ABSOLUTE_POS;
///     if i < x.len() {
///         y[i] = a.mul_add(x[i], y[i]);
///     }
/// }
///
/// let def = saxpy::definition(); // built once, kept
/// assert_eq!(def.name(), "saxpy");
/// assert_eq!(def.buffers().len(), 2);
/// // saxpy::launch(&client, CubeCount::cover(n, 256), &x, &y, 2.0f32);
/// ```
///
/// The attribute replaces the function by a module of the same name holding
/// - `try_definition(..) -> Result<KernelDefinition, BuildError>`: builds the kernel afresh;
/// - `definition(..) -> &'static KernelDefinition`: built once per set of build-time parameters
///   and kept (panics with the build error if the kernel does not validate);
/// - `launch(&client, count, args..)`: a bounds-checked launch; slice parameters take a
///   `Handle` (or `&Handle`, `Binding`, `BufferArgument` with tensor metadata), scalar parameters
///   their Rust type, so a wrong kind of argument is a compile error;
/// - `unsafe launch_unchecked(..)`: the same without bounds checks.
///
/// The module does `use super::*`: constants and types the kernel names come from the module
/// around it (so a `#[kernel]` function belongs at module level, not inside another function).
///
/// # Arguments
/// `cube_dim = [x, y, z]` (or `cube_dim = x`), required; `name = expr` (anything `Display`,
/// default the function's name), the kernel's name in the IR.
///
/// # Parameters
/// - `x: &[T]` (read-only) and `x: &mut [T]` (read-write) global buffers; `&[[T; W]]` is a buffer
///   of vectors of `W` (1, 2, 4, 8, 16); `T` is an element type (`f32`, `u32`, `half::f16`, ...)
///   or a type parameter;
/// - `a: T`: a scalar passed at launch;
/// - `#[comptime] n: u32` (any integer or bool type): a build-time parameter, an argument of
///   `definition` and `launch`; each value is a separate kernel;
/// - generics: type parameters are element types (the macro adds the `KernelElem` bound;
///   bound them by `KernelFloat` or `KernelInt` for documentation), const parameters are
///   build-time constants (vector widths, tile sizes).
///
/// # Body
/// Names that are neither parameters nor `let`s are Rust items evaluated while building: `const`s,
/// const generics. Arithmetic on build-time values is folded while building (with the IR's
/// semantics), so an `if` or `while` on them only is decided then: `#[comptime] let mut stride =
/// CUBE / 2; while stride > 0 { ..; stride /= 2; }` unrolls. Unsuffixed literals take the type of
/// the other operand (alone: `u32`, `i32` if negative, `f32`). `usize` stands for `u32`.
///
/// - `let x = e;` (an SSA value), `let x: T = e;`, `let mut x = e;` (a kernel variable),
///   `#[comptime] let mut x = e;` (a binding rebound while building, e.g. in unrolled loops);
/// - `+ - * / % & | ^ << >>`, their compound assignments, `== != < <= > >=`, `!`, unary `-`;
///   `&&`/`||` evaluate their right side only where needed when it reads memory or calls
///   something, otherwise both sides (on bools `&` and `|` are the eager forms);
/// - `x as T`; methods `sqrt rsqrt exp ln ln_1p sin cos tanh erf floor ceil round_ties_even
///   recip abs`, `min max powf`, `a.mul_add(b, c)` (`a * b + c`, fused), `x.clamp(lo, hi)`;
///   `select(c, a, b)`;
/// - `if`/`else`, `for i in a..b`, `for i in (a..b).step_by(s)`, `#[unroll] for` on build-time
///   bounds, `while`, `loop`, `break`, `continue`, `return`;
/// - `x[i]` on buffers, shared memory and local arrays (checked launches read 0 and drop stores
///   out of range on buffers; shared and local arrays always), `v[c]` on vectors (constant `c`),
///   `[x; W]` and `[a, b, c, d]` vectors;
/// - `SharedMemory::<T>::new(len)` and `LocalArray::<T>::new(len)` (`T` may be `[E; W]`);
/// - builtins `ABSOLUTE_POS`, `UNIT_POS`, `CUBE_POS`, `CUBE_DIM`, `CUBE_COUNT` (each also
///   `_X`, `_Y`, `_Z`), `PLANE_DIM`, `UNIT_POS_PLANE`; `sync_units()`;
/// - `plane_sum/prod/min/max/all/any(x)`, `plane_broadcast(x, lane)`, `plane_shuffle(x, lane)`,
///   `plane_ballot(c)`;
/// - `buf.len()`, `buf.rank()`, `buf.shape(d)`, `buf.stride(d)`; `mem.atomic_add(i, v)` (also
///   `atomic_sub/min/max/and/or/xor/exchange`), `atomic_load(i)`, `atomic_store(i, v)`,
///   `atomic_compare_exchange(i, expected, v)`.
///
/// Anything else is a compile error at the construct, with this list. Type errors (mixing `f32`
/// and `u32`, storing the wrong type) are reported by `try_definition` with the builder's message.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    match expand(attr.into(), item.into()) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

struct Args {
    cube_dim: syn::Expr,
    name: Option<syn::Expr>,
}

fn parse_args(attr: Tokens) -> Result<Args> {
    let metas =
        Punctuated::<syn::MetaNameValue, Token![,]>::parse_terminated.parse2(attr.clone())?;
    let mut cube_dim = None;
    let mut name = None;
    for m in metas {
        if m.path.is_ident("cube_dim") {
            cube_dim = Some(m.value);
        } else if m.path.is_ident("name") {
            name = Some(m.value);
        } else {
            return Err(Error::new_spanned(
                &m.path,
                "unknown #[kernel] argument; expected `cube_dim = [x, y, z]` (or `cube_dim = x`) and optionally `name = \"...\"`",
            ));
        }
    }
    let cube_dim = cube_dim.ok_or_else(|| {
        Error::new(
            if attr.is_empty() { Span::call_site() } else { attr.span() },
            "#[kernel] needs the cube dimension: `#[kernel(cube_dim = [x, y, z])]` or `#[kernel(cube_dim = x)]`",
        )
    })?;
    Ok(Args { cube_dim, name })
}

/// One parameter of the kernel function.
enum Param {
    Buffer {
        name: Ident,
        elem: Type,
        width: Tokens,
        writable: bool,
    },
    Scalar {
        name: Ident,
        ty: Type,
    },
    Comptime {
        name: Ident,
        ty: Type,
    },
}

/// `(element type, vector width)` of a slice's element: `T` or `[T; W]`.
pub(crate) fn elem_and_width(ty: &Type) -> (Type, Tokens) {
    match ty {
        Type::Array(a) => {
            let len = &a.len;
            ((*a.elem).clone(), quote!(#len))
        }
        other => (other.clone(), quote!(1u32)),
    }
}

fn has_attr(attrs: &[syn::Attribute], name: &str) -> bool {
    attrs.iter().any(|a| a.path().is_ident(name))
}

fn parse_param(arg: &FnArg) -> Result<Param> {
    let FnArg::Typed(pt) = arg else {
        return Err(Error::new_spanned(
            arg,
            "a #[kernel] function takes no `self`",
        ));
    };
    let name = match &*pt.pat {
        Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
        other => {
            return Err(Error::new_spanned(
                other,
                "a #[kernel] parameter is a plain name (`x: &[f32]`)",
            ));
        }
    };
    if has_attr(&pt.attrs, "comptime") {
        return Ok(Param::Comptime {
            name,
            ty: (*pt.ty).clone(),
        });
    }
    match &*pt.ty {
        Type::Reference(r) => match &*r.elem {
            Type::Slice(s) => {
                let (elem, width) = elem_and_width(&s.elem);
                Ok(Param::Buffer {
                    name,
                    elem,
                    width,
                    writable: r.mutability.is_some(),
                })
            }
            other => Err(Error::new_spanned(
                other,
                "a #[kernel] reference parameter is a slice: `&[T]`, `&mut [T]`, `&[[T; W]]` (vectors of W)",
            )),
        },
        Type::Path(_) => Ok(Param::Scalar {
            name,
            ty: (*pt.ty).clone(),
        }),
        other => Err(Error::new_spanned(
            other,
            "a #[kernel] parameter is a slice (`&[T]`, `&mut [T]`, `&[[T; W]]`), a scalar (`a: f32`) or `#[comptime] n: u32`",
        )),
    }
}

fn expand(attr: Tokens, item: Tokens) -> Result<Tokens> {
    let args = parse_args(attr)?;
    let func: ItemFn = syn::parse2(item)?;
    let sig = &func.sig;
    if let Some(t) = &sig.asyncness {
        return Err(Error::new_spanned(
            t,
            "a #[kernel] function cannot be `async`",
        ));
    }
    if let Some(t) = &sig.unsafety {
        return Err(Error::new_spanned(
            t,
            "a #[kernel] function cannot be `unsafe`; launch it with `launch_unchecked`",
        ));
    }
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        return Err(Error::new_spanned(
            ty,
            "a #[kernel] function returns nothing; write results to a `&mut [T]` parameter",
        ));
    }
    let mut type_params = Vec::new();
    let mut const_params = Vec::new();
    for g in &sig.generics.params {
        match g {
            GenericParam::Type(t) => type_params.push(t.ident.clone()),
            GenericParam::Const(c) => const_params.push(c.ident.clone()),
            GenericParam::Lifetime(l) => {
                return Err(Error::new_spanned(
                    l,
                    "a #[kernel] function takes no lifetime parameters",
                ));
            }
        }
    }
    let params = sig
        .inputs
        .iter()
        .map(parse_param)
        .collect::<Result<Vec<_>>>()?;

    let core = quote!(::compute_core);
    let m = quote!(#core::kernel::expand);
    let fn_name = &sig.ident;
    let vis = &func.vis;
    let kernel_name = match &args.name {
        Some(n) => quote!(#n),
        None => {
            let s = fn_name.to_string();
            quote!(#s)
        }
    };
    let cube_dim = &args.cube_dim;

    // Generics of every generated function: the kernel's, each type parameter a kernel element.
    let mut generics = sig.generics.clone();
    {
        let wc = generics.make_where_clause();
        for t in &type_params {
            wc.predicates
                .push(syn::parse_quote!(#t: #core::kernel::KernelElem));
        }
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    let turbofish = ty_generics.as_turbofish();

    // Declarations, in signature order.
    let mut lowerer = Lowerer::new();
    let mut decls = Vec::new();
    let mut comptime_args = Vec::new();
    let mut comptime_names = Vec::new();
    let mut launch_params = Vec::new();
    let mut buffer_args = Vec::new();
    let mut scalar_args = Vec::new();
    for p in &params {
        match p {
            Param::Buffer {
                name,
                elem,
                width,
                writable,
            } => {
                let s = name.to_string();
                let decl = if *writable {
                    quote!(output)
                } else {
                    quote!(input)
                };
                decls.push(quote_spanned! {name.span()=>
                    let #name = __k.#decl(#s, <#elem as #core::kernel::KernelElem>::ELEM, #width);
                });
                lowerer.declare(
                    name,
                    Sym::Buffer {
                        writable: *writable,
                    },
                );
                launch_params.push(quote!(#name: impl #core::kernel::BufferArg));
                buffer_args.push(quote!(#core::kernel::BufferArg::buffer_argument(#name)));
            }
            Param::Scalar { name, ty } => {
                let s = name.to_string();
                decls.push(quote_spanned! {name.span()=>
                    let #name = __k.scalar(#s, <#ty as #core::kernel::KernelElem>::ELEM);
                });
                lowerer.declare(name, Sym::Value { runtime: true });
                launch_params.push(quote!(#name: #ty));
                scalar_args.push(quote!(#core::kernel::KernelElem::scalar(#name)));
            }
            Param::Comptime { name, ty } => {
                decls.push(quote! { let #name: #m::Expr = #m::Expr::constant(#name); });
                lowerer.declare(name, Sym::Value { runtime: false });
                comptime_args.push(quote!(#name: #ty));
                comptime_names.push(name.clone());
                launch_params.push(quote!(#name: #ty));
            }
        }
    }
    let body = lowerer.block_stmts(&func.block.stmts)?;

    let generic = !type_params.is_empty() || !const_params.is_empty() || !comptime_names.is_empty();
    let cached = if generic {
        let consts = const_params.iter().chain(&comptime_names);
        quote! {
            CACHE.get_keyed(
                (
                    ::std::vec![#(::std::any::TypeId::of::<#type_params>()),*],
                    ::std::vec![#((#consts) as i128),*],
                ),
                || try_definition #turbofish (#(#comptime_names),*),
            )
        }
    } else {
        quote!(CACHE.get(try_definition))
    };
    let docs: Vec<_> = func
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .collect();
    let others: Vec<_> = func
        .attrs
        .iter()
        .filter(|a| !a.path().is_ident("doc"))
        .collect();
    if let Some(a) = others.first() {
        return Err(Error::new_spanned(
            a,
            "#[kernel] functions take doc comments only as attributes",
        ));
    }
    let launch_doc = format!(
        "Launch `{fn_name}` over `count` cubes, bounds-checked: out-of-range loads of global buffers read 0 and out-of-range stores are dropped."
    );
    let mod_doc = format!(
        "The `#[kernel]` function `{fn_name}`: [`definition`] builds its portable kernel (once), [`launch`] runs it."
    );
    let fn_name_mod = format_ident!("{}", fn_name);

    Ok(quote! {
        #(#docs)*
        #[doc = ""]
        #[doc = #mod_doc]
        #[allow(non_snake_case, unused_imports, clippy::all)]
        #vis mod #fn_name_mod {
            use super::*;

            static CACHE: #m::DefinitionCache = #m::DefinitionCache::new();

            /// Build the kernel's definition afresh (no cache), or the error that says why the
            /// kernel does not validate.
            #[allow(unused_variables, unused_mut, unused_assignments, unused_braces, clippy::all)]
            pub fn try_definition #impl_generics (#(#comptime_args),*)
                -> ::core::result::Result<#core::kernel::KernelDefinition, #core::kernel::BuildError>
                #where_clause
            {
                let mut __k = #m::Ctx::new(&::std::string::ToString::to_string(&(#kernel_name)), #cube_dim);
                #(#decls)*
                #body
                __k.build()
            }

            /// The kernel's definition, built once per set of build-time parameters and kept.
            ///
            /// # Panics
            /// When the kernel does not validate (see [`try_definition`]): its source is wrong.
            pub fn definition #impl_generics (#(#comptime_args),*)
                -> &'static #core::kernel::KernelDefinition
                #where_clause
            {
                #cached
            }

            #[doc = #launch_doc]
            ///
            /// # Panics
            /// As [`definition`].
            #[allow(clippy::too_many_arguments)]
            pub fn launch #impl_generics (
                client: &#core::ComputeClient<impl #core::Runtime>,
                count: #core::CubeCount,
                #(#launch_params),*
            ) #where_clause {
                let def = definition #turbofish (#(#comptime_names),*);
                #m::launch(client, def, count, ::std::vec![#(#buffer_args),*], ::std::vec![#(#scalar_args),*]);
            }

            /// Launch without bounds checks.
            ///
            /// # Safety
            /// Every index the kernel uses on a global buffer is in bounds for this launch.
            ///
            /// # Panics
            /// As [`definition`].
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn launch_unchecked #impl_generics (
                client: &#core::ComputeClient<impl #core::Runtime>,
                count: #core::CubeCount,
                #(#launch_params),*
            ) #where_clause {
                let def = definition #turbofish (#(#comptime_names),*);
                // SAFETY: forwarded from the caller.
                unsafe {
                    #m::launch_unchecked(client, def, count, ::std::vec![#(#buffer_args),*], ::std::vec![#(#scalar_args),*]);
                }
            }
        }
    })
}
