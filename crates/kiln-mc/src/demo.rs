//! Images for the built-in demo and the benchmarks, so the main job runs on a fresh machine
//! without a dataset.

use std::path::Path;

use crate::McError;

/// Writes `count` deterministic 256 × 256 PNGs to `dir` (`image_0000.png`, …): smooth coloured
/// waves of different frequencies under noise of increasing strength, so images differ in how
/// much a stochastic model's embedding of them varies. The set appears whole (a staged directory
/// renamed into place); a `dir` that exists already must hold exactly this set, else the run is
/// refused (nothing else may join the dataset unnoticed).
pub fn demo_images(dir: &Path, count: usize) -> Result<(), McError> {
    if count == 0 {
        return Err(McError::Plan("no images to generate".into()));
    }
    let names: Vec<String> = (0..count).map(|i| format!("image_{i:04}.png")).collect();
    if dir.exists() {
        return check_demo_set(dir, &names);
    }
    // A fresh machine has no results directory yet (the README's first command writes
    // results/exp0/images).
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| McError::Store(format!("{}: {e}", parent.display())))?;
    }
    let fail = |e: kiln_io::FileError| McError::Store(e.to_string());
    let staged = kiln_io::StagedDir::new(dir).map_err(fail)?;
    for (i, name) in names.iter().enumerate() {
        let mut png = Vec::new();
        demo_image(i, count)
            .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
            .map_err(|e| McError::Store(format!("{name}: {e}")))?;
        staged.write(name, &png).map_err(fail)?;
    }
    if !staged.commit_if_absent().map_err(fail)? {
        // Another process generated the set at the same time.
        check_demo_set(dir, &names)?;
    }
    Ok(())
}

/// Refuses a directory that does not hold exactly the demo's files `names` (anything else in
/// it would silently join the dataset).
fn check_demo_set(dir: &Path, names: &[String]) -> Result<(), McError> {
    let fail = |e: std::io::Error| McError::Store(format!("{}: {e}", dir.display()));
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .map_err(fail)?
        .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(fail)?;
    found.sort();
    if found == names {
        return Ok(());
    }
    let extra = found.iter().find(|n| !names.contains(n));
    let missing = names.iter().find(|n| !found.contains(n));
    let what = match (extra, missing) {
        (Some(extra), _) => format!("holds `{extra}`, which the demo did not write"),
        (None, Some(missing)) => format!("lacks `{missing}`"),
        (None, None) => unreachable!("the sets differ"),
    };
    Err(McError::Plan(format!(
        "{}: {what}: it is not the demo set of {} images (give your images with --images, or \
         remove the directory to generate it again)",
        dir.display(),
        names.len()
    )))
}

/// Demo image `i` of `count`.
fn demo_image(i: usize, count: usize) -> image::RgbImage {
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
    image::RgbImage::from_fn(256, 256, |x, y| {
        let (u, v) = (f64::from(x) / 256.0, f64::from(y) / 256.0);
        let wave =
            |phase: f64| 127.5 + 100.0 * (std::f64::consts::TAU * (fx * u + fy * v) + phase).sin();
        image::Rgb([0.0, 2.1, 4.2].map(|p| (wave(p) + strength * noise()).clamp(0.0, 255.0) as u8))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The set appears whole and is reused as it is; a file the demo did not write, or one
    /// missing, makes the run refuse the directory (the file would join the dataset unnoticed).
    #[test]
    fn a_demo_directory_holds_exactly_the_demo_set() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("images");
        demo_images(&dir, 3).unwrap();
        let nested = root.path().join("results/exp0/images");
        demo_images(&nested, 1).expect("missing parents are created");
        let names = |dir: &Path| {
            let mut names: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            names
        };
        assert_eq!(
            names(&dir),
            ["image_0000.png", "image_0001.png", "image_0002.png"]
        );
        assert_eq!(
            names(root.path()),
            ["images", "results"],
            "no temporary left"
        );
        demo_images(&dir, 3).unwrap();
        std::fs::write(dir.join("holiday.jpg"), "mine").unwrap();
        let err = demo_images(&dir, 3).unwrap_err().to_string();
        assert!(err.contains("holds `holiday.jpg`"), "{err}");
        std::fs::remove_file(dir.join("holiday.jpg")).unwrap();
        let err = demo_images(&dir, 4).unwrap_err().to_string();
        assert!(err.contains("lacks `image_0003.png`"), "{err}");
    }
}
