//! The global allocator of kiln's example programs and benchmarks (a library leaves that choice
//! to the program): mimalloc, told to keep the memory it frees.
//!
//! burn's CPU backends allocate every intermediate tensor afresh. An allocator that hands freed
//! blocks back to the kernel pays, on the next step, a page fault per 4 KiB and the kernel's
//! zeroing: glibc's unmaps every block over 32 MB at once, and mimalloc purges freed memory
//! after 10 ms by default. In the foveated model's training step at fVLM's shapes the kernel's
//! share was 66 s of a 3-minute run, and the step took 14.7 s instead of 8.2 s
//! (docs/PERFORMANCE.md). A training or Monte-Carlo loop reuses the same sizes every step, so
//! the programs keep what they free: resident memory stays at its peak, as PyTorch's caching
//! allocators keep theirs.

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, v2 and v3): milliseconds before freed memory
/// is purged; -1 never purges.
const MI_OPTION_PURGE_DELAY: i32 = 15;

#[allow(unsafe_code)] // a C declaration: mimalloc is C
unsafe extern "C" {
    /// mimalloc.h: `void mi_option_set(mi_option_t option, long value)`, in the static library
    /// that the `mimalloc` crate links.
    fn mi_option_set(option: i32, value: std::ffi::c_long);
}

/// Turns purging off, unless `MIMALLOC_PURGE_DELAY` chose a delay. Call first thing in `main`.
pub fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one process-wide option, which mimalloc reads whenever it may purge.
        #[allow(unsafe_code)]
        unsafe {
            mi_option_set(MI_OPTION_PURGE_DELAY, -1)
        };
    }
}
