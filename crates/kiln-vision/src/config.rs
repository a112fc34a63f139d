//! Vision tower configurations as Hugging Face `config.json` describes them, with named
//! constructors for the released sizes. Field names and defaults follow transformers'
//! `CLIPVisionConfig`, `SiglipVisionConfig` and `Dinov2Config`, so a missing key means what it
//! means there.
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

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::VisionError;
use kiln_core::read_config;
use kiln_core::{MAX_LAYERS, MAX_WIDTH, check_limits};
use kiln_transformer::Activation;

/// CLIP's vision tower and its projection (transformers `CLIPVisionConfig`; the projection width
/// of a full `CLIPModel` is its top-level `projection_dim`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ClipVisionConfig {
    /// Token width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Input channels.
    pub num_channels: usize,
    /// Input side in pixels (the position table covers `(image_size / patch_size)²` patches).
    pub image_size: usize,
    /// Patch side in pixels.
    pub patch_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// MLP activation.
    pub hidden_act: Activation,
    /// Width of `image_embeds`.
    pub projection_dim: usize,
}

impl Default for ClipVisionConfig {
    /// transformers' defaults: ViT-B/32.
    fn default() -> Self {
        ClipVisionConfig {
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            num_channels: 3,
            image_size: 224,
            patch_size: 32,
            layer_norm_eps: 1e-5,
            hidden_act: Activation::QuickGelu,
            projection_dim: 512,
        }
    }
}

impl ClipVisionConfig {
    /// openai/clip-vit-base-patch32.
    pub fn vit_base_patch32() -> Self {
        Self::default()
    }

    /// openai/clip-vit-large-patch14.
    pub fn vit_large_patch14() -> Self {
        ClipVisionConfig {
            hidden_size: 1024,
            intermediate_size: 4096,
            num_hidden_layers: 24,
            num_attention_heads: 16,
            patch_size: 14,
            projection_dim: 768,
            ..Self::default()
        }
    }
}

/// SigLIP's vision tower (transformers `SiglipVisionConfig`), which also describes the
/// fixed-resolution SigLIP2 checkpoints.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct SiglipVisionConfig {
    /// Token width.
    pub hidden_size: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Input channels.
    pub num_channels: usize,
    /// Input side in pixels.
    pub image_size: usize,
    /// Patch side in pixels.
    pub patch_size: usize,
    /// LayerNorm epsilon (also the pooling head's).
    pub layer_norm_eps: f64,
    /// MLP activation.
    pub hidden_act: Activation,
    /// Whether the multi-head attention pooling head exists (it gives `pooler_output`).
    pub vision_use_head: bool,
}

impl Default for SiglipVisionConfig {
    /// transformers' defaults: B/16 at 224 px.
    fn default() -> Self {
        SiglipVisionConfig {
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            num_channels: 3,
            image_size: 224,
            patch_size: 16,
            layer_norm_eps: 1e-6,
            hidden_act: Activation::GeluTanh,
            vision_use_head: true,
        }
    }
}

impl SiglipVisionConfig {
    /// google/siglip2-base-patch16-{224,256,384,512} (and siglip-base-patch16-*).
    pub fn base_patch16(image_size: usize) -> Self {
        SiglipVisionConfig {
            image_size,
            ..Self::default()
        }
    }

    /// google/siglip-so400m-patch14-384 and siglip2-so400m-patch14-384.
    pub fn so400m_patch14_384() -> Self {
        SiglipVisionConfig {
            patch_size: 14,
            image_size: 384,
            ..Self::so400m_patch16(384)
        }
    }

    /// google/siglip2-so400m-patch16-{256,384,512}.
    pub fn so400m_patch16(image_size: usize) -> Self {
        SiglipVisionConfig {
            hidden_size: 1152,
            intermediate_size: 4304,
            num_hidden_layers: 27,
            num_attention_heads: 16,
            image_size,
            ..Self::default()
        }
    }
}

/// DINOv2 (transformers `Dinov2Config`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct Dinov2Config {
    /// Token width.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// MLP width over token width.
    pub mlp_ratio: usize,
    /// Input channels.
    pub num_channels: usize,
    /// Side in pixels the position table was trained for (other sizes interpolate it).
    pub image_size: usize,
    /// Patch side in pixels.
    pub patch_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Initial LayerScale (the checkpoint holds the trained values).
    pub layerscale_value: f64,
    /// MLP activation.
    pub hidden_act: Activation,
    /// Whether query, key and value have biases.
    pub qkv_bias: bool,
    /// SwiGLU MLPs (DINOv2 giant), which kiln does not implement.
    pub use_swiglu_ffn: bool,
    /// Std of the CLS token and position table at initialisation (a model trained from
    /// scratch; the linear layers take burn's defaults).
    pub initializer_range: f64,
}

impl Default for Dinov2Config {
    /// transformers' defaults: ViT-B/14 shapes.
    fn default() -> Self {
        Dinov2Config {
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            mlp_ratio: 4,
            num_channels: 3,
            image_size: 224,
            patch_size: 14,
            layer_norm_eps: 1e-6,
            layerscale_value: 1.0,
            hidden_act: Activation::Gelu,
            qkv_bias: true,
            use_swiglu_ffn: false,
            initializer_range: 0.02,
        }
    }
}

impl Dinov2Config {
    /// facebook/dinov2-small.
    pub fn small() -> Self {
        Dinov2Config {
            hidden_size: 384,
            num_attention_heads: 6,
            image_size: 518,
            ..Self::default()
        }
    }

    /// facebook/dinov2-base.
    pub fn base() -> Self {
        Dinov2Config {
            image_size: 518,
            ..Self::default()
        }
    }

    /// facebook/dinov2-large.
    pub fn large() -> Self {
        Dinov2Config {
            hidden_size: 1024,
            num_hidden_layers: 24,
            num_attention_heads: 16,
            image_size: 518,
            ..Self::default()
        }
    }

    /// MLP width.
    pub fn intermediate_size(&self) -> usize {
        // Saturating: a config is checked against the stated limits after this is read.
        self.hidden_size.saturating_mul(self.mlp_ratio)
    }
}

/// Which tower a checkpoint holds, and where its weights sit in the file.
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
        let (hidden, heads, patch, eps) = match &config {
            VisionConfig::Clip(c) => (
                c.hidden_size,
                c.num_attention_heads,
                c.patch_size,
                c.layer_norm_eps,
            ),
            VisionConfig::Siglip(c) => (
                c.hidden_size,
                c.num_attention_heads,
                c.patch_size,
                c.layer_norm_eps,
            ),
            VisionConfig::Dinov2(c) => (
                c.hidden_size,
                c.num_attention_heads,
                c.patch_size,
                c.layer_norm_eps,
            ),
        };
        // A norm divides by sqrt(variance + eps): eps ≤ 0 divides by zero on a constant row.
        if !(eps > 0.0 && eps.is_finite()) {
            return Err(VisionError::Config(format!(
                "layer_norm_eps = {eps}: must be a finite number > 0"
            )));
        }
        let (image, channels) = match &config {
            VisionConfig::Clip(c) => (c.image_size, c.num_channels),
            VisionConfig::Siglip(c) => (c.image_size, c.num_channels),
            VisionConfig::Dinov2(c) => (c.image_size, c.num_channels),
        };
        let (ratio, intermediate) = match &config {
            VisionConfig::Dinov2(c) => (c.mlp_ratio, "hidden_size × mlp_ratio"),
            _ => (1, "intermediate_size"),
        };
        let shape = config.shape();
        check_limits(&[
            ("num_hidden_layers", shape.layers, MAX_LAYERS),
            ("hidden_size", hidden, MAX_WIDTH),
            ("mlp_ratio", ratio, 64),
            (intermediate, shape.intermediate, MAX_WIDTH),
            ("num_attention_heads", heads, MAX_WIDTH),
            ("image_size", image, 1 << 16),
            ("num_channels", channels, 64),
        ])
        .map_err(|e| VisionError::Config(e.to_string()))?;
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
            "dinov2" => {
                let config: Dinov2Config = parse(value)?;
                if config.use_swiglu_ffn {
                    return Err(VisionError::Config(
                        "DINOv2 with SwiGLU MLPs (giant) is not supported: kiln implements \
                         small, base and large"
                            .into(),
                    ));
                }
                VisionConfig::Dinov2(config)
            }
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
}

impl VisionConfig {
    /// FLOPs (two per multiply-add) of one image's forward pass at `height × width` pixels: the
    /// patch projection, every linear layer, the two attention products and the pooling head.
    /// Norms, activations and softmax, a few percent more, are left out. Benchmarks hold
    /// throughput against this for the roofline.
    ///
    /// ```
    /// use kiln_vision::{ClipVisionConfig, VisionConfig};
    /// let clip = VisionConfig::Clip(ClipVisionConfig::vit_base_patch32());
    /// assert!((clip.forward_flops(224, 224) / 1e9 - 8.8).abs() < 0.1);
    /// ```
    pub fn forward_flops(&self, height: usize, width: usize) -> f64 {
        let Shape {
            hidden,
            intermediate,
            layers,
            patch,
            ..
        } = self.shape();
        let (h, i) = (hidden as f64, intermediate as f64);
        let patches = ((height / patch) * (width / patch)) as f64;
        let projection = 2.0 * patches * (3 * patch * patch) as f64 * h;
        let mlp = |tokens: f64| 2.0 * tokens * 2.0 * h * i;
        let layer =
            |tokens: f64| 2.0 * tokens * 4.0 * h * h + mlp(tokens) + 4.0 * tokens * tokens * h;
        match self {
            VisionConfig::Clip(c) => {
                projection
                    + layers as f64 * layer(patches + 1.0)
                    + 2.0 * h * c.projection_dim as f64
            }
            VisionConfig::Siglip(c) => {
                // The head: one query over every token, its out projection and MLP.
                let head = 2.0 * h * h * (2.0 * patches + 2.0) + 4.0 * patches * h + mlp(1.0);
                projection
                    + layers as f64 * layer(patches)
                    + if c.vision_use_head { head } else { 0.0 }
            }
            VisionConfig::Dinov2(_) => projection + layers as f64 * layer(patches + 1.0),
        }
    }
}

impl VisionConfig {
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
        let shape = self.shape();
        let tokens = (height / shape.patch) * (width / shape.patch) + 1;
        let values =
            tokens * (5 * shape.hidden + shape.intermediate) + 2 * shape.heads * tokens * tokens;
        (2 * values * bytes_per_value) as u64
    }

    /// The encoder's sizes.
    fn shape(&self) -> Shape {
        match self {
            VisionConfig::Clip(c) => Shape {
                hidden: c.hidden_size,
                intermediate: c.intermediate_size,
                layers: c.num_hidden_layers,
                heads: c.num_attention_heads,
                patch: c.patch_size,
            },
            VisionConfig::Siglip(c) => Shape {
                hidden: c.hidden_size,
                intermediate: c.intermediate_size,
                layers: c.num_hidden_layers,
                heads: c.num_attention_heads,
                patch: c.patch_size,
            },
            VisionConfig::Dinov2(c) => Shape {
                hidden: c.hidden_size,
                intermediate: c.intermediate_size(),
                layers: c.num_hidden_layers,
                heads: c.num_attention_heads,
                patch: c.patch_size,
            },
        }
    }
}

/// The sizes every encoder has.
struct Shape {
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    patch: usize,
}

fn parse<T: DeserializeOwned>(value: Value) -> Result<T, VisionError> {
    kiln_core::config_from_json(value).map_err(|e| VisionError::Config(e.to_string()))
}
