//! The pre-LayerNorm transformer encoder CLIP and SigLIP share (transformers' `CLIPEncoder` /
//! `SiglipEncoder`): field names mirror their checkpoint keys
//! (`encoder.layers.N.{layer_norm1, self_attn.{q,k,v,out}_proj, layer_norm2, mlp.{fc1, fc2}}`).

use burn::module::Module;
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use kiln_transformer::Activation;
use kiln_transformer::projection::{Then, project, project_dropped, self_attention};
use kiln_transformer::{Pass, Site, run_layers};

/// Shapes of an encoder.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EncoderShape {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub eps: f64,
    pub activation: Activation,
}

/// `fc2(act(fc1(x)))`, Monte-Carlo dropout on the hidden activations, then what the caller
/// asks for (the residual connection).
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    #[module(skip)]
    activation: Activation,
}

impl<B: Backend> Mlp<B> {
    pub(crate) fn init(
        hidden: usize,
        intermediate: usize,
        activation: Activation,
        device: &B::Device,
    ) -> Self {
        Mlp {
            fc1: LinearConfig::new(hidden, intermediate).init(device),
            fc2: LinearConfig::new(intermediate, hidden).init(device),
            activation,
        }
    }

    pub(crate) fn forward<const D: usize>(
        &self,
        x: Tensor<B, D>,
        then: Then<B, D>,
        pass: &Pass,
    ) -> Tensor<B, D> {
        let hidden = project(&self.fc1, x, Then::Activate(self.activation), pass);
        project(&self.fc2, pass.drop(Site::MlpHidden, hidden), then, pass)
    }
}

/// Self-attention with separate q, k, v and output projections.
#[derive(Module, Debug)]
pub struct SelfAttention<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    out_proj: Linear<B>,
    #[module(skip)]
    heads: usize,
}

impl<B: Backend> SelfAttention<B> {
    fn init(hidden: usize, heads: usize, device: &B::Device) -> Self {
        let linear = || LinearConfig::new(hidden, hidden).init(device);
        SelfAttention {
            q_proj: linear(),
            k_proj: linear(),
            v_proj: linear(),
            out_proj: linear(),
            heads,
        }
    }

    /// `residual + out_proj(attention(x))`, Monte-Carlo dropout before the sum.
    fn forward(&self, x: Tensor<B, 3>, residual: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let attended = self_attention(
            &self.q_proj,
            &self.k_proj,
            &self.v_proj,
            x,
            self.heads,
            pass,
        );
        let then = Then::AddTo {
            residual,
            scale: None,
        };
        project_dropped(&self.out_proj, attended, Site::AttentionOutput, then, pass)
    }
}

/// `x + attn(ln1 x)`, then `+ mlp(ln2 ·)`.
#[derive(Module, Debug)]
pub struct EncoderLayer<B: Backend> {
    layer_norm1: LayerNorm<B>,
    self_attn: SelfAttention<B>,
    layer_norm2: LayerNorm<B>,
    mlp: Mlp<B>,
}

impl<B: Backend> EncoderLayer<B> {
    fn forward(&self, x: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let normed = pass.norm(&self.layer_norm1, x.clone());
        let x = self.self_attn.forward(normed, x, pass);
        let normed = pass.norm(&self.layer_norm2, x.clone());
        let then = Then::AddTo {
            residual: x,
            scale: None,
        };
        self.mlp.forward(normed, then, pass)
    }
}

/// The stack of layers.
#[derive(Module, Debug)]
pub struct Encoder<B: Backend> {
    layers: Vec<EncoderLayer<B>>,
}

impl<B: Backend> Encoder<B> {
    pub(crate) fn init(shape: EncoderShape, device: &B::Device) -> Self {
        let norm = || {
            LayerNormConfig::new(shape.hidden)
                .with_epsilon(shape.eps)
                .init(device)
        };
        let layers = (0..shape.layers)
            .map(|_| EncoderLayer {
                layer_norm1: norm(),
                self_attn: SelfAttention::init(shape.hidden, shape.heads, device),
                layer_norm2: norm(),
                mlp: Mlp::init(shape.hidden, shape.intermediate, shape.activation, device),
            })
            .collect();
        Encoder { layers }
    }

    /// The last layer's output and, with `keep`, every layer's input and the last output (what
    /// transformers calls `hidden_states`).
    pub(crate) fn forward(
        &self,
        x: Tensor<B, 3>,
        keep: bool,
        pass: &Pass,
    ) -> (Tensor<B, 3>, Vec<Tensor<B, 3>>) {
        run_layers(x, &self.layers, keep, pass, EncoderLayer::forward)
    }
}
