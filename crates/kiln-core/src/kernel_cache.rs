//! Kernels compiled once per machine: the GPU backends keep the code they compile in a directory
//! that outlives the process, so a second run skips the compiler (CUDA's PTX; wgpu's SPIR-V where
//! cubecl compiles to it — burn's default wgpu build emits WGSL, which cubecl 0.10 does not cache).
//!
//! cubecl 0.10 has this cache and leaves it off unless a `cubecl.toml` turns it on; kiln turns
//! it on, in `$XDG_CACHE_HOME/kiln/kernels` (`~/.cache/kiln/kernels` on Linux,
//! `~/Library/Caches/kiln/kernels` on macOS), the first time a GPU device is probed. The
//! environment variable `KILN_KERNEL_CACHE` picks another directory, or turns the cache off
//! with `off`. A `cubecl.toml` (or a `[cubecl]` section of `burn.toml`) that sets
//! `[compilation] cache` itself wins over both. Entries are keyed by cubecl's version and the
//! kernel's stable hash, written under a file lock, so processes may share the directory; a
//! directory that cannot be written only costs the cache.
//!
//! ```no_run
//! // Before the first GPU call; `DeviceSpec::run` and `probe` do this themselves.
//! match kiln_core::enable_kernel_cache() {
//!     Some(dir) => println!("kernels cached in {}", dir.display()),
//!     None => println!("kernels compiled every run"),
//! }
//! ```

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The environment variable that moves the kernel cache (a directory) or turns it off (`off`).
pub const KERNEL_CACHE_ENV: &str = "KILN_KERNEL_CACHE";

/// Where the kernel cache goes, before any configuration file is read: `KILN_KERNEL_CACHE`
/// (`None` for `off`, `0`, `false`, `none` or an empty value), else the user's cache directory.
pub fn kernel_cache_dir() -> Option<PathBuf> {
    cache_dir_for(std::env::var_os(KERNEL_CACHE_ENV))
}

fn cache_dir_for(setting: Option<OsString>) -> Option<PathBuf> {
    match setting {
        Some(value) => {
            let text = value.to_string_lossy().trim().to_ascii_lowercase();
            let off = ["", "off", "0", "false", "none"].contains(&text.as_str());
            (!off).then(|| PathBuf::from(value))
        }
        None => dirs::cache_dir().map(|dir| dir.join("kiln").join("kernels")),
    }
}

/// Turns cubecl's compilation cache on (once per process) and returns the directory it uses,
/// or `None` when it stays off. Call it before the first GPU kernel runs: once cubecl has read
/// its configuration, this changes nothing and reports what cubecl uses.
pub fn enable_kernel_cache() -> Option<PathBuf> {
    static CACHE: OnceLock<Option<PathBuf>> = OnceLock::new();
    CACHE.get_or_init(configure).clone()
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn configure() -> Option<PathBuf> {
    use burn::cubecl::config::cache::CacheConfig;
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    use std::sync::Arc;

    let mut slot = CubeClRuntimeConfig::storage().lock();
    if let Some(config) = slot.as_ref() {
        return config.compilation.cache.as_ref().map(CacheConfig::root);
    }
    // What cubecl itself would read: the nearest cubecl.toml / burn.toml, then CUBECL_* variables.
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    if config.compilation.cache.is_none() {
        config.compilation.cache = kernel_cache_dir().map(CacheConfig::File);
    }
    let root = config.compilation.cache.as_ref().map(CacheConfig::root);
    *slot = Some(Arc::new(config));
    root
}

#[cfg(not(any(feature = "cuda", feature = "wgpu")))]
fn configure() -> Option<PathBuf> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_goes_to_the_users_cache_directory_unless_moved_or_turned_off() {
        let default = cache_dir_for(None).expect("a user cache directory");
        assert!(default.ends_with("kiln/kernels"), "{}", default.display());
        assert_eq!(
            cache_dir_for(Some("/scratch/kernels".into())),
            Some(PathBuf::from("/scratch/kernels"))
        );
        for off in ["off", "OFF", "0", "false", "none", "", " "] {
            assert_eq!(cache_dir_for(Some(off.into())), None, "{off:?}");
        }
    }
}
