//! PyTorch's `nn.MultiheadAttention` (no masks, no dropout): q, k and v from one packed
//! projection, `in_proj_weight` `[3 · d, d]`, and the output projection `out_proj`. A state dict
//! loads through [`PACKED_ATTENTION_KEYS`], which names `in_proj_weight` / `in_proj_bias` as
//! this module's `in_proj` linear.

use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_kernels::host;

use crate::Pass;
use crate::projection::{Then, project};

/// The key remapping (state-dict name → module path) of every [`PackedAttention`] in a
/// PyTorch state dict.
pub const PACKED_ATTENTION_KEYS: (&str, &str) = (r"\.in_proj_(weight|bias)$", ".in_proj.$1");

/// Multi-head attention with q, k and v from one packed projection, as PyTorch's
/// `nn.MultiheadAttention` keeps them.
#[derive(Module, Debug)]
pub struct PackedAttention<B: Backend> {
    /// q, k and v side by side (`in_proj_weight`, `in_proj_bias`).
    pub in_proj: Linear<B>,
    /// The heads merged → `d`.
    pub out_proj: Linear<B>,
    #[module(skip)]
    heads: usize,
}

impl<B: Backend> PackedAttention<B> {
    /// PyTorch's initialisation: Xavier-uniform over the packed `[3 · d, d]` weight, zero
    /// biases, the output projection as a default `Linear` with a zero bias.
    pub fn init(width: usize, heads: usize, device: &B::Device) -> Self {
        let mut in_proj = LinearConfig::new(width, 3 * width).init(device);
        in_proj.weight = Initializer::XavierUniform { gain: 1.0 }.init_with(
            [width, 3 * width],
            Some(width),
            Some(3 * width),
            device,
        );
        in_proj.bias = Some(Initializer::Zeros.init([3 * width], device));
        let mut out_proj = LinearConfig::new(width, width).init(device);
        out_proj.bias = Some(Initializer::Zeros.init([width], device));
        PackedAttention {
            in_proj,
            out_proj,
            heads,
        }
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.out_proj.weight.dims()[0]
    }

    /// The number of heads.
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Self-attention of `x` `[batch, tokens, d]` through both projections (the module's
    /// forward with `query = key = value = x`).
    pub fn forward(&self, x: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        project(
            &self.out_proj,
            self.attend_self(x, pass),
            Then::Nothing,
            pass,
        )
    }

    /// Self-attention of `x` `[batch, tokens, d]`, heads merged, before `out_proj`: one product
    /// for q, k and v, which the host attention kernel reads in place.
    pub fn attend_self(&self, x: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let width = self.width();
        let qkv = project(&self.in_proj, x, Then::Nothing, pass);
        if host::serves(&qkv) {
            let device = qkv.device();
            return pass.attention_side_by_side(qkv.into_data(), self.heads, &device);
        }
        let [q, k, v] = [0, 1, 2].map(|part| qkv.clone().narrow(2, part * width, width));
        pass.attention(q, k, v, self.heads)
    }

    /// The learned `queries` `[M, d]` (the same for every item) attending over `x` `[batch,
    /// tokens, d]`, heads merged, before `out_proj`.
    pub fn attend_from(&self, queries: Tensor<B, 2>, x: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let [batch, _, width] = x.dims();
        let latents = queries.dims()[0];
        let weight = self.in_proj.weight.val();
        let bias = self.in_proj.bias.as_ref().map(Param::val);
        let part = |range: std::ops::Range<usize>| {
            let w = weight.clone().slice([0..width, range.clone()]);
            (w, bias.clone().map(|b| b.slice([range])))
        };
        let (w_q, b_q) = part(0..width);
        let mut q = queries.matmul(w_q);
        if let Some(b) = b_q {
            q = q + b.unsqueeze();
        }
        let q = q.unsqueeze_dim::<3>(0).expand([batch, latents, width]);
        let (w_kv, b_kv) = part(width..3 * width);
        let mut kv = x.matmul(w_kv.unsqueeze());
        if let Some(b) = b_kv {
            kv = kv + b.unsqueeze();
        }
        let [k, v] = [0, 1].map(|part| kv.clone().narrow(2, part * width, width));
        pass.attention(q, k, v, self.heads)
    }
}
