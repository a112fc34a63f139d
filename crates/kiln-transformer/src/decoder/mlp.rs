//! The SwiGLU MLP of Llama-family decoders (transformers' `LlamaMLP`; field names mirror
//! `model.layers.N.mlp`): `down_proj(silu(gate_proj x) ⊙ up_proj x)`.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::activation::silu;
use burn::tensor::backend::Backend;
use kiln_kernels::host;

use super::{HostBuffers, sized};
use crate::Pass;
use crate::projection::{Then, add_product, product_rows_into, project};

/// `down_proj(silu(gate_proj x) ⊙ up_proj x)`.
#[derive(Module, Debug)]
pub struct SwiGlu<B: Backend> {
    gate_proj: Linear<B>,
    up_proj: Linear<B>,
    down_proj: Linear<B>,
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
        }
    }

    /// `residual + mlp(normed)` through burn's operations.
    pub(super) fn add_by_tensors(
        &self,
        normed: Tensor<B, 3>,
        residual: Tensor<B, 3>,
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let gate = project(&self.gate_proj, normed.clone(), Then::Nothing, pass);
        let hidden = silu(gate) * project(&self.up_proj, normed, Then::Nothing, pass);
        let then = Then::AddTo {
            residual,
            scale: None,
        };
        project(&self.down_proj, hidden, then, pass)
    }

    /// `residual += mlp(buffers.normed)` on the host kernels, blocks of rows at a time: gate and
    /// up as one product, `silu(gate) ⊙ up` in one pass over it, and `down_proj` added onto the
    /// residual stream in place.
    pub(super) fn add_on_host(
        &self,
        residual: &mut [f32],
        hidden: usize,
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
            host::swiglu_into(activated, gate_up, width);
            add_product(sums, activated, width, &down);
        }
    }
}
