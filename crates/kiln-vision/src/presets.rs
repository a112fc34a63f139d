//! Released architectures by short name (`clip-b32`, `dinov2-s`, ...) with the image processing
//! their checkpoints ship with: what the Monte-Carlo example, the benchmarks and tests build when
//! they run a tower without a checkpoint (random weights).
//!
//! ```
//! use kiln_vision::{Preset, Processor, VisionConfig};
//!
//! let preset = Preset::named("dinov2-s")?;
//! assert!(matches!(preset.config, VisionConfig::Dinov2(_)));
//! assert_eq!(preset.processor, Processor::Dinov2 { resize: 256, crop: 224 });
//! assert!(Preset::named("clip-b64").is_err());
//! # Ok::<(), kiln_vision::VisionError>(())
//! ```

use crate::{ClipVisionConfig, Dinov2Config, SiglipVisionConfig, VisionConfig, VisionError};

/// The image processing a tower's checkpoints ship with (`preprocessor_config.json`), by kind
/// and size: kiln-cache's `Preprocess::{clip, siglip, dinov2}` build it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processor {
    /// Shortest edge to `size` (bicubic), centre crop `size`, CLIP's mean and std.
    Clip {
        /// Side in pixels.
        size: u32,
    },
    /// Resize to `size × size` (bilinear), mean and std 0.5.
    Siglip {
        /// Side in pixels.
        size: u32,
    },
    /// Shortest edge to `resize` (bicubic), centre crop `crop`, ImageNet's mean and std.
    Dinov2 {
        /// Shortest edge after the resize.
        resize: u32,
        /// Side of the centre crop.
        crop: u32,
    },
}

/// A released architecture under its short name.
#[derive(Debug, Clone, PartialEq)]
pub struct Preset {
    /// The short name (`clip-b32`).
    pub name: &'static str,
    /// The tower's config.
    pub config: VisionConfig,
    /// How its images are processed.
    pub processor: Processor,
}

/// The presets' names: the released architectures, and two "mini" ones (CLIP and DINOv2 at 192
/// wide, 4 layers, 3 heads) for quick runs.
pub const PRESETS: [&str; 8] = [
    "clip-mini",
    "dinov2-mini",
    "clip-b32",
    "clip-l14",
    "siglip2-b16",
    "siglip2-so400m",
    "dinov2-s",
    "dinov2-b",
];

impl Preset {
    /// The preset called `name` (one of [`PRESETS`]).
    pub fn named(name: &str) -> Result<Self, VisionError> {
        let (name, config, processor) = match name {
            "clip-mini" => {
                let config = ClipVisionConfig {
                    hidden_size: 192,
                    intermediate_size: 768,
                    num_hidden_layers: 4,
                    num_attention_heads: 3,
                    projection_dim: 128,
                    ..ClipVisionConfig::vit_base_patch32()
                };
                ("clip-mini", VisionConfig::Clip(config), CLIP_224)
            }
            "dinov2-mini" => {
                let config = Dinov2Config {
                    hidden_size: 192,
                    num_hidden_layers: 4,
                    num_attention_heads: 3,
                    patch_size: 28,
                    image_size: 224,
                    ..Dinov2Config::small()
                };
                ("dinov2-mini", VisionConfig::Dinov2(config), DINOV2_224)
            }
            "clip-b32" => (
                "clip-b32",
                VisionConfig::Clip(ClipVisionConfig::vit_base_patch32()),
                CLIP_224,
            ),
            "clip-l14" => (
                "clip-l14",
                VisionConfig::Clip(ClipVisionConfig::vit_large_patch14()),
                CLIP_224,
            ),
            "siglip2-b16" => (
                "siglip2-b16",
                VisionConfig::Siglip(SiglipVisionConfig::base_patch16(224)),
                Processor::Siglip { size: 224 },
            ),
            "siglip2-so400m" => (
                "siglip2-so400m",
                VisionConfig::Siglip(SiglipVisionConfig::so400m_patch14_384()),
                Processor::Siglip { size: 384 },
            ),
            "dinov2-s" => (
                "dinov2-s",
                VisionConfig::Dinov2(Dinov2Config::small()),
                DINOV2_224,
            ),
            "dinov2-b" => (
                "dinov2-b",
                VisionConfig::Dinov2(Dinov2Config::base()),
                DINOV2_224,
            ),
            other => {
                return Err(VisionError::UnknownPreset {
                    name: other.to_string(),
                });
            }
        };
        Ok(Preset {
            name,
            config,
            processor,
        })
    }
}

const CLIP_224: Processor = Processor::Clip { size: 224 };
const DINOV2_224: Processor = Processor::Dinov2 {
    resize: 256,
    crop: 224,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every listed name is a preset under that name, whose config passes the checks a
    /// `config.json` would.
    #[test]
    fn every_listed_preset_exists_and_is_valid() {
        for name in PRESETS {
            let preset = Preset::named(name).unwrap();
            assert_eq!(preset.name, name);
            let shape = preset.config.tower().shape();
            let fits = shape.hidden.is_multiple_of(shape.heads) && shape.patch <= shape.image;
            assert!(fits, "{name}");
        }
        let error = Preset::named("clip-b64").unwrap_err().to_string();
        assert!(
            error.contains("clip-b64") && error.contains("dinov2-b"),
            "{error}"
        );
    }
}
