//! Files read through memory maps whose pages a reader hands back once it is done with them, so
//! that loading a model holds the model once rather than the model and its file.

use std::ops::Range;
use std::path::Path;

use memmap2::{Mmap, UncheckedAdvice};

/// The file at `path`, mapped read-only.
pub(crate) fn map(path: &Path) -> std::io::Result<Mmap> {
    let file = std::fs::File::open(path)?;
    // SAFETY: the map is read-only; a file changed under a running process would change what
    // is read, as it would for any reader, and every access is bounds-checked by its reader.
    #[allow(unsafe_code)]
    unsafe {
        Mmap::map(&file)
    }
}

/// Lets the system drop the pages of `range` of `map` from the process's memory (they are read
/// again from the file should they be needed).
pub(crate) fn release(map: &Mmap, range: Range<usize>) {
    // SAFETY: the map is read-only and shared, so dropping its pages discards nothing: a later
    // read faults them back in from the file. A failure only leaves them mapped.
    #[allow(unsafe_code)]
    let _ =
        unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, range.start, range.len()) };
}
