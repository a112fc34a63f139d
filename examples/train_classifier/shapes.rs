//! The generated task: 32 × 32 images of stripes at one of four orientations (0°, 45°, 90°,
//! 135°), each with its own period, phase, pair of colours and noise; the class is the
//! orientation. Files are named `c{class}_{index}.png`, so the labels travel with the names.

use std::path::Path;

use kiln::core::SplitMix64;

/// Classes (orientations).
pub const CLASSES: usize = 4;
/// Image side in pixels (the model's).
pub const SIDE: u32 = crate::model::IMAGE_SIZE as u32;

/// The file in a generated set that records how it was made.
const MADE_WITH: &str = "generated.json";

/// Writes `count` images into `dir` (through a staged directory renamed into place, so a run
/// killed half-way leaves no partial set, and data-parallel ranks starting together each make a
/// whole set and keep the first), with `generated.json` saying how; nothing when `dir` holds
/// the set of these settings, an error when it holds anything else.
pub fn generate(dir: &Path, count: usize, seed: u64) -> Result<(), String> {
    let settings = serde_json::json!({"images": count, "seed": seed}).to_string();
    if dir.is_dir() {
        let found = std::fs::read_to_string(dir.join(MADE_WITH)).unwrap_or_default();
        if found == settings {
            return Ok(());
        }
        let found = if found.is_empty() {
            "no record of how it was made".to_string()
        } else {
            found
        };
        return Err(format!(
            "{} holds images of other settings ({found}; this run {settings}): choose another --out",
            dir.display()
        ));
    }
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let staged = kiln::io::StagedDir::new(dir).map_err(|e| e.to_string())?;
    for i in 0..count {
        let mut random = SplitMix64::new(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let class = i % CLASSES;
        let angle = std::f64::consts::PI * class as f64 / CLASSES as f64;
        let (dx, dy) = (angle.cos(), angle.sin());
        let period = 4.0 + 6.0 * random.unit();
        let phase = std::f64::consts::TAU * random.unit();
        let colours: [[f64; 3]; 2] = [
            [0; 3].map(|_| 255.0 * random.unit()),
            [0; 3].map(|_| 255.0 * random.unit()),
        ];
        let picture = image::RgbImage::from_fn(SIDE, SIDE, |x, y| {
            let t = std::f64::consts::TAU * (f64::from(x) * dx + f64::from(y) * dy) / period;
            let mix = 0.5 + 0.5 * (t + phase).sin();
            image::Rgb([0, 1, 2].map(|c| {
                let v = colours[0][c] * mix + colours[1][c] * (1.0 - mix);
                (v + 40.0 * (random.unit() - 0.5)).clamp(0.0, 255.0) as u8
            }))
        });
        let path = staged.path().join(format!("c{class}_{i:05}.png"));
        picture
            .save(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    staged
        .write(MADE_WITH, settings.as_bytes())
        .map_err(|e| e.to_string())?;
    // Another process may have got there first: its set is the same.
    staged.commit_if_absent().map_err(|e| e.to_string())?;
    Ok(())
}

/// The class in a generated image's file name.
pub fn label(name: &str) -> Result<i64, String> {
    let file = Path::new(name)
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or(name);
    file.strip_prefix('c')
        .and_then(|rest| rest.split('_').next())
        .and_then(|class| class.parse().ok())
        .filter(|&class: &i64| (0..CLASSES as i64).contains(&class))
        .ok_or_else(|| format!("{name}: not a generated image (c<class>_<index>.png)"))
}
