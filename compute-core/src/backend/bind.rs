//! What the backends that bind buffer ranges and pass launch info in 32-bit words (wgpu, Vulkan)
//! share: the range bound for a buffer argument, and the words of its layout and of the scalars.

use crate::error::{LaunchError, ServerError};
use crate::kernel::ScalarValue;

/// `x` as a 32-bit launch info word, `u32::MAX` when it does not fit.
pub fn saturate(x: u64) -> u32 {
    u32::try_from(x).unwrap_or(u32::MAX)
}

/// Append the words of a buffer argument's `shape` and `strides`, each saturated.
pub fn push_layout_words(words: &mut Vec<u32>, shape: &[usize], strides: &[usize]) {
    words.extend(shape.iter().map(|&d| saturate(d as u64)));
    words.extend(strides.iter().map(|&s| saturate(s as u64)));
}

/// Write each scalar's words ([`ScalarValue::word_bits`]) at its word of `words` (plus `start`):
/// one word, two for a 64-bit scalar.
pub fn write_scalar_words(words: &mut [u32], start: usize, scalars: &[ScalarValue], at: &[u32]) {
    for (value, &offset) in scalars.iter().zip(at) {
        let w = value.word_bits();
        let at = start + offset as usize;
        words[at] = w[0];
        if value.elem_type().size() == 8 {
            words[at + 1] = w[1];
        }
    }
}

/// How a device binds storage buffer ranges.
#[derive(Clone, Copy, Debug)]
pub struct BindLimits {
    /// The alignment of a bound range's start (the device's minimum storage buffer offset
    /// alignment).
    pub align: u64,
    /// The most bytes one binding may cover.
    pub max: u64,
    /// The name of that limit in the backend's API, for the error.
    pub limit: &'static str,
}

/// The range bound for one buffer argument, and the argument's place in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundRange {
    /// Where the bound range starts in the buffer (aligned to [`BindLimits::align`]).
    pub offset: u64,
    /// How many bytes it covers.
    pub size: u64,
    /// Where the argument starts in the range, in items.
    pub base: u32,
    /// How many items the argument holds.
    pub len: u32,
}

impl BindLimits {
    /// The range to bind for an argument of `item`-byte items at `offset` (`size` bytes) of a
    /// buffer of `block` bytes: from the aligned start below `offset` to the argument's end, at
    /// least one item, in whole words, clipped to the buffer. The alignments are nearly always
    /// powers of two: masks and shifts then, no division on the launch path.
    ///
    /// # Errors
    /// [`LaunchError::MisalignedBuffer`] when the argument does not start at a whole item of
    /// the range, [`LaunchError::BindingTooLarge`] when the range exceeds [`max`](Self::max).
    #[inline]
    pub fn bind(
        &self,
        kernel: &str,
        (offset, size, block): (u64, u64, u64),
        item: u64,
    ) -> Result<BoundRange, ServerError> {
        let item = item.max(1);
        let bind_offset = if self.align.is_power_of_two() {
            offset & !(self.align - 1)
        } else {
            offset / self.align * self.align
        };
        let delta = offset - bind_offset;
        let in_items = |bytes: u64| {
            if item.is_power_of_two() {
                bytes >> item.trailing_zeros()
            } else {
                bytes / item
            }
        };
        let misaligned = if item.is_power_of_two() {
            delta & (item - 1) != 0
        } else {
            !delta.is_multiple_of(item)
        };
        if misaligned {
            return Err(LaunchError::MisalignedBuffer {
                kernel: kernel.into(),
                name: "argument".into(),
                offset,
                alignment: item,
            }
            .into());
        }
        let mut range = (delta + size).max(item).next_multiple_of(4);
        if bind_offset + range > block {
            range = block - bind_offset;
        }
        if range > self.max {
            return Err(LaunchError::BindingTooLarge {
                kernel: kernel.into(),
                bytes: range,
                maximum: self.max,
                limit: self.limit,
            }
            .into());
        }
        Ok(BoundRange {
            offset: bind_offset,
            size: range,
            base: saturate(in_items(delta)),
            len: saturate(in_items(size)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BindLimits = BindLimits {
        align: 256,
        max: 1 << 20,
        limit: "max",
    };

    #[test]
    fn a_range_starts_aligned_and_counts_items() {
        let r = LIMITS.bind("k", (256 + 64, 40, 4096), 4).unwrap();
        assert_eq!(
            r,
            BoundRange {
                offset: 256,
                size: 104,
                base: 16,
                len: 10
            }
        );
        // Clipped to the buffer; at least one item.
        assert_eq!(LIMITS.bind("k", (0, 0, 2), 8).unwrap().size, 2);
        // Non-power-of-two items and alignments divide.
        let odd = BindLimits {
            align: 12,
            ..LIMITS
        };
        let r = odd.bind("k", (30, 6, 4096), 6).unwrap();
        assert_eq!((r.offset, r.base, r.len), (24, 1, 1));
    }

    #[test]
    fn misaligned_and_oversized_ranges_are_refused() {
        assert!(LIMITS.bind("k", (258, 4, 4096), 4).is_err());
        assert!(LIMITS.bind("k", (0, 2 << 20, 4 << 20), 4).is_err());
    }
}
