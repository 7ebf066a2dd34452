//! Kernels that only move components: they depend on the element size, not its type.

use bytemuck::Pod;

use super::global::all_active;
use super::lanes::{view, view_mut};

/// An unsigned integer the size of one component.
pub(crate) trait Word: Pod + Default + Send + Sync {
    fn from_bits(bits: u64) -> Self;
}

macro_rules! word {
    ($($t:ty),*) => {$(
        impl Word for $t {
            #[inline(always)]
            fn from_bits(bits: u64) -> Self { bits as $t }
        }
    )*};
}

word!(u8, u16, u32, u64, i32, i64);

/// Pick the instance of a generic `fn` for a component size in bytes.
macro_rules! by_size {
    ($size:expr, $f:ident) => {
        match $size {
            1 => $f::<u8>,
            2 => $f::<u16>,
            4 => $f::<u32>,
            _ => $f::<u64>,
        }
    };
}
pub(crate) use by_size;

/// `out[..n] = bits` (a literal or a scalar argument).
pub(crate) type FillFn = fn(&mut [u64], u64, usize);

pub(crate) fn fill<W: Word>(out: &mut [u64], bits: u64, n: usize) {
    view_mut::<W>(out, n).fill(W::from_bits(bits));
}

/// `out = cond ? a : b` per component, `cond` a bool (`u8`) register of the same width.
pub(crate) fn select<W: Word>(c: &[u64], a: &[u64], b: &[u64], out: &mut [u64], n: usize) {
    let (c, a, b) = (view::<u8>(c, n), view::<W>(a, n), view::<W>(b, n));
    let out = view_mut::<W>(out, n);
    for (((o, &c), &a), &b) in out.iter_mut().zip(c).zip(a).zip(b) {
        *o = if c != 0 { a } else { b };
    }
}

/// Shape parameters of the vector kernels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub lanes: usize,
    pub width: usize,
}

pub(crate) type ShapeFn = fn(&[u64], &mut [u64], Shape, usize);

/// `out[l * w + c] = x[l]`.
pub(crate) fn splat<W: Word>(x: &[u64], out: &mut [u64], s: Shape, _arg: usize) {
    fn fixed<W: Word, const N: usize>(x: &[W], out: &mut [W]) {
        let (out, _) = out.as_chunks_mut::<N>();
        for (o, &x) in out.iter_mut().zip(x) {
            *o = [x; N];
        }
    }
    let x = view::<W>(x, s.lanes);
    let out = view_mut::<W>(out, s.lanes * s.width);
    match s.width {
        2 => fixed::<W, 2>(x, out),
        4 => fixed::<W, 4>(x, out),
        8 => fixed::<W, 8>(x, out),
        16 => fixed::<W, 16>(x, out),
        _ => {
            for (o, &x) in out.chunks_exact_mut(s.width).zip(x) {
                o.fill(x);
            }
        }
    }
}

/// `out[l] = x[l * w + comp]`.
pub(crate) fn extract<W: Word>(x: &[u64], out: &mut [u64], s: Shape, comp: usize) {
    fn fixed<W: Word, const N: usize>(x: &[W], out: &mut [W], comp: usize) {
        let (x, _) = x.as_chunks::<N>();
        for (o, x) in out.iter_mut().zip(x) {
            *o = x[comp];
        }
    }
    let x = view::<W>(x, s.lanes * s.width);
    let out = view_mut::<W>(out, s.lanes);
    match s.width {
        2 => fixed::<W, 2>(x, out, comp),
        4 => fixed::<W, 4>(x, out, comp),
        8 => fixed::<W, 8>(x, out, comp),
        16 => fixed::<W, 16>(x, out, comp),
        _ => {
            for (o, x) in out.iter_mut().zip(x.chunks_exact(s.width)) {
                *o = x[comp];
            }
        }
    }
}

/// `out[l * w + comp] = x[l]`, the other components untouched.
pub(crate) fn insert<W: Word>(x: &[u64], out: &mut [u64], s: Shape, comp: usize) {
    let x = view::<W>(x, s.lanes);
    let out = view_mut::<W>(out, s.lanes * s.width);
    for (o, &x) in out.chunks_exact_mut(s.width).zip(x) {
        o[comp] = x;
    }
}

/// `dst[l] = src[l]` for the active units (components of `width` each).
pub(crate) type MaskedFn = fn(&[u64], &mut [u64], &[u8], usize);

pub(crate) fn masked_copy<W: Word>(src: &[u64], dst: &mut [u64], mask: &[u8], width: usize) {
    let n = mask.len() * width;
    let (src, dst) = (view::<W>(src, n), view_mut::<W>(dst, n));
    if all_active(mask) {
        dst.copy_from_slice(src);
    } else if width == 1 {
        for ((d, &s), &m) in dst.iter_mut().zip(src).zip(mask) {
            if m != 0 {
                *d = s;
            }
        }
    } else {
        for ((d, s), &m) in dst
            .chunks_exact_mut(width)
            .zip(src.chunks_exact(width))
            .zip(mask)
        {
            if m != 0 {
                copy_entry(d, s);
            }
        }
    }
}

/// Copy one entry of a vector width the IR allows with a fixed-size move, not a `memcpy` call.
#[inline(always)]
fn copy_entry<W: Word>(dst: &mut [W], src: &[W]) {
    fn fixed<W: Word, const N: usize>(dst: &mut [W], src: &[W]) {
        let (Ok(d), Ok(s)) = (<&mut [W; N]>::try_from(dst), <&[W; N]>::try_from(src)) else {
            unreachable!("entries of one width")
        };
        *d = *s;
    }
    match dst.len() {
        1 => dst[0] = src[0],
        2 => fixed::<W, 2>(dst, src),
        4 => fixed::<W, 4>(dst, src),
        8 => fixed::<W, 8>(dst, src),
        16 => fixed::<W, 16>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

/// The first index when `idx` is `first, first + 1, ...` over every unit, all active, and the
/// run fits in `len` entries: the access is then one slice copy.
#[inline]
fn contiguous(idx: &[u64], mask: &[u8], len: u64) -> Option<u64> {
    let first = *idx.first()?;
    let last = first.checked_add(idx.len() as u64 - 1)?;
    if last >= len {
        return None;
    }
    let off = idx
        .iter()
        .zip(first..)
        .fold(0u64, |acc, (&i, expect)| acc | (i ^ expect));
    (off == 0 && all_active(mask)).then_some(first)
}

/// Loads or stores of an array the executor owns (shared memory, local arrays), always checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArrayAccess {
    /// Entries per array.
    pub len: u64,
    /// Components per entry.
    pub width: usize,
    /// Local arrays hold one array per unit, unit-major; shared memory one per cube.
    pub per_unit: bool,
}

pub(crate) type ArrayLoadFn = fn(&[u64], &[u64], &mut [u64], &[u8], ArrayAccess);
pub(crate) type ArrayStoreFn = fn(&mut [u64], &[u64], &[u64], &[u8], ArrayAccess);

pub(crate) fn array_load<W: Word>(
    arr: &[u64],
    idx: &[u64],
    out: &mut [u64],
    mask: &[u8],
    a: ArrayAccess,
) {
    let w = a.width;
    let arr: &[W] = bytemuck::cast_slice(arr);
    let out = view_mut::<W>(out, mask.len() * w);
    if !a.per_unit
        && let Some(first) = contiguous(idx, mask, a.len)
    {
        let base = first as usize * w;
        out.copy_from_slice(&arr[base..base + out.len()]);
        return;
    }
    if w == 1 {
        for (l, (&m, o)) in mask.iter().zip(out.iter_mut()).enumerate() {
            if m == 0 {
                continue;
            }
            let i = idx[l];
            *o = if i >= a.len {
                W::default()
            } else {
                let base = if a.per_unit { l as u64 * a.len + i } else { i };
                arr[base as usize]
            };
        }
        return;
    }
    for (l, (&m, o)) in mask.iter().zip(out.chunks_exact_mut(w)).enumerate() {
        if m == 0 {
            continue;
        }
        let i = idx[l];
        if i >= a.len {
            o.fill(W::default());
            continue;
        }
        let base = if a.per_unit { l as u64 * a.len + i } else { i } as usize * w;
        copy_entry(o, &arr[base..base + w]);
    }
}

pub(crate) fn array_store<W: Word>(
    arr: &mut [u64],
    idx: &[u64],
    value: &[u64],
    mask: &[u8],
    a: ArrayAccess,
) {
    let w = a.width;
    let arr: &mut [W] = bytemuck::cast_slice_mut(arr);
    let value = view::<W>(value, mask.len() * w);
    if !a.per_unit
        && let Some(first) = contiguous(idx, mask, a.len)
    {
        let base = first as usize * w;
        arr[base..base + value.len()].copy_from_slice(value);
        return;
    }
    for (l, (&m, v)) in mask.iter().zip(value.chunks_exact(w)).enumerate() {
        let i = idx[l];
        if m == 0 || i >= a.len {
            continue;
        }
        let base = if a.per_unit { l as u64 * a.len + i } else { i } as usize * w;
        copy_entry(&mut arr[base..base + w], v);
    }
}
