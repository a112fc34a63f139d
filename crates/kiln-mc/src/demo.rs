//! Images for the built-in demo and the benchmarks, so the main job runs on a fresh machine
//! without a dataset.

use std::path::Path;

use crate::McError;

/// Writes `count` deterministic 256 × 256 PNGs to `dir` (`image_0000.png`, …): smooth coloured
/// waves of different frequencies under noise of increasing strength, so images differ in how
/// much a stochastic model's embedding of them varies.
pub fn demo_images(dir: &Path, count: usize) -> Result<(), McError> {
    if count == 0 {
        return Err(McError::Plan("no images to generate".into()));
    }
    let fail =
        |path: &Path, e: &dyn std::fmt::Display| McError::Store(format!("{}: {e}", path.display()));
    std::fs::create_dir_all(dir).map_err(|e| fail(dir, &e))?;
    for i in 0..count {
        // xorshift32: reproducible noise on every platform.
        let mut state = 0x9e37_79b9_u32.wrapping_mul(i as u32 + 1);
        let mut noise = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            f64::from(state) / f64::from(u32::MAX) - 0.5
        };
        let strength = 255.0 * i as f64 / count.max(2) as f64;
        let (fx, fy) = (1.0 + (i % 5) as f64, 1.0 + (i % 3) as f64);
        let picture = image::RgbImage::from_fn(256, 256, |x, y| {
            let (u, v) = (f64::from(x) / 256.0, f64::from(y) / 256.0);
            let wave = |phase: f64| {
                127.5 + 100.0 * (std::f64::consts::TAU * (fx * u + fy * v) + phase).sin()
            };
            image::Rgb(
                [0.0, 2.1, 4.2].map(|p| (wave(p) + strength * noise()).clamp(0.0, 255.0) as u8),
            )
        });
        let path = dir.join(format!("image_{i:04}.png"));
        picture.save(&path).map_err(|e| fail(&path, &e))?;
    }
    Ok(())
}
