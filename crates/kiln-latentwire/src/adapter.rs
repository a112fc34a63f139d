//! The adapter that turns the shared latents into one language model's soft prompt: LatentWire's
//! `Adapter` (`latentwire/models.py` at 220ce571) with train.py's settings (`hidden_mult` 2,
//! no colouriser, no dropout).
//!
//! `z` `[batch, M, d_z]` → (with metadata: `z + position_emb + tanh(length_proj(len / norm))`)
//! → `x = proj_out(gelu(mid(gelu(proj_in(LN(z)))))) + skip(LN(z))` → FiLM from the latents
//! before the norm, `x · σ(film_scale(z)) + film_shift(z)` → `out_norm(x) · scale`:
//! `[batch, M, d_model]`.

use std::path::Path;

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu, sigmoid, tanh};
use burn::tensor::backend::Backend;
use kiln_core::CheckpointError;

/// An [`Adapter`]'s sizes: LatentWire's `Adapter(d_z, d_model, latent_length,
/// enable_metadata, length_norm, hidden_mult)`.
#[derive(Config, Debug)]
pub struct AdapterConfig {
    /// The latents' width (`d_z`).
    pub latent_width: usize,
    /// The language model's embedding width (`d_model`).
    pub model_width: usize,
    /// `M`, the latents per text (`latent_length`).
    pub latents: usize,
    /// Add a learned embedding per latent slot and, where given, one of the answer's length
    /// (`enable_metadata`: on in LatentWire's train.py).
    #[config(default = true)]
    pub metadata: bool,
    /// The answer length the length embedding reads as 1 (`length_norm`: train.py passes
    /// `--max_answer_tokens`, 32).
    #[config(default = 32.0)]
    pub length_norm: f64,
    /// The MLP's hidden width in multiples of `latent_width` (`hidden_mult`); values below 2 are
    /// taken as 2 (LatentWire's `hidden_mult ≤ 1` variant, a single projection without the MLP
    /// and skip, is not built: train.py never uses it).
    #[config(default = 2)]
    pub hidden_mult: usize,
}

/// One language model's adapter; fields named as LatentWire's state dict.
#[derive(Module, Debug)]
pub struct Adapter<B: Backend> {
    /// A learned vector per latent slot (`[M, d_z]`), with metadata.
    pub position_emb: Option<Param<Tensor<B, 2>>>,
    /// The answer length's embedding, `tanh(W · len / norm + b)` (`length_proj.0`), with metadata.
    pub length_proj: Option<Linear<B>>,
    /// The latents' LayerNorm.
    pub input_norm: LayerNorm<B>,
    /// `d_z → hidden`.
    pub proj_in: Linear<B>,
    /// `hidden → hidden`.
    pub mid: Linear<B>,
    /// `hidden → d_model`.
    pub proj_out: Linear<B>,
    /// `d_z → d_model` from the normed latents, added to the MLP's output.
    pub skip: Linear<B>,
    /// FiLM's scale, `σ(film_scale(z))`.
    pub film_scale: Linear<B>,
    /// FiLM's shift.
    pub film_shift: Linear<B>,
    /// The output's LayerNorm.
    pub out_norm: LayerNorm<B>,
    /// A learned scalar multiplying the output (`[1]`).
    pub scale: Param<Tensor<B, 1>>,
    #[module(skip)]
    length_norm: f64,
}

impl AdapterConfig {
    /// A new adapter initialised as LatentWire's: Xavier-uniform weights and zero biases for the
    /// MLP, skip and FiLM; N(0, 0.02²) slot embeddings; PyTorch's default `Linear` for the length.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Adapter<B> {
        let (d_z, d_model) = (self.latent_width, self.model_width);
        let hidden = d_z * self.hidden_mult.max(2);
        let xavier = |inputs: usize, outputs: usize| {
            let mut linear = LinearConfig::new(inputs, outputs)
                .with_initializer(Initializer::XavierUniform { gain: 1.0 })
                .init(device);
            linear.bias = Some(Initializer::Zeros.init([outputs], device));
            linear
        };
        let metadata = self.metadata;
        Adapter {
            position_emb: metadata.then(|| {
                Initializer::Normal {
                    mean: 0.0,
                    std: 0.02,
                }
                .init([self.latents, d_z], device)
            }),
            length_proj: metadata.then(|| LinearConfig::new(1, d_z).init(device)),
            input_norm: LayerNormConfig::new(d_z).init(device),
            proj_in: xavier(d_z, hidden),
            mid: xavier(hidden, hidden),
            proj_out: xavier(hidden, d_model),
            skip: xavier(d_z, d_model),
            film_scale: xavier(d_z, d_model),
            film_shift: xavier(d_z, d_model),
            out_norm: LayerNormConfig::new(d_model).init(device),
            scale: Initializer::Ones.init([1], device),
            length_norm: self.length_norm.max(1.0),
        }
    }
}

impl<B: Backend> Adapter<B> {
    /// The soft prompt `[batch, M, d_model]` of latents `z` `[batch, M, d_z]`; `answer_lengths`
    /// `[batch]` (in tokens) feed the length embedding where the adapter has metadata.
    pub fn forward(&self, z: Tensor<B, 3>, answer_lengths: Option<Tensor<B, 1>>) -> Tensor<B, 3> {
        let mut z = z;
        if let Some(position) = &self.position_emb {
            z = z + position.val().unsqueeze_dim(0);
            if let (Some(lengths), Some(length_proj)) = (answer_lengths, &self.length_proj) {
                let lengths: Tensor<B, 2> = lengths.div_scalar(self.length_norm).unsqueeze_dim(1);
                let embedded: Tensor<B, 2> = tanh(length_proj.forward(lengths));
                z = z + embedded.unsqueeze_dim(1);
            }
        }
        let normed = self.input_norm.forward(z.clone());
        let hidden = gelu(self.mid.forward(gelu(self.proj_in.forward(normed.clone()))));
        let x = self.proj_out.forward(hidden) + self.skip.forward(normed);
        let x = x * sigmoid(self.film_scale.forward(z.clone())) + self.film_shift.forward(z);
        self.out_norm.forward(x) * self.scale.val().reshape([1, 1, 1])
    }

    /// The adapter with the weights of the checkpoint directory `dir` (`model.safetensors`
    /// holding LatentWire's `Adapter.state_dict()` under its names).
    pub fn with_weights(self, dir: &Path) -> Result<Self, CheckpointError> {
        kiln_core::load_checkpoint(
            self,
            dir,
            &[(r"^length_proj\.0\.(.+)$", "length_proj.$1")],
            &[],
        )
    }
}
