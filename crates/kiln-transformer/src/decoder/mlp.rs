//! The gated MLP of Llama-family decoders (transformers' `LlamaMLP`; field names mirror
//! `model.layers.N.mlp`): `down_proj(silu(gate_proj x) ⊙ up_proj x)`, or with the tanh
//! approximation of GELU on the gate (Gemma 3's `gelu_pytorch_tanh`).

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, RmsNorm};
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu_approximate, silu};
use burn::tensor::backend::Backend;
use kiln_kernels::host;

use super::attention::{add_output, add_output_on_host};
use super::{HostBuffers, sized};
use crate::Pass;
use crate::projection::{Then, product_rows_into, project};

/// `down_proj(act(gate_proj x) ⊙ up_proj x)`, `act` silu unless told otherwise.
#[derive(Module, Debug)]
pub struct SwiGlu<B: Backend> {
    gate_proj: Linear<B>,
    up_proj: Linear<B>,
    down_proj: Linear<B>,
    #[module(skip)]
    gate: Gate,
}

/// The activation on a gated MLP's gate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Gate {
    /// `silu` (Llama, Qwen2).
    #[default]
    Silu,
    /// The tanh approximation of GELU (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
}

/// Rows of the host MLP's blocks: its `[rows, 2 · intermediate]` products stay a few MB (in
/// cache) whatever the batch.
const MLP_ROWS: usize = 256;

impl<B: Backend> SwiGlu<B> {
    /// Randomly initialised weights from `hidden` to `intermediate` features and back, with
    /// biases or without.
    pub fn init(hidden: usize, intermediate: usize, bias: bool, device: &B::Device) -> Self {
        let linear = |inputs, outputs| {
            LinearConfig::new(inputs, outputs)
                .with_bias(bias)
                .init(device)
        };
        SwiGlu {
            gate_proj: linear(hidden, intermediate),
            up_proj: linear(hidden, intermediate),
            down_proj: linear(intermediate, hidden),
            gate: Gate::Silu,
        }
    }

    /// The same MLP with `gate` on its gate.
    pub fn with_gate(self, gate: Gate) -> Self {
        SwiGlu { gate, ..self }
    }

    /// `residual + mlp(normed)` through burn's operations.
    pub(super) fn add_by_tensors(
        &self,
        normed: Tensor<B, 3>,
        residual: Tensor<B, 3>,
        post: Option<&RmsNorm<B>>,
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let gate = project(&self.gate_proj, normed.clone(), Then::Nothing, pass);
        let gate = match self.gate {
            Gate::Silu => silu(gate),
            Gate::GeluTanh => gelu_approximate(gate),
        };
        let hidden = gate * project(&self.up_proj, normed, Then::Nothing, pass);
        add_output(&self.down_proj, hidden, residual, post, pass)
    }

    /// `residual += mlp(buffers.normed)` on the host kernels, blocks of rows at a time: gate and
    /// up as one product, `silu(gate) ⊙ up` in one pass over it, and `down_proj` added onto the
    /// residual stream in place.
    pub(super) fn add_on_host(
        &self,
        residual: &mut [f32],
        hidden: usize,
        post: Option<&RmsNorm<B>>,
        pass: &Pass,
        buffers: &mut HostBuffers,
    ) {
        let gate_up_weight = pass
            .prepared()
            .side_by_side(&[&self.gate_proj, &self.up_proj]);
        let down = pass.prepared().linear(&self.down_proj, None);
        let width = gate_up_weight.columns() / 2;
        for (x, sums) in buffers
            .normed
            .chunks(MLP_ROWS * hidden)
            .zip(residual.chunks_mut(MLP_ROWS * hidden))
        {
            let rows = x.len() / hidden;
            let gate_up = sized(&mut buffers.gate_up, rows * 2 * width);
            product_rows_into(gate_up, x, hidden, &gate_up_weight, |v| v);
            let activated = sized(&mut buffers.activated, rows * width);
            match self.gate {
                Gate::Silu => host::swiglu_into(activated, gate_up, width),
                Gate::GeluTanh => geglu_tanh_into(activated, gate_up, width),
            }
            let scratch = (&mut buffers.post, &mut buffers.normed_heads);
            add_output_on_host(sums, activated, width, &down, post, scratch);
        }
    }
}

/// `gelu_tanh(gate) ⊙ up` of rows holding `[gate | up]`, `width` each.
fn geglu_tanh_into(out: &mut [f32], gate_up: &[f32], width: usize) {
    for (out, gate_up) in out.chunks_mut(width).zip(gate_up.chunks(2 * width)) {
        let (gate, up) = gate_up.split_at(width);
        for ((out, &gate), &up) in out.iter_mut().zip(gate).zip(up) {
            *out = host::gelu_tanh(gate) * up;
        }
    }
}
