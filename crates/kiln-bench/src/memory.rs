//! Peak resident host memory of this process, from Linux's `/proc/self/status` (VmHWM).

/// Resets the kernel's peak-RSS counter to the current RSS, so the next [`host_peak`] covers only
/// what ran in between. Returns false where that is not possible (not Linux, or not allowed); the
/// peak then covers the whole process lifetime.
pub fn reset_host_peak() -> bool {
    // Writing "5" to clear_refs resets VmHWM (Linux 4.0+, see proc(5)).
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak resident set size of this process in bytes (VmHWM), where the OS reports it.
pub fn host_peak() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        let kib = line
            .strip_prefix("VmHWM:")?
            .trim()
            .strip_suffix("kB")?
            .trim();
        kib.parse::<u64>().ok().map(|kib| kib * 1024)
    })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn peak_follows_a_large_allocation_and_resets() {
        const SIZE: usize = 256 << 20;
        let big = vec![1u8; SIZE];
        std::hint::black_box(&big);
        let with_big = host_peak().unwrap();
        drop(big);
        assert!(with_big >= SIZE as u64, "{with_big}");
        if reset_host_peak() {
            let after = host_peak().unwrap();
            assert!(
                after + (SIZE as u64) / 2 < with_big,
                "{after} vs {with_big}"
            );
        }
    }
}
