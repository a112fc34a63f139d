//! kiln-vision's presets as kiln-cache preprocesses them.

use kiln_cache::Preprocess;
use kiln_vision::Processor;

/// What kiln-cache does to an image for a tower whose checkpoints ship with `processor`.
///
/// ```
/// use kiln_vision::Preset;
/// let preset = Preset::named("clip-b32")?;
/// assert_eq!(kiln_mc::preprocess(preset.processor), kiln_cache::Preprocess::clip(224));
/// # Ok::<(), kiln_vision::VisionError>(())
/// ```
pub fn preprocess(processor: Processor) -> Preprocess {
    match processor {
        Processor::Clip { size } => Preprocess::clip(size),
        Processor::Siglip { size } => Preprocess::siglip(size),
        Processor::Dinov2 { resize, crop } => Preprocess::dinov2(resize, crop),
    }
}
