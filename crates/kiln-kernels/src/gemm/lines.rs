//! Packed operands in whole 64-byte cache lines, the first value at a line's start.
//!
//! A `Vec` of `u16` or `f32` starts wherever the allocator puts it (16 bytes past a line for
//! large buffers from glibc), so every 64-byte row of a packed panel straddled two lines: on a
//! Sapphire Rapids VM, AMX tile loads of such rows ran 6.4× slower than of aligned ones (four
//! 1 kB tile loads 68 ns against 10.6 ns), and a 2 × 2-tile product step 2.6× slower.
#![allow(unsafe_code)]

use std::ops::{Deref, DerefMut};

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; LINE]);

/// Bytes of a cache line.
const LINE: usize = 64;

/// An element type whose all-zero bits are a value and that has no padding, so that a line of
/// bytes holds `64 / size_of` of them.
///
/// # Safety
/// Every bit pattern of the type's size is a value, and its alignment divides 64.
pub(crate) unsafe trait Plain: Copy {}

// SAFETY: integers and floats: every bit pattern is a value; alignment 2 and 4.
unsafe impl Plain for u16 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}

/// `len` values of `T` starting at a cache line (zeros where never written).
pub(crate) struct Lines<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _values: std::marker::PhantomData<T>,
}

impl<T: Plain> Lines<T> {
    /// No values.
    pub(crate) const fn new() -> Self {
        Lines {
            lines: Vec::new(),
            len: 0,
            _values: std::marker::PhantomData,
        }
    }

    /// `len` zeros.
    pub(crate) fn zeros(len: usize) -> Self {
        let mut lines = Lines::new();
        lines.resize(len);
        lines
    }

    /// `len` values: those held before keep their values (also past a shorter length set
    /// since), the others are zero.
    pub(crate) fn resize(&mut self, len: usize) {
        let lines = (len * size_of::<T>()).div_ceil(LINE);
        if lines > self.lines.len() {
            self.lines.resize(lines, Line([0; LINE]));
        }
        self.len = len;
    }
}

impl<T: Plain> Default for Lines<T> {
    fn default() -> Self {
        Lines::new()
    }
}

impl<T: Plain> Deref for Lines<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` values of `T` (resize), every bit pattern is
        // one (`Plain`), and a line's alignment is a multiple of `T`'s.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len) }
    }
}

impl<T: Plain> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len) }
    }
}

impl<T: Plain + std::fmt::Debug> std::fmt::Debug for Lines<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_start_at_a_line_and_keep_theirs_when_grown() {
        let mut values = Lines::<u16>::zeros(5);
        assert_eq!(values.as_ptr() as usize % LINE, 0);
        assert_eq!(&values[..], &[0; 5]);
        values[4] = 7;
        values.resize(100);
        assert_eq!(values.len(), 100);
        assert_eq!(values.as_ptr() as usize % LINE, 0);
        assert_eq!((values[4], values[99]), (7, 0));
        values.resize(3);
        assert_eq!(values.len(), 3);
        let floats = Lines::<f32>::zeros(33);
        assert_eq!(floats.as_ptr() as usize % LINE, 0);
    }
}
