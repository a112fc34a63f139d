//! SigLIP's vision tower (transformers `SiglipVisionModel`, the image half of `SiglipModel`), which
//! also runs the fixed-resolution SigLIP2 checkpoints: a conv patch embedding with bias, learned
//! position embeddings, no class token, a pre-LN encoder with tanh-GELU, `post_layernorm`, and the
//! multi-head attention pooling head (a learned probe attends over the tokens). Field names mirror
//! the checkpoint's keys; the head keeps PyTorch's fused `in_proj_weight`.

use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{
    Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;

use crate::TowerSettings;
use crate::VisionError;
use crate::config::{TowerConfig, TowerShape};
use crate::encoder::{Encoder, EncoderShape, Mlp};
use crate::patches::{check_pixels, learned_positions, patch_tokens};
use crate::tower::{Tower, in_compute_dtype};
use kiln_transformer::projection::Then;
use kiln_transformer::{Activation, PreparedWeights};
use kiln_transformer::{Draw, Pass};
use serde::Deserialize;

/// The family's name as its paper gives it.
const FAMILY: &str = "SigLIP";

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

/// Patch and position embeddings (`vision_model.embeddings`).
#[derive(Module, Debug)]
pub struct SiglipEmbeddings<B: Backend> {
    patch_embedding: Conv2d<B>,
    position_embedding: Embedding<B>,
}

impl<B: Backend> SiglipEmbeddings<B> {
    fn forward(&self, pixels: Tensor<B, 4>, pass: &Pass) -> Tensor<B, 3> {
        let (patches, (rows, cols)) = patch_tokens(&self.patch_embedding, pixels, pass);
        let positions = learned_positions(&self.position_embedding, rows * cols, &patches.device());
        pass.embeddings(patches + positions)
    }
}

/// `torch.nn.MultiheadAttention` as the pooling head stores it: q, k and v projections fused in
/// `in_proj_weight` `[3H, H]` (rows q, k, v) and `in_proj_bias`.
#[derive(Module, Debug)]
pub struct FusedAttention<B: Backend> {
    in_proj_weight: Param<Tensor<B, 2>>,
    in_proj_bias: Param<Tensor<B, 1>>,
    out_proj: Linear<B>,
    #[module(skip)]
    heads: usize,
}

impl<B: Backend> FusedAttention<B> {
    /// `x · W_partᵀ + b_part` with the part (0 = q, 1 = k, 2 = v) of the fused projection. (Not
    /// flattened into one matrix as the encoder's projections are: with the sliced weight that
    /// gave wrong values on burn 0.21's wgpu backend.)
    fn project(&self, x: Tensor<B, 3>, part: usize) -> Tensor<B, 3> {
        let [_, hidden] = self.in_proj_weight.dims();
        let rows = part * hidden..(part + 1) * hidden;
        let weight = self.in_proj_weight.val().slice([rows.clone()]).transpose();
        linear(x, weight, Some(self.in_proj_bias.val().slice([rows])))
    }

    /// The learned `probe` (`[1, 1, hidden]`, shared by the batch) attending over `tokens`
    /// (no dropout: the Monte-Carlo sites are the encoder's).
    fn forward(&self, probe: Tensor<B, 3>, tokens: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let [batch, _, hidden] = tokens.dims();
        // Projected once, then shared: the same query for every image. (Projecting the probe
        // after broadcasting it gave wrong values on burn 0.21's wgpu backend.)
        let query = self.project(probe, 0).expand([batch, 1, hidden]);
        let attended = pass.deterministic().attention(
            query,
            self.project(tokens.clone(), 1),
            self.project(tokens, 2),
            self.heads,
        );
        self.out_proj.forward(attended)
    }
}

/// The pooling head (`vision_model.head`): `h = attn(probe, tokens)`, `h + mlp(layernorm(h))`.
#[derive(Module, Debug)]
pub struct PoolingHead<B: Backend> {
    probe: Param<Tensor<B, 3>>,
    attention: FusedAttention<B>,
    layernorm: LayerNorm<B>,
    mlp: Mlp<B>,
}

impl<B: Backend> PoolingHead<B> {
    fn forward(&self, tokens: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 2> {
        let [batch, _, hidden] = tokens.dims();
        let h = self.attention.forward(self.probe.val(), tokens, pass);
        let normed = pass.norm(&self.layernorm, h.clone());
        let then = Then::AddTo {
            residual: h,
            scale: None,
        };
        let h = self.mlp.forward(normed, then, &pass.deterministic());
        h.reshape([batch, hidden])
    }
}

/// The transformer (`vision_model`).
#[derive(Module, Debug)]
pub struct SiglipVisionTransformer<B: Backend> {
    embeddings: SiglipEmbeddings<B>,
    encoder: Encoder<B>,
    post_layernorm: LayerNorm<B>,
    head: Option<PoolingHead<B>>,
}

/// What a forward pass gives, in the policy's output dtype.
#[derive(Debug, Clone)]
pub struct SiglipOutput<B: Backend> {
    /// The pooling head's output, `[batch, hidden]` (`None` without a head).
    pub pooler_output: Option<Tensor<B, 2>>,
    /// `post_layernorm` of every token, `[batch, patches, hidden]`.
    pub last_hidden_state: Tensor<B, 3>,
    /// Each layer's input and the last output, when asked for.
    pub hidden_states: Vec<Tensor<B, 3>>,
}

/// SigLIP's vision tower.
#[derive(Module, Debug)]
pub struct SiglipVisionModel<B: Backend> {
    vision_model: SiglipVisionTransformer<B>,
    #[module(skip)]
    settings: TowerSettings,
    #[module(skip)]
    prepared: PreparedWeights,
}

impl<B: Backend> Tower<B> for SiglipVisionModel<B> {
    type Output = SiglipOutput<B>;

    fn family(&self) -> &'static str {
        FAMILY
    }

    fn check_pixels(&self, dims: [usize; 4]) -> Result<(), VisionError> {
        let embeddings = &self.vision_model.embeddings;
        let positions = embeddings.position_embedding.weight.val().dims()[0];
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

    /// `SiglipVisionModel` files of transformers 5 have no `vision_model.` prefix; those of
    /// transformers 4 and `SiglipModel` files do.
    fn key_remapping() -> &'static [(&'static str, &'static str)] {
        &[(
            r"^(embeddings|encoder|post_layernorm|head)\.",
            "vision_model.$1.",
        )]
    }

    fn run(&self, pixels: Tensor<B, 4>, keep: bool, draw: Option<&Draw>) -> SiglipOutput<B> {
        let model = in_compute_dtype(self);
        let pass = Pass::new(&model.settings, &model.prepared, draw);
        let tower = &model.vision_model;
        let x = tower.embeddings.forward(pass.input(pixels), &pass);
        let (x, hidden_states) = tower.encoder.forward(x, keep, &pass);
        let last_hidden_state = pass.norm(&tower.post_layernorm, x);
        SiglipOutput {
            pooler_output: tower
                .head
                .as_ref()
                .map(|head| pass.output(head.forward(last_hidden_state.clone(), &pass))),
            last_hidden_state: pass.output(last_hidden_state),
            hidden_states,
        }
    }

    /// The pooling head's output, or without a head the mean of the last hidden state's tokens.
    fn embeddings_of(output: SiglipOutput<B>) -> Tensor<B, 2> {
        match output.pooler_output {
            Some(pooled) => pooled,
            None => output.last_hidden_state.mean_dim(1).squeeze_dim(1),
        }
    }

    fn embedding_width(&self) -> usize {
        // `hidden_size`, pooled or averaged.
        self.vision_model
            .post_layernorm
            .gamma
            .lazy_shape()
            .dims::<1>()[0]
    }
}

impl SiglipVisionConfig {
    /// A randomly initialised tower of this shape (load a checkpoint into it with
    /// [`crate::load_hf_weights`]).
    pub fn init<B: Backend>(&self, device: &B::Device) -> SiglipVisionModel<B> {
        let hidden = self.hidden_size;
        let patches = (self.image_size / self.patch_size).pow(2);
        let norm = || {
            LayerNormConfig::new(hidden)
                .with_epsilon(self.layer_norm_eps)
                .init(device)
        };
        let head = self.vision_use_head.then(|| PoolingHead {
            probe: Initializer::Zeros.init([1, 1, hidden], device),
            attention: FusedAttention {
                in_proj_weight: Initializer::Zeros.init([3 * hidden, hidden], device),
                in_proj_bias: Initializer::Zeros.init([3 * hidden], device),
                out_proj: LinearConfig::new(hidden, hidden).init(device),
                heads: self.num_attention_heads,
            },
            layernorm: norm(),
            mlp: Mlp::init(hidden, self.intermediate_size, self.hidden_act, device),
        });
        SiglipVisionModel {
            vision_model: SiglipVisionTransformer {
                embeddings: SiglipEmbeddings {
                    patch_embedding: Conv2dConfig::new(
                        [self.num_channels, hidden],
                        [self.patch_size, self.patch_size],
                    )
                    .with_stride([self.patch_size, self.patch_size])
                    .init(device),
                    position_embedding: EmbeddingConfig::new(patches, hidden).init(device),
                },
                encoder: Encoder::init(
                    EncoderShape {
                        hidden,
                        intermediate: self.intermediate_size,
                        layers: self.num_hidden_layers,
                        heads: self.num_attention_heads,
                        eps: self.layer_norm_eps,
                        activation: self.hidden_act,
                    },
                    device,
                ),
                post_layernorm: norm(),
                head,
            },
            settings: TowerSettings::default(),
            prepared: PreparedWeights::default(),
        }
    }
}

impl TowerConfig for SiglipVisionConfig {
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
            class_tokens: 0,
        }
    }

    /// The pooling head: one query over every token, its out projection and MLP.
    fn head_flops(&self, patches: usize) -> f64 {
        if !self.vision_use_head {
            return 0.0;
        }
        let (h, i, p) = (
            self.hidden_size as f64,
            self.intermediate_size as f64,
            patches as f64,
        );
        2.0 * h * h * (2.0 * p + 2.0) + 4.0 * p * h + 4.0 * h * i
    }
}
