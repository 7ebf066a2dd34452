//! Tensor shapes, strides and the layouts the runtime chooses for them.

use serde::{Deserialize, Serialize};

use crate::error::{LayoutError, ServerError};
use crate::handle::{CopyDescriptor, Handle};

macro_rules! dims_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
        pub struct $name(pub Vec<usize>);

        impl $name {
            /// Number of dimensions.
            pub fn rank(&self) -> usize {
                self.0.len()
            }
        }

        impl core::ops::Deref for $name {
            type Target = [usize];
            fn deref(&self) -> &[usize] {
                &self.0
            }
        }

        impl From<Vec<usize>> for $name {
            fn from(value: Vec<usize>) -> Self {
                Self(value)
            }
        }

        impl From<&[usize]> for $name {
            fn from(value: &[usize]) -> Self {
                Self(value.to_vec())
            }
        }

        impl<const N: usize> From<[usize; N]> for $name {
            fn from(value: [usize; N]) -> Self {
                Self(value.to_vec())
            }
        }
    };
}

dims_newtype!(
    /// The extent of each dimension of a tensor, outermost first.
    Shape
);
dims_newtype!(
    /// The distance, in elements, between neighbours along each dimension.
    Strides
);

impl Shape {
    /// Number of elements.
    ///
    /// Wraps for shapes whose element count overflows `usize`; every path that allocates or
    /// copies uses [`checked_num_elements`](Self::checked_num_elements) instead.
    pub fn num_elements(&self) -> usize {
        self.0.iter().product()
    }

    /// Number of elements, `None` when it overflows `usize`.
    pub fn checked_num_elements(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }
}

/// Bytes of a compact tensor of `shape` with `elem_size`-byte elements, or the overflow error.
pub fn checked_compact_size(shape: &[usize], elem_size: usize) -> Result<usize, LayoutError> {
    shape
        .iter()
        .try_fold(elem_size, |n, &d| n.checked_mul(d))
        .ok_or_else(|| LayoutError::SizeOverflow {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape).0,
            elem_size,
        })
}

/// How the runtime may lay a tensor out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryLayoutPolicy {
    /// Row-major, no padding.
    Contiguous,
    /// Whatever the backend reads fastest: contiguous, or pitched (rows padded to an alignment).
    Optimized,
}

/// A tensor the caller wants allocated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemoryLayoutDescriptor {
    /// Layout policy.
    pub policy: MemoryLayoutPolicy,
    /// The tensor's shape.
    pub shape: Shape,
    /// Size of one element in bytes.
    pub elem_size: usize,
}

impl MemoryLayoutDescriptor {
    /// A descriptor with an explicit policy.
    pub fn new(policy: MemoryLayoutPolicy, shape: impl Into<Shape>, elem_size: usize) -> Self {
        Self {
            policy,
            shape: shape.into(),
            elem_size,
        }
    }

    /// A row-major tensor without padding.
    pub fn contiguous(shape: impl Into<Shape>, elem_size: usize) -> Self {
        Self::new(MemoryLayoutPolicy::Contiguous, shape, elem_size)
    }

    /// A tensor laid out as the backend prefers.
    pub fn optimized(shape: impl Into<Shape>, elem_size: usize) -> Self {
        Self::new(MemoryLayoutPolicy::Optimized, shape, elem_size)
    }

    /// Size in bytes of the data without padding (wraps on overflow: see
    /// [`checked_compact_size`](Self::checked_compact_size)).
    pub fn compact_size(&self) -> usize {
        self.shape.num_elements().wrapping_mul(self.elem_size)
    }

    /// Size in bytes of the data without padding, or the overflow error.
    pub fn checked_compact_size(&self) -> Result<usize, LayoutError> {
        checked_compact_size(&self.shape, self.elem_size)
    }
}

/// A tensor allocated by the runtime: its memory and the strides the runtime chose.
#[derive(Debug, Clone)]
pub struct MemoryLayout {
    /// The memory.
    pub memory: Handle,
    /// The shape it was created with.
    pub shape: Shape,
    /// Strides in elements; the last one is 1, others may include row padding.
    pub strides: Strides,
    /// Size of one element in bytes.
    pub elem_size: usize,
}

impl MemoryLayout {
    /// A descriptor to read or write the whole tensor.
    pub fn copy_descriptor(&self) -> CopyDescriptor {
        CopyDescriptor::new(
            self.memory.clone().binding(),
            self.shape.clone(),
            self.strides.clone(),
            self.elem_size,
        )
    }

    /// Whether the tensor is row-major without padding.
    pub fn is_contiguous(&self) -> bool {
        self.strides == contiguous_strides(&self.shape)
    }
}

/// Row-major strides without padding (saturating for shapes too large for `usize`, which no
/// allocation accepts).
pub fn contiguous_strides(shape: &[usize]) -> Strides {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    Strides(strides)
}

/// Row-major strides whose rows (the last dimension) are padded to `row_alignment` bytes, or to
/// the next power of two of the row's own size when that is smaller: the padding scales with the
/// row, so an `[N, 1]` tensor is not `N` times the alignment.
///
/// Tensors of rank < 2, or whose element size does not divide the alignment, stay contiguous.
pub fn pitched_strides(shape: &[usize], elem_size: usize, row_alignment: usize) -> Strides {
    let rank = shape.len();
    if rank < 2 || elem_size == 0 {
        return contiguous_strides(shape);
    }
    let row_bytes = shape[rank - 1].saturating_mul(elem_size);
    let row_alignment =
        row_alignment.min(row_bytes.checked_next_power_of_two().unwrap_or(usize::MAX));
    if row_alignment == 0 || !row_alignment.is_multiple_of(elem_size) {
        return contiguous_strides(shape);
    }
    let align_elems = row_alignment / elem_size;
    let row = shape[rank - 1]
        .div_ceil(align_elems)
        .saturating_mul(align_elems);
    let mut strides = vec![1usize; rank];
    strides[rank - 2] = row.max(1);
    for i in (0..rank - 2).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1));
    }
    Strides(strides)
}

/// Bytes a row-major tensor with these strides occupies, padding of every row included; `None`
/// when that overflows `usize`.
pub fn allocation_size(shape: &[usize], strides: &[usize], elem_size: usize) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    // The span (last element + 1) bounds the padded rows too: every dimension's extent must fit.
    strided_span(shape, strides, elem_size)?;
    match shape.first() {
        None => Some(elem_size),
        Some(&outer) => outer.checked_mul(strides[0].max(1))?.checked_mul(elem_size),
    }
}

/// Bytes from the first to one past the last element of a strided tensor, `None` when that
/// overflows `usize` (shape and strides of the same rank).
pub fn strided_span(shape: &[usize], strides: &[usize], elem_size: usize) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last = 0usize;
    for (&n, &stride) in shape.iter().zip(strides) {
        last = last.checked_add((n - 1).checked_mul(stride)?)?;
    }
    last.checked_add(1)?.checked_mul(elem_size)
}

/// Tensors laid out one after the other in a single allocation (`create_tensors` packing).
#[derive(Debug, Clone)]
pub struct PackedTensors {
    total: u64,
    parts: Vec<(u64, u64, Strides)>,
}

impl PackedTensors {
    /// Bytes the whole allocation needs.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The tensors' layouts over `base`, a handle on [`total`](Self::total) bytes.
    pub fn layouts(
        self,
        base: &Handle,
        descriptors: &[MemoryLayoutDescriptor],
    ) -> Vec<MemoryLayout> {
        let total = self.total;
        descriptors
            .iter()
            .zip(self.parts)
            .map(|(descriptor, (offset, size, strides))| MemoryLayout {
                memory: base
                    .clone()
                    .offset_start(offset)
                    .offset_end(total - offset - size),
                shape: descriptor.shape.clone(),
                strides,
                elem_size: descriptor.elem_size,
            })
            .collect()
    }
}

/// Lay `descriptors` out one after the other, each starting at a multiple of `alignment`.
/// `Optimized` descriptors get rows pitched to `pitch_alignment` when the backend has one.
pub fn pack_tensors(
    descriptors: &[MemoryLayoutDescriptor],
    alignment: u64,
    pitch_alignment: Option<usize>,
) -> Result<PackedTensors, ServerError> {
    let mut parts = Vec::with_capacity(descriptors.len());
    let mut total = 0u64;
    for descriptor in descriptors {
        if descriptor.elem_size == 0 {
            return Err(LayoutError::ZeroElemSize.into());
        }
        let overflow = |strides: &Strides| LayoutError::SizeOverflow {
            shape: descriptor.shape.0.clone(),
            strides: strides.0.clone(),
            elem_size: descriptor.elem_size,
        };
        descriptor.checked_compact_size()?;
        let strides = match (descriptor.policy, pitch_alignment) {
            (MemoryLayoutPolicy::Optimized, Some(align)) => {
                pitched_strides(&descriptor.shape, descriptor.elem_size, align)
            }
            _ => contiguous_strides(&descriptor.shape),
        };
        let size = allocation_size(&descriptor.shape, &strides, descriptor.elem_size)
            .ok_or_else(|| overflow(&strides))? as u64;
        let start = total
            .checked_next_multiple_of(alignment.max(1))
            .ok_or_else(|| overflow(&strides))?;
        total = start.checked_add(size).ok_or_else(|| overflow(&strides))?;
        parts.push((start, size, strides));
    }
    Ok(PackedTensors { total, parts })
}

/// Check that `strides` describe a row-major layout with unit last stride and rows that do not
/// overlap, as the runtime creates.
///
/// This is the one rule for every copy (read, write, `read_tensor`, `to_client_tensor`): aliasing
/// strides (`[0, 0]` over a shape with more than one element per dimension) are rejected, since a
/// write through them is ambiguous and a read would be a broadcast the copy paths do not do.
/// Dimensions of extent 1 may have any stride. Kernel launches take tensor metadata as given
/// (kernels may broadcast), bounds-checked by the launch mode.
pub fn check_row_major(shape: &[usize], strides: &[usize]) -> Result<(), LayoutError> {
    if shape.len() != strides.len() {
        return Err(LayoutError::RankMismatch {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        });
    }
    let Some(&last) = strides.last() else {
        return Ok(());
    };
    let mut ok = last == 1 || shape[shape.len() - 1] <= 1;
    for i in 0..shape.len().saturating_sub(1) {
        // A product that overflows is larger than any stride: not row-major.
        ok &= shape[i] <= 1
            || strides[i + 1]
                .checked_mul(shape[i + 1])
                .is_some_and(|row| strides[i] >= row);
    }
    if ok {
        Ok(())
    } else {
        Err(LayoutError::NotRowMajor {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        })
    }
}

/// Visit every row (last dimension) of a row-major tensor: `f(byte offset in the strided buffer,
/// byte offset in the compact buffer, row length in bytes)`.
pub fn for_each_row(
    shape: &[usize],
    strides: &[usize],
    elem_size: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    if shape.contains(&0) {
        return;
    }
    let rank = shape.len();
    if rank == 0 {
        f(0, 0, elem_size);
        return;
    }
    let row_bytes = shape[rank - 1] * elem_size;
    let rows: usize = shape[..rank - 1].iter().product();
    let mut index = vec![0usize; rank - 1];
    for row in 0..rows {
        let offset: usize = index.iter().zip(strides).map(|(i, s)| i * s).sum();
        f(offset * elem_size, row * row_bytes, row_bytes);
        for d in (0..rank - 1).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_and_pitched() {
        assert_eq!(contiguous_strides(&[2, 3, 4]).0, vec![12, 4, 1]);
        assert_eq!(pitched_strides(&[3, 5], 4, 32).0, vec![8, 1]);
        assert_eq!(pitched_strides(&[2, 3, 5], 4, 32).0, vec![24, 8, 1]);
        assert_eq!(pitched_strides(&[7], 4, 32).0, vec![1]);
        // The pitch scales with the row: no 32x blow-up for a column.
        assert_eq!(pitched_strides(&[1024, 1], 4, 128).0, vec![1, 1]);
        assert_eq!(pitched_strides(&[8, 100], 4, 128).0, vec![128, 1]);
        assert_eq!(pitched_strides(&[8, 3], 4, 128).0, vec![4, 1]);
        assert_eq!(allocation_size(&[3, 5], &[8, 1], 4), Some(96));
        assert_eq!(allocation_size(&[0, 5], &[8, 1], 4), Some(0));
        assert_eq!(allocation_size(&[], &[], 4), Some(4));
        assert_eq!(allocation_size(&[1 << 62, 4], &[4, 1], 1), None);
    }

    #[test]
    fn rows_visit_padded_offsets() {
        let mut rows = Vec::new();
        for_each_row(&[2, 2, 3], &[8, 4, 1], 2, |s, c, n| rows.push((s, c, n)));
        assert_eq!(rows, vec![(0, 0, 6), (8, 6, 6), (16, 12, 6), (24, 18, 6)]);
    }

    #[test]
    fn row_major_check() {
        assert!(check_row_major(&[3, 5], &[8, 1]).is_ok());
        assert!(check_row_major(&[3, 5], &[1, 3]).is_err());
        assert!(matches!(
            check_row_major(&[3, 5], &[5]),
            Err(LayoutError::RankMismatch { .. })
        ));
        // Aliasing strides and wrapping products are rejected; extent-1 dimensions are free.
        assert!(check_row_major(&[2, 2], &[0, 0]).is_err());
        assert!(check_row_major(&[2, 2], &[usize::MAX - 2, 1]).is_ok());
        assert!(check_row_major(&[2, 1 << 62], &[1, 4]).is_err());
        assert!(check_row_major(&[1, 3], &[0, 1]).is_ok());
    }

    #[test]
    fn packing_overflow_is_an_error() {
        for (shape, elem) in [
            (vec![(1usize << 62) + 1, 4], 1),
            (vec![1 << 32, 1 << 32], 4),
        ] {
            let d = MemoryLayoutDescriptor::contiguous(shape, elem);
            assert!(matches!(
                pack_tensors(&[d], 16, None),
                Err(ServerError::Layout(LayoutError::SizeOverflow { .. }))
            ));
        }
        assert_eq!(strided_span(&[2, 2], &[usize::MAX - 2, 1], 4), None);
        assert_eq!(
            strided_span(&[2, 2], &[usize::MAX - 2, 1], 1),
            Some(usize::MAX)
        );
    }
}
