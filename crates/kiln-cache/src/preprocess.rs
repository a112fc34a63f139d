//! Image preprocessing that reproduces Hugging Face image processors (CLIPImageProcessor,
//! SiglipImageProcessor, BitImageProcessor and their Fast / Pil variants): resize, centre crop,
//! rescale and normalise, in that order.
//!
//! The cache stores images after the resize and crop, as 8-bit RGB: that is what transformers'
//! processors produce before they rescale (their resize rounds to 8 bits too). Rescale and
//! normalisation are one affine map per channel, applied on the device when a batch is uploaded
//! (see [`Preprocess::affine`]).
//!
//! ```
//! use kiln_cache::{Preprocess, Resample, Resize};
//!
//! let json = r#"{"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 224},
//!                "crop_size": {"height": 224, "width": 224}, "resample": 3}"#;
//! let clip = Preprocess::from_hf_json(json)?;
//! assert_eq!(clip.resize, Some(Resize::ShortestEdge(224)));
//! assert_eq!(clip.resample, Resample::Bicubic);
//! assert_eq!(clip.output_size(480, 640)?, (224, 224));
//! # Ok::<(), kiln_cache::CacheError>(())
//! ```

use std::path::Path;

use image::RgbImage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{CacheError, resample};

/// OpenAI CLIP's channel mean (also BitImageProcessor's default).
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// OpenAI CLIP's channel standard deviation.
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];
/// ImageNet's channel mean (DINOv2).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet's channel standard deviation (DINOv2).
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Resampling filter, as PIL defines them (and `resample` numbers them in processor configs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Resample {
    /// PIL 0.
    Nearest,
    /// PIL 1 (Lanczos, 3 lobes).
    Lanczos,
    /// PIL 2 (triangle filter, antialiased when downscaling).
    Bilinear,
    /// PIL 3 (Keys cubic with a = -0.5, antialiased when downscaling).
    Bicubic,
    /// PIL 4.
    Box,
    /// PIL 5.
    Hamming,
}

impl Resample {
    /// The filter PIL numbers `code`.
    pub fn from_pil(code: u64) -> Result<Self, CacheError> {
        Ok(match code {
            0 => Resample::Nearest,
            1 => Resample::Lanczos,
            2 => Resample::Bilinear,
            3 => Resample::Bicubic,
            4 => Resample::Box,
            5 => Resample::Hamming,
            _ => {
                return Err(CacheError::Config(format!(
                    "unknown resample {code}: PIL numbers its filters 0 (nearest) to 5 (hamming)"
                )));
            }
        })
    }
}

/// How images are resized before the crop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resize {
    /// The shorter edge becomes this long, the longer one keeps the aspect ratio (truncated, as
    /// transformers computes it).
    ShortestEdge(u32),
    /// Exactly `height × width`.
    Exact {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
}

/// A centre crop to `height × width` (zero-padded where the image is smaller, as transformers
/// does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Crop {
    /// Output height.
    pub height: u32,
    /// Output width.
    pub width: u32,
}

/// Per-channel `(x · rescale − mean) / std`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Normalize {
    /// Channel means, in rescaled units.
    pub mean: [f32; 3],
    /// Channel standard deviations, in rescaled units.
    pub std: [f32; 3],
}

/// A typed image processor: what happens to every image between decoding and the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preprocess {
    /// Resize step (`None`: keep the decoded size).
    pub resize: Option<Resize>,
    /// Filter of the resize.
    pub resample: Resample,
    /// Centre crop after the resize.
    pub center_crop: Option<Crop>,
    /// Factor applied to 8-bit values (`None`: none, values stay 0–255).
    pub rescale: Option<f32>,
    /// Normalisation after the rescale.
    pub normalize: Option<Normalize>,
}

/// The processor families kiln reads configs of.
const FAMILIES: &str =
    "CLIPImageProcessor, SiglipImageProcessor, BitImageProcessor (and their Fast / Pil variants)";

impl Preprocess {
    /// CLIP's processor (`openai/clip-vit-*`): bicubic shortest edge `size`, centre crop
    /// `size × size`, OpenAI mean/std.
    pub fn clip(size: u32) -> Self {
        Preprocess {
            resize: Some(Resize::ShortestEdge(size)),
            resample: Resample::Bicubic,
            center_crop: Some(Crop {
                height: size,
                width: size,
            }),
            rescale: Some(1.0 / 255.0),
            normalize: Some(Normalize {
                mean: CLIP_MEAN,
                std: CLIP_STD,
            }),
        }
    }

    /// SigLIP / SigLIP2 fixed-resolution processors: bilinear resize to `size × size`, mean and
    /// std 0.5.
    pub fn siglip(size: u32) -> Self {
        Preprocess {
            resize: Some(Resize::Exact {
                height: size,
                width: size,
            }),
            resample: Resample::Bilinear,
            center_crop: None,
            rescale: Some(1.0 / 255.0),
            normalize: Some(Normalize {
                mean: [0.5; 3],
                std: [0.5; 3],
            }),
        }
    }

    /// DINOv2's processor (`facebook/dinov2-*`): bicubic shortest edge `resize`, centre crop
    /// `crop × crop`, ImageNet mean/std. The released checkpoints use (256, 224).
    pub fn dinov2(resize: u32, crop: u32) -> Self {
        Preprocess {
            resize: Some(Resize::ShortestEdge(resize)),
            center_crop: Some(Crop {
                height: crop,
                width: crop,
            }),
            normalize: Some(Normalize {
                mean: IMAGENET_MEAN,
                std: IMAGENET_STD,
            }),
            ..Preprocess::clip(crop)
        }
    }

    /// Reads a model directory's `preprocessor_config.json`.
    pub fn from_hf_config(path: impl AsRef<Path>) -> Result<Self, CacheError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| CacheError::io(path, e))?;
        Preprocess::from_hf_json(&text)
            .map_err(|e| CacheError::Config(format!("{}: {e}", path.display())))
    }

    /// Parses the JSON of a `preprocessor_config.json`. Keys it lacks take the defaults of its
    /// `image_processor_type`, as transformers does.
    pub fn from_hf_json(json: &str) -> Result<Self, CacheError> {
        let config: Value = serde_json::from_str(json)
            .map_err(|e| CacheError::Config(format!("not a processor config: {e}")))?;
        let kind = config
            .get("image_processor_type")
            .or_else(|| config.get("feature_extractor_type"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let family = kind
            .trim_end_matches("Fast")
            .trim_end_matches("Pil")
            .replace("FeatureExtractor", "ImageProcessor");
        let (defaults, square_sizes) = match family.as_str() {
            "CLIPImageProcessor" => (Preprocess::clip(224), false),
            // Fixed-resolution SigLIP2 checkpoints ship this one too; Siglip2ImageProcessor is NaFlex.
            "SiglipImageProcessor" => (
                Preprocess {
                    resample: Resample::Bicubic,
                    ..Preprocess::siglip(224)
                },
                true,
            ),
            "BitImageProcessor" => (
                Preprocess {
                    normalize: Some(Normalize {
                        mean: CLIP_MEAN,
                        std: CLIP_STD,
                    }),
                    ..Preprocess::dinov2(224, 224)
                },
                false,
            ),
            _ => {
                return Err(CacheError::Config(format!(
                    "unsupported image_processor_type `{kind}`: kiln reads {FAMILIES}{}",
                    if family.starts_with("Siglip2") {
                        " (NaFlex processors are out of scope)"
                    } else {
                        ""
                    }
                )));
            }
        };
        let flag = |key: &str| config.get(key).and_then(Value::as_bool);
        let resize = match flag("do_resize") {
            Some(false) => None,
            _ => match config.get("size") {
                None | Some(Value::Null) => defaults.resize,
                Some(size) => Some(parse_resize(size, square_sizes)?),
            },
        };
        let center_crop = match (flag("do_center_crop"), config.get("crop_size")) {
            (Some(false), _) => None,
            // A family without a default crop (SigLIP) crops only when told to.
            (None, _) if defaults.center_crop.is_none() => None,
            (_, None | Some(Value::Null)) => defaults.center_crop,
            (_, Some(size)) => Some(parse_crop(size)?),
        };
        let resample = match config.get("resample").and_then(Value::as_u64) {
            Some(code) => Resample::from_pil(code)?,
            None => defaults.resample,
        };
        let rescale = match flag("do_rescale") {
            Some(false) => None,
            _ => match config.get("rescale_factor").and_then(Value::as_f64) {
                Some(factor) => Some(factor as f32),
                None => defaults.rescale,
            },
        };
        let normalize = match flag("do_normalize") {
            Some(false) => None,
            _ => {
                let defaults = defaults.normalize.expect("every family normalises");
                Some(Normalize {
                    mean: parse_channels(config.get("image_mean"), "image_mean")?
                        .unwrap_or(defaults.mean),
                    std: parse_channels(config.get("image_std"), "image_std")?
                        .unwrap_or(defaults.std),
                })
            }
        };
        Ok(Preprocess {
            resize,
            resample,
            center_crop,
            rescale,
            normalize,
        })
    }

    /// Height and width of an image of `height × width` after the resize (before the crop).
    fn resized_size(&self, height: u32, width: u32) -> Result<(u32, u32), CacheError> {
        if height == 0 || width == 0 {
            return Err(CacheError::Config("an image without pixels".into()));
        }
        Ok(match self.resize {
            None => (height, width),
            Some(Resize::Exact { height, width }) => (height, width),
            Some(Resize::ShortestEdge(size)) => {
                // transformers: new_long = int(size * long / short), in f64.
                let (short, long) = (height.min(width), height.max(width));
                let new_long = (size as f64 * long as f64 / short as f64) as u32;
                if height <= width {
                    (size, new_long)
                } else {
                    (new_long, size)
                }
            }
        })
    }

    /// Height and width of an image of `height × width` after the resize and crop.
    pub fn output_size(&self, height: u32, width: u32) -> Result<(u32, u32), CacheError> {
        let resized = self.resized_size(height, width)?;
        Ok(self
            .center_crop
            .map_or(resized, |crop| (crop.height, crop.width)))
    }

    /// The size every image has after this preprocessing, where it does not depend on the input
    /// (an exact resize or a crop); caching images as one `[N, 3, H, W]` tensor needs one.
    pub fn fixed_size(&self) -> Option<(u32, u32)> {
        match (self.center_crop, self.resize) {
            (Some(crop), _) => Some((crop.height, crop.width)),
            (None, Some(Resize::Exact { height, width })) => Some((height, width)),
            _ => None,
        }
    }

    /// Resizes and crops `image`: the 8-bit stage that the cache stores.
    pub fn resize_and_crop(&self, image: &RgbImage) -> Result<RgbImage, CacheError> {
        let (height, width) = self.resized_size(image.height(), image.width())?;
        let resized = if (height, width) == (image.height(), image.width()) {
            image.clone()
        } else {
            let pixels = resample::resize_rgb(
                image.as_raw(),
                (image.height() as usize, image.width() as usize),
                (height as usize, width as usize),
                self.resample,
            );
            RgbImage::from_raw(width, height, pixels).expect("resize_rgb fills the image")
        };
        Ok(match self.center_crop {
            Some(crop) => center_crop(&resized, crop),
            None => resized,
        })
    }

    /// Rescale and normalisation as one affine map per channel, `x ↦ x · scale + offset` on 8-bit
    /// values 0–255.
    pub fn affine(&self) -> ([f32; 3], [f32; 3]) {
        let rescale = self.rescale.unwrap_or(1.0);
        match self.normalize {
            Some(Normalize { mean, std }) => (
                std::array::from_fn(|c| rescale / std[c]),
                std::array::from_fn(|c| -mean[c] / std[c]),
            ),
            None => ([rescale; 3], [0.0; 3]),
        }
    }
}

fn config_error(key: &str, value: &Value, want: &str) -> CacheError {
    CacheError::Config(format!("`{key}` is {value}, expected {want}"))
}

fn parse_dim(value: &Value, key: &str) -> Result<u32, CacheError> {
    value
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| v > 0)
        .ok_or_else(|| config_error(key, value, "a positive integer"))
}

/// `size`: `{"shortest_edge": S}`, `{"height": H, "width": W}` or a bare integer (a square for
/// SigLIP, a shortest edge for CLIP and BiT, as their `default_to_square` says).
fn parse_resize(size: &Value, square: bool) -> Result<Resize, CacheError> {
    if let Some(edge) = size.get("shortest_edge") {
        if size.get("longest_edge").is_some_and(|v| !v.is_null()) {
            return Err(config_error(
                "size",
                size,
                "no `longest_edge` (kiln caches fixed-size images)",
            ));
        }
        return Ok(Resize::ShortestEdge(parse_dim(edge, "size.shortest_edge")?));
    }
    if let (Some(h), Some(w)) = (size.get("height"), size.get("width")) {
        return Ok(Resize::Exact {
            height: parse_dim(h, "size.height")?,
            width: parse_dim(w, "size.width")?,
        });
    }
    let edge = parse_dim(size, "size")?;
    Ok(if square {
        Resize::Exact {
            height: edge,
            width: edge,
        }
    } else {
        Resize::ShortestEdge(edge)
    })
}

fn parse_crop(size: &Value) -> Result<Crop, CacheError> {
    if let (Some(h), Some(w)) = (size.get("height"), size.get("width")) {
        return Ok(Crop {
            height: parse_dim(h, "crop_size.height")?,
            width: parse_dim(w, "crop_size.width")?,
        });
    }
    let edge = parse_dim(size, "crop_size")?;
    Ok(Crop {
        height: edge,
        width: edge,
    })
}

/// `image_mean` / `image_std`: three numbers, or one for every channel.
fn parse_channels(value: Option<&Value>, key: &str) -> Result<Option<[f32; 3]>, CacheError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let numbers: Option<Vec<f32>> = match value {
        Value::Array(items) => items.iter().map(|v| v.as_f64().map(|x| x as f32)).collect(),
        v => v.as_f64().map(|x| vec![x as f32]),
    };
    let channels = match numbers.as_deref() {
        Some(&[x]) => [x; 3],
        Some(&[r, g, b]) => [r, g, b],
        _ => return Err(config_error(key, value, "three numbers")),
    };
    // Pixels are divided by the standard deviations: 0 would make every embedding NaN.
    let usable = |x: f32| x.is_finite() && (key != "image_std" || x > 0.0);
    if !channels.iter().all(|&x| usable(x)) {
        let expected = match key {
            "image_std" => "positive finite numbers (pixels are divided by them)",
            _ => "finite numbers",
        };
        return Err(config_error(key, value, expected));
    }
    Ok(Some(channels))
}

/// transformers' centre crop: offsets `(size - crop) / 2` rounded down, zero padding centred
/// (rounded up) where the image is smaller than the crop.
fn center_crop(image: &RgbImage, crop: Crop) -> RgbImage {
    let offset = |size: u32, crop: u32| -> i64 {
        let padded = size.max(crop);
        let pad = (padded - size).div_ceil(2) as i64;
        (padded as i64 - crop as i64) / 2 - pad
    };
    let top = offset(image.height(), crop.height);
    let left = offset(image.width(), crop.width);
    // Rows and columns of the crop that fall inside the image; the rest stays zero.
    let inside = |offset: i64, crop: u32, size: u32| {
        (0.max(-offset) as usize)..((size as i64 - offset).clamp(0, crop as i64) as usize)
    };
    let (rows, columns) = (
        inside(top, crop.height, image.height()),
        inside(left, crop.width, image.width()),
    );
    let mut out = RgbImage::new(crop.width, crop.height);
    let (stride_in, stride_out) = (image.width() as usize * 3, crop.width as usize * 3);
    for y in rows {
        let source_row = (y as i64 + top) as usize * stride_in;
        let source = source_row + (columns.start as i64 + left) as usize * 3;
        let target = y * stride_out + columns.start * 3;
        let len = columns.len() * 3;
        out.as_mut()[target..target + len].copy_from_slice(&image.as_raw()[source..source + len]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortest_edge_truncates_like_transformers() {
        let p = Preprocess {
            center_crop: None,
            ..Preprocess::clip(224)
        };
        // int(224 * 640 / 480) = 298; int(224 * 333 / 250) = 298 (298.368)
        assert_eq!(p.output_size(480, 640).unwrap(), (224, 298));
        assert_eq!(p.output_size(333, 250).unwrap(), (298, 224));
        assert_eq!(p.output_size(100, 100).unwrap(), (224, 224));
        assert_eq!(p.fixed_size(), None);
        assert_eq!(Preprocess::clip(224).fixed_size(), Some((224, 224)));
    }

    #[test]
    fn center_crop_offsets_and_padding() {
        // 5 wide, crop 2: left = (5 - 2) / 2 = 1.
        let image = RgbImage::from_fn(5, 3, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let out = center_crop(
            &image,
            Crop {
                height: 1,
                width: 2,
            },
        );
        assert_eq!(out.get_pixel(0, 0).0, [1, 1, 7]);
        // 3 tall padded to 6: pad = ceil(3 / 2) = 2 rows of zeros on top.
        let padded = center_crop(
            &image,
            Crop {
                height: 6,
                width: 5,
            },
        );
        assert_eq!(padded.get_pixel(0, 1).0, [0, 0, 0]);
        assert_eq!(padded.get_pixel(3, 2).0, [3, 0, 7]);
        assert_eq!(padded.get_pixel(3, 5).0, [0, 0, 0]);
    }

    #[test]
    fn configs_of_each_family() {
        let siglip = Preprocess::from_hf_json(
            r#"{"image_processor_type": "SiglipImageProcessor", "size": {"height": 384, "width": 384},
                "resample": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                "do_normalize": true, "do_rescale": true, "rescale_factor": 0.00392156862745098}"#,
        )
        .unwrap();
        assert_eq!(siglip, Preprocess::siglip(384));
        let (scale, offset) = siglip.affine();
        assert!((scale[0] - 2.0 / 255.0).abs() < 1e-9 && offset == [-1.0; 3]);

        let dinov2 = Preprocess::from_hf_json(
            r#"{"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 256},
                "crop_size": {"height": 224, "width": 224}, "do_center_crop": true, "resample": 3,
                "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}"#,
        )
        .unwrap();
        assert_eq!(dinov2, Preprocess::dinov2(256, 224));

        // Legacy keys: a bare integer size, the feature-extractor name.
        let legacy = Preprocess::from_hf_json(
            r#"{"feature_extractor_type": "CLIPFeatureExtractor", "size": 224, "crop_size": 224}"#,
        )
        .unwrap();
        assert_eq!(legacy, Preprocess::clip(224));

        let no_norm = Preprocess::from_hf_json(
            r#"{"image_processor_type": "CLIPImageProcessorFast", "do_normalize": false,
                "do_center_crop": false}"#,
        )
        .unwrap();
        assert_eq!((no_norm.normalize, no_norm.center_crop), (None, None));
    }

    #[test]
    fn bad_configs_are_explained() {
        for (json, want) in [
            (
                r#"{"image_processor_type": "ViTImageProcessor"}"#,
                "kiln reads CLIPImageProcessor",
            ),
            (
                r#"{"image_processor_type": "Siglip2ImageProcessor"}"#,
                "NaFlex processors are out of scope",
            ),
            (
                r#"{"image_processor_type": "CLIPImageProcessor", "resample": 9}"#,
                "unknown resample 9",
            ),
            (
                r#"{"image_processor_type": "CLIPImageProcessor", "image_mean": [1, 2]}"#,
                "`image_mean` is [1,2], expected three numbers",
            ),
            (
                r#"{"image_processor_type": "CLIPImageProcessor", "image_std": [0.5, 0, 0.5]}"#,
                "`image_std` is [0.5,0,0.5], expected positive finite numbers",
            ),
            (
                r#"{"image_processor_type": "CLIPImageProcessor", "image_std": -1}"#,
                "`image_std` is -1, expected positive finite numbers",
            ),
            (
                r#"{"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 0}}"#,
                "expected a positive integer",
            ),
            ("[", "not a processor config"),
        ] {
            let err = Preprocess::from_hf_json(json).unwrap_err().to_string();
            assert!(err.contains(want), "{json}: {err}");
        }
    }
}
