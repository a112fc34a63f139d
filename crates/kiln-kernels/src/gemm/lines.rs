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
pub(crate) unsafe trait Plain: Copy + Send + Sync {}

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

    /// `len` values written chunk by chunk: `fill(index, chunk)` for each `chunk_len` values
    /// (the last chunk may be shorter), each chunk zeroed just before (so where `fill` writes
    /// nothing it holds zeros), on every rayon thread when `parallel`. The whole buffer is never
    /// zeroed first on one thread: a chunk is zeroed while it is about to be in this core's
    /// cache anyway (a serial memset of each packed weight was 2–3% of a bf16 training step).
    ///
    /// Panics when `chunk_len` is 0 and `len` is not.
    pub(crate) fn filled(
        len: usize,
        chunk_len: usize,
        parallel: bool,
        fill: impl Fn(usize, &mut [T]) + Sync,
    ) -> Self {
        use rayon::prelude::*;
        use std::mem::MaybeUninit;
        assert!(chunk_len > 0 || len == 0, "Lines::filled: empty chunks");
        let count = (len * size_of::<T>()).div_ceil(LINE);
        let mut lines: Vec<Line> = Vec::with_capacity(count);
        // SAFETY: the capacity of `count` lines holds `len` values of `T`, whose alignment
        // divides a line's (`Plain`).
        let values: &mut [MaybeUninit<T>] =
            unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast(), len) };
        let fill_chunk = |(index, chunk): (usize, &mut [MaybeUninit<T>])| {
            // SAFETY: zero bytes are a value of `T` (`Plain`), so the zeroed chunk is
            // initialised.
            let chunk = unsafe {
                std::ptr::write_bytes(chunk.as_mut_ptr(), 0, chunk.len());
                &mut *(std::ptr::from_mut(chunk) as *mut [T])
            };
            fill(index, chunk);
        };
        match parallel {
            true => (values.par_chunks_mut(chunk_len.max(1)).enumerate()).for_each(fill_chunk),
            false => (values.chunks_mut(chunk_len.max(1)).enumerate()).for_each(fill_chunk),
        }
        // SAFETY: the bytes after the last value, to the end of its line, zeroed as `resize`
        // keeps them; every line is then initialised.
        unsafe {
            let written = len * size_of::<T>();
            let bytes = lines.as_mut_ptr().cast::<u8>();
            std::ptr::write_bytes(bytes.add(written), 0, count * LINE - written);
            lines.set_len(count);
        }
        Lines {
            lines,
            len,
            _values: std::marker::PhantomData,
        }
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

    /// Each chunk holds what its fill wrote and zeros elsewhere, on one thread or all; growing
    /// the buffer afterwards finds zeros past its values.
    #[test]
    fn filled_chunks_hold_their_writes_and_zeros() {
        for parallel in [false, true] {
            let mut values = Lines::<u16>::filled(45, 10, parallel, |index, chunk| {
                chunk[0] = index as u16 + 1;
            });
            assert_eq!(values.as_ptr() as usize % LINE, 0);
            let want: Vec<u16> = (0..45)
                .map(|i| if i % 10 == 0 { i / 10 + 1 } else { 0 })
                .collect();
            assert_eq!(&values[..], &want[..]);
            values.resize(64);
            assert_eq!(&values[45..], &[0; 19]);
        }
        assert!(Lines::<f32>::filled(0, 0, true, |_, _| unreachable!()).is_empty());
    }
}
