//! A stack of layers run in turn.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::Pass;

/// Runs `layers` in turn; with `keep`, also returns every layer's input and the last output (the
/// `hidden_states` of transformers), in the output dtype.
pub fn run_layers<B: Backend, L>(
    mut x: Tensor<B, 3>,
    layers: &[L],
    keep: bool,
    pass: &Pass,
    mut forward: impl FnMut(&L, Tensor<B, 3>, &Pass) -> Tensor<B, 3>,
) -> (Tensor<B, 3>, Vec<Tensor<B, 3>>) {
    let mut hidden_states = Vec::new();
    for layer in layers {
        if keep {
            hidden_states.push(pass.output(x.clone()));
        }
        x = forward(layer, x, pass);
    }
    if keep {
        hidden_states.push(pass.output(x.clone()));
    }
    (x, hidden_states)
}
