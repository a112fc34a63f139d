//! CLIP's vision tower with its projection (transformers `CLIPVisionModelWithProjection`, the
//! image half of `CLIPModel`): a conv patch embedding without bias, a class token, learned
//! position embeddings, `pre_layrnorm`, a pre-LN encoder with quick-GELU, `post_layernorm` on the
//! class token, `visual_projection`. Field names mirror the checkpoint's keys.

use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{
    Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::TowerSettings;
use crate::VisionError;
use crate::config::{TowerConfig, TowerShape};
use crate::encoder::{Encoder, EncoderShape};
use crate::patches::{check_pixels, learned_positions, patch_tokens};
use crate::tower::{Tower, in_compute_dtype};
use kiln_transformer::{Activation, PreparedWeights};
use kiln_transformer::{Draw, Pass};
use serde::Deserialize;

/// The family's name as its paper gives it.
const FAMILY: &str = "CLIP";

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

/// Patch, class and position embeddings (`vision_model.embeddings`).
#[derive(Module, Debug)]
pub struct ClipEmbeddings<B: Backend> {
    class_embedding: Param<Tensor<B, 1>>,
    patch_embedding: Conv2d<B>,
    position_embedding: Embedding<B>,
}

impl<B: Backend> ClipEmbeddings<B> {
    /// `[batch, 1 + patches, hidden]` of `pixels` `[batch, 3, H, W]` (H and W the configured
    /// image size: CLIP's position table is not interpolated).
    fn forward(&self, pixels: Tensor<B, 4>, pass: &Pass) -> Tensor<B, 3> {
        let (patches, (rows, cols)) = patch_tokens(&self.patch_embedding, pixels, pass);
        let [batch, _, hidden] = patches.dims();
        let class = self
            .class_embedding
            .val()
            .reshape([1, 1, hidden])
            .expand([batch, 1, hidden]);
        let positions =
            learned_positions(&self.position_embedding, 1 + rows * cols, &patches.device());
        pass.embeddings(Tensor::cat(vec![class, patches], 1) + positions)
    }
}

/// The transformer (`vision_model`).
#[derive(Module, Debug)]
pub struct ClipVisionTransformer<B: Backend> {
    embeddings: ClipEmbeddings<B>,
    pre_layrnorm: LayerNorm<B>,
    encoder: Encoder<B>,
    post_layernorm: LayerNorm<B>,
}

/// What a forward pass gives, in the policy's output dtype.
#[derive(Debug, Clone)]
pub struct ClipOutput<B: Backend> {
    /// `visual_projection(pooler_output)`, `[batch, projection_dim]` (not L2-normalised).
    pub image_embeds: Tensor<B, 2>,
    /// `post_layernorm` of the class token, `[batch, hidden]`.
    pub pooler_output: Tensor<B, 2>,
    /// The last layer's output, `[batch, 1 + patches, hidden]` (no final norm).
    pub last_hidden_state: Tensor<B, 3>,
    /// Each layer's input and the last output, when asked for.
    pub hidden_states: Vec<Tensor<B, 3>>,
}

/// CLIP's vision tower and projection.
#[derive(Module, Debug)]
pub struct ClipVisionModel<B: Backend> {
    vision_model: ClipVisionTransformer<B>,
    visual_projection: Linear<B>,
    #[module(skip)]
    settings: TowerSettings,
    #[module(skip)]
    prepared: PreparedWeights,
}

impl<B: Backend> Tower<B> for ClipVisionModel<B> {
    type Output = ClipOutput<B>;

    fn family(&self) -> &'static str {
        FAMILY
    }

    fn check_pixels(&self, dims: [usize; 4]) -> Result<(), VisionError> {
        let embeddings = &self.vision_model.embeddings;
        // The table's first row is the class token's.
        let positions = embeddings.position_embedding.weight.val().dims()[0] - 1;
        check_pixels(&embeddings.patch_embedding, Some(positions), dims)
    }

    fn settings(&self) -> &TowerSettings {
        &self.settings
    }

    fn settings_mut(&mut self) -> &mut TowerSettings {
        &mut self.settings
    }

    fn weights_changed(&mut self) {
        self.prepared = Default::default();
    }

    fn run(&self, pixels: Tensor<B, 4>, keep: bool, draw: Option<&Draw>) -> ClipOutput<B> {
        let model = in_compute_dtype(self);
        let pass = Pass::new(&model.settings, &model.prepared, draw);
        let tower = &model.vision_model;
        let x = tower.embeddings.forward(pass.input(pixels), &pass);
        let x = pass.norm(&tower.pre_layrnorm, x);
        let (last_hidden_state, hidden_states) = tower.encoder.forward(x, keep, &pass);
        let [batch, _, hidden] = last_hidden_state.dims();
        let class = last_hidden_state
            .clone()
            .slice([0..batch, 0..1])
            .reshape([batch, hidden]);
        let pooler_output = pass.norm(&tower.post_layernorm, class);
        ClipOutput {
            image_embeds: pass.output(model.visual_projection.forward(pooler_output.clone())),
            pooler_output: pass.output(pooler_output),
            last_hidden_state: pass.output(last_hidden_state),
            hidden_states,
        }
    }

    fn embeddings_of(output: ClipOutput<B>) -> Tensor<B, 2> {
        output.image_embeds
    }

    fn embedding_width(&self) -> usize {
        // `projection_dim`: the projection's weight is `[hidden, projection]`.
        self.visual_projection.weight.lazy_shape().dims::<2>()[1]
    }
}

impl ClipVisionConfig {
    /// A randomly initialised tower of this shape (load a checkpoint into it with
    /// [`crate::load_hf_weights`]).
    pub fn init<B: Backend>(&self, device: &B::Device) -> ClipVisionModel<B> {
        let hidden = self.hidden_size;
        let patches = (self.image_size / self.patch_size).pow(2);
        let norm = || {
            LayerNormConfig::new(hidden)
                .with_epsilon(self.layer_norm_eps)
                .init(device)
        };
        let embeddings = ClipEmbeddings {
            class_embedding: Initializer::Zeros.init([hidden], device),
            patch_embedding: Conv2dConfig::new(
                [self.num_channels, hidden],
                [self.patch_size, self.patch_size],
            )
            .with_stride([self.patch_size, self.patch_size])
            .with_bias(false)
            .init(device),
            position_embedding: EmbeddingConfig::new(1 + patches, hidden).init(device),
        };
        let encoder = Encoder::init(
            EncoderShape {
                hidden,
                intermediate: self.intermediate_size,
                layers: self.num_hidden_layers,
                heads: self.num_attention_heads,
                eps: self.layer_norm_eps,
                activation: self.hidden_act,
            },
            device,
        );
        ClipVisionModel {
            vision_model: ClipVisionTransformer {
                embeddings,
                pre_layrnorm: norm(),
                encoder,
                post_layernorm: norm(),
            },
            visual_projection: LinearConfig::new(hidden, self.projection_dim)
                .with_bias(false)
                .init(device),
            settings: TowerSettings::default(),
            prepared: PreparedWeights::default(),
        }
    }
}

impl TowerConfig for ClipVisionConfig {
    fn family(&self) -> &'static str {
        FAMILY
    }

    fn shape(&self) -> TowerShape {
        TowerShape {
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            intermediate_setting: "intermediate_size",
            layers: self.num_hidden_layers,
            heads: self.num_attention_heads,
            patch: self.patch_size,
            image: self.image_size,
            channels: self.num_channels,
            eps: self.layer_norm_eps,
            class_tokens: 1,
        }
    }

    /// `visual_projection` of the class token.
    fn head_flops(&self, _patches: usize) -> f64 {
        2.0 * self.hidden_size as f64 * self.projection_dim as f64
    }
}
