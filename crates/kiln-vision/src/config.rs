//! Which tower a Hugging Face `config.json` describes ([`VisionConfig`]), and what kiln asks of
//! every tower's config ([`TowerConfig`]). Each tower's own config (field names and defaults as
//! transformers' `CLIPVisionConfig`, `SiglipVisionConfig`, `Dinov2Config`, so a missing key means
//! what it means there, with named constructors for the released sizes) is in the tower's file.
//!
//! ```
//! use kiln_vision::{ClipVisionConfig, VisionConfig};
//!
//! let json = r#"{"model_type": "clip", "projection_dim": 768,
//!                "vision_config": {"hidden_size": 1024, "intermediate_size": 4096,
//!                                  "num_hidden_layers": 24, "num_attention_heads": 16,
//!                                  "patch_size": 14}}"#;
//! let VisionConfig::Clip(clip) = VisionConfig::from_hf_json(json)? else { unreachable!() };
//! assert_eq!(clip, ClipVisionConfig::vit_large_patch14());
//! # Ok::<(), kiln_vision::VisionError>(())
//! ```

use std::path::Path;

use burn::tensor::backend::Backend;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::clip::ClipVisionConfig;
use crate::dinov2::Dinov2Config;
use crate::siglip::SiglipVisionConfig;
use crate::{VisionError, VisionModel};
use kiln_core::read_config;
use kiln_core::{MAX_LAYERS, MAX_WIDTH, check_limits};

/// What kiln asks of a tower's config: its family, its encoder's sizes, the work beyond the
/// encoder, and the checks only it needs. [`VisionConfig`]'s validation, FLOP count and memory
/// estimate are written once over these.
pub trait TowerConfig {
    /// The tower's family as its paper names it (`CLIP`, `SigLIP`, `DINOv2`).
    fn family(&self) -> &'static str;

    /// The encoder's sizes.
    fn shape(&self) -> TowerShape;

    /// FLOPs of one image's forward pass beyond the patch projection and the encoder layers (a
    /// pooling head, a projection), for an image of `patches` patches.
    fn head_flops(&self, patches: usize) -> f64 {
        let _ = patches;
        0.0
    }

    /// Limits only this tower has, as [`check_limits`] takes them (`setting`, value, most),
    /// checked after `num_hidden_layers` and `hidden_size`.
    fn limits(&self) -> Vec<(&'static str, usize, usize)> {
        Vec::new()
    }

    /// Refuses settings this tower cannot run, before any other check.
    fn check(&self) -> Result<(), VisionError> {
        Ok(())
    }
}

/// The sizes of a tower's encoder, as its config gives them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TowerShape {
    /// Token width.
    pub hidden: usize,
    /// MLP width.
    pub intermediate: usize,
    /// The settings the MLP width comes from (`intermediate_size`).
    pub intermediate_setting: &'static str,
    /// Encoder layers.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Patch side in pixels.
    pub patch: usize,
    /// Input side in pixels.
    pub image: usize,
    /// Input channels.
    pub channels: usize,
    /// LayerNorm epsilon.
    pub eps: f64,
    /// Tokens before the patches (a class token: 1).
    pub class_tokens: usize,
}

/// Which tower a checkpoint holds, and where its weights sit in the file.
///
/// A new tower adds its variant here, its `model_type`s to [`MODEL_TYPES`] and
/// [`VisionConfig::parse_hf_value`], and an arm to [`VisionConfig::tower`] and
/// [`VisionConfig::init`]; everything else is in the tower's own file
/// (docs/ARCHITECTURE.md, "Adding a vision tower").
#[derive(Debug, Clone, PartialEq)]
pub enum VisionConfig {
    /// CLIP (`clip`, `clip_vision_model`).
    Clip(ClipVisionConfig),
    /// SigLIP / fixed-resolution SigLIP2 (`siglip`, `siglip_vision_model`).
    Siglip(SiglipVisionConfig),
    /// DINOv2 (`dinov2`).
    Dinov2(Dinov2Config),
}

/// The `model_type`s kiln reads.
pub const MODEL_TYPES: [&str; 5] = [
    "clip",
    "clip_vision_model",
    "siglip",
    "siglip_vision_model",
    "dinov2",
];

impl VisionConfig {
    /// The tower's own config, as [`TowerConfig`].
    pub fn tower(&self) -> &dyn TowerConfig {
        match self {
            VisionConfig::Clip(c) => c,
            VisionConfig::Siglip(c) => c,
            VisionConfig::Dinov2(c) => c,
        }
    }

    /// A randomly initialised tower of this config on `device`, in f32.
    pub fn init<B: Backend>(&self, device: &B::Device) -> VisionModel<B> {
        match self {
            VisionConfig::Clip(c) => VisionModel::new(c.init(device)),
            VisionConfig::Siglip(c) => VisionModel::new(c.init(device)),
            VisionConfig::Dinov2(c) => VisionModel::new(c.init(device)),
        }
    }

    /// Reads a model directory's `config.json` (or the file itself).
    pub fn from_hf_config(path: impl AsRef<Path>) -> Result<Self, VisionError> {
        let (file, json) = read_config(path.as_ref())?;
        Self::from_hf_value(json).map_err(|e| match e {
            VisionError::Config(e) => VisionError::Config(format!("{}: {e}", file.display())),
            other => other,
        })
    }

    /// Parses the text of a `config.json`: a full model (`clip`, `siglip`: the vision tower of
    /// `vision_config`; the text tower is ignored) or a vision-only one.
    pub fn from_hf_json(json: &str) -> Result<Self, VisionError> {
        let value: Value = serde_json::from_str(json)
            .map_err(|e| VisionError::Config(format!("not JSON: {e}")))?;
        Self::from_hf_value(value)
    }

    /// [`Self::from_hf_json`] on the parsed JSON.
    pub fn from_hf_value(value: Value) -> Result<Self, VisionError> {
        let config = Self::parse_hf_value(value)?;
        let tower = config.tower();
        tower.check()?;
        let shape = tower.shape();
        let TowerShape {
            hidden,
            heads,
            patch,
            eps,
            image,
            ..
        } = shape;
        // A norm divides by sqrt(variance + eps): eps ≤ 0 divides by zero on a constant row.
        if !(eps > 0.0 && eps.is_finite()) {
            return Err(VisionError::Config(format!(
                "layer_norm_eps = {eps}: must be a finite number > 0"
            )));
        }
        let mut limits = vec![
            ("num_hidden_layers", shape.layers, MAX_LAYERS),
            ("hidden_size", hidden, MAX_WIDTH),
        ];
        limits.extend(tower.limits());
        limits.extend([
            (shape.intermediate_setting, shape.intermediate, MAX_WIDTH),
            ("num_attention_heads", heads, MAX_WIDTH),
            ("image_size", image, 1 << 16),
            ("num_channels", shape.channels, 64),
        ]);
        check_limits(&limits).map_err(|e| VisionError::Config(e.to_string()))?;
        if patch > image {
            return Err(VisionError::Config(format!(
                "patch_size = {patch} is larger than image_size = {image}: no patch fits"
            )));
        }
        if heads == 0 || hidden % heads != 0 {
            return Err(VisionError::Config(format!(
                "num_attention_heads = {heads}: hidden_size = {hidden} is not split evenly into \
                 that many heads"
            )));
        }
        if patch == 0 {
            return Err(VisionError::Config(
                "patch_size = 0: must be at least 1".into(),
            ));
        }
        Ok(config)
    }

    fn parse_hf_value(value: Value) -> Result<Self, VisionError> {
        let model_type = value
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| VisionError::Config("no `model_type`".into()))?;
        let vision = || value.get("vision_config").cloned().unwrap_or_default();
        Ok(match model_type {
            "clip" => {
                let mut config: ClipVisionConfig = parse(vision())?;
                // The projection belongs to the full model; its vision_config keeps a default.
                config.projection_dim = match value.get("projection_dim") {
                    Some(dim) => parse(dim.clone())?,
                    None => ClipVisionConfig::default().projection_dim,
                };
                VisionConfig::Clip(config)
            }
            "clip_vision_model" => VisionConfig::Clip(parse(value)?),
            "siglip" => VisionConfig::Siglip(parse(vision())?),
            "siglip_vision_model" => VisionConfig::Siglip(parse(value)?),
            "dinov2" => VisionConfig::Dinov2(parse(value)?),
            "siglip2" => {
                return Err(VisionError::Config(
                    "model_type `siglip2` is a NaFlex checkpoint (variable resolution), which \
                     kiln does not support; the fixed-resolution SigLIP2 checkpoints \
                     (model_type `siglip`) are"
                        .into(),
                ));
            }
            other => {
                return Err(VisionError::Config(format!(
                    "model_type `{other}` is not supported; kiln reads {}",
                    MODEL_TYPES.join(", ")
                )));
            }
        })
    }

    /// FLOPs (two per multiply-add) of one image's forward pass at `height × width` pixels: the
    /// patch projection, every linear layer, the two attention products and the tower's head
    /// ([`TowerConfig::head_flops`]). Norms, activations and softmax, a few percent more, are
    /// left out. Benchmarks hold throughput against this for the roofline.
    ///
    /// ```
    /// use kiln_vision::{ClipVisionConfig, VisionConfig};
    /// let clip = VisionConfig::Clip(ClipVisionConfig::vit_base_patch32());
    /// assert!((clip.forward_flops(224, 224) / 1e9 - 8.8).abs() < 0.1);
    /// ```
    pub fn forward_flops(&self, height: usize, width: usize) -> f64 {
        let tower = self.tower();
        let TowerShape {
            hidden,
            intermediate,
            layers,
            patch,
            class_tokens,
            ..
        } = tower.shape();
        let (h, i) = (hidden as f64, intermediate as f64);
        let patches = (height / patch) * (width / patch);
        let projection = 2.0 * patches as f64 * (3 * patch * patch) as f64 * h;
        let tokens = (patches + class_tokens) as f64;
        let layer =
            2.0 * tokens * 4.0 * h * h + 2.0 * tokens * 2.0 * h * i + 4.0 * tokens * tokens * h;
        projection + layers as f64 * layer + tower.head_flops(patches)
    }

    /// Bytes of working memory one image's forward pass needs at `height × width` pixels with
    /// `bytes_per_value`-byte activations: the residual stream, a layer's normed input, query,
    /// key, value and MLP hidden activations, and its attention scores and probabilities, doubled
    /// for the allocator's slack. An estimate for choosing batch sizes, not a measurement.
    ///
    /// ```
    /// use kiln_vision::{ClipVisionConfig, VisionConfig};
    /// let clip = VisionConfig::Clip(ClipVisionConfig::vit_base_patch32());
    /// // 50 tokens: about 3.2 MB per image in f32.
    /// assert!((clip.activation_bytes(224, 224, 4) as f64 / 1e6 - 3.2).abs() < 0.1);
    /// ```
    pub fn activation_bytes(&self, height: usize, width: usize, bytes_per_value: usize) -> u64 {
        let shape = self.tower().shape();
        // One token more than the patches, whether or not the tower has a class token.
        let tokens = (height / shape.patch) * (width / shape.patch) + 1;
        let values =
            tokens * (5 * shape.hidden + shape.intermediate) + 2 * shape.heads * tokens * tokens;
        (2 * values * bytes_per_value) as u64
    }
}

/// `value` as a tower's config, a bad setting named.
pub(crate) fn parse<T: DeserializeOwned>(value: Value) -> Result<T, VisionError> {
    kiln_core::config_from_json(value).map_err(|e| VisionError::Config(e.to_string()))
}
