//! The norms of a training step on `Autodiff<Flex>` as one host operation each
//! ([`RowNorm`]): burn 0.21 runs LayerNorm there as nine tensor operations and RMSNorm as six,
//! each a pass over the activations with its broadcast (a sixth of a DINOv2 encoder's forward in
//! fVLM's training step, docs/PERFORMANCE.md).

use burn::module::{Content, DisplaySettings, ModuleDisplay};
use burn::nn::{LayerNorm, RmsNorm};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_kernels::host::RowNorm;
use kiln_kernels::host_ops_serve;

/// `norm(x)` as one differentiable host operation where the backend is `Autodiff<Flex>` in
/// f32; `None` elsewhere.
pub(super) fn trained_layer_norm<B: Backend, const D: usize>(
    norm: &LayerNorm<B>,
    x: &Tensor<B, D>,
) -> Option<Tensor<B, D>> {
    if !host_ops_serve(x) {
        return None;
    }
    let row_norm = RowNorm {
        eps: layer_norm_epsilon(norm)? as f32,
        centred: true,
    };
    let beta = norm.beta.as_ref().map(|beta| beta.val());
    row_norm.forward(x, &norm.gamma.val(), beta.as_ref())
}

/// [`trained_layer_norm`] for RMSNorm.
pub(super) fn trained_rms_norm<B: Backend, const D: usize>(
    norm: &RmsNorm<B>,
    x: &Tensor<B, D>,
) -> Option<Tensor<B, D>> {
    let row_norm = RowNorm {
        eps: norm.epsilon as f32,
        centred: false,
    };
    row_norm.forward(x, &norm.gamma.val(), None)
}

/// A LayerNorm's epsilon. burn 0.21 keeps the field private and shows it only in the module's
/// description, where an `f64` is written in its shortest exact form (`Display`): read back from
/// there, exactly. `None` if a later burn describes it otherwise (burn's own operations then
/// serve).
fn layer_norm_epsilon<B: Backend>(norm: &LayerNorm<B>) -> Option<f64> {
    let content = norm.custom_content(Content::new(DisplaySettings::new()))?;
    let epsilon = content.attributes.iter().find(|a| a.name == "epsilon")?;
    epsilon.value.parse().ok()
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::nn::LayerNormConfig;

    #[test]
    fn a_layer_norms_epsilon_is_read_back_exactly() {
        for epsilon in [1e-5, 1e-6, 1e-12, 0.1 + 0.2, 0.0] {
            let norm = LayerNormConfig::new(4)
                .with_epsilon(epsilon)
                .init::<Flex>(&Default::default());
            assert_eq!(super::layer_norm_epsilon(&norm), Some(epsilon));
        }
    }
}
