//! What the parity tests share: the fixtures and their reference tensors.

use std::path::PathBuf;

use burn::nn::{LayerNorm, Linear};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// LatentWire's tensors, from a safetensors file of the fixtures.
pub struct Reference(Vec<u8>);

impl Reference {
    pub fn open(name: &str) -> Self {
        Reference(std::fs::read(fixtures().join(name)).unwrap())
    }

    /// The f32 values of `key` and their shape.
    pub fn floats(&self, key: &str) -> (Vec<f32>, Vec<usize>) {
        let tensors = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let view = tensors.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
        let values = (view.data().chunks_exact(4))
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        (values, view.shape().to_vec())
    }

    /// The integers of the int64 tensor `key`.
    pub fn ints(&self, key: &str) -> Vec<i64> {
        let tensors = safetensors::SafeTensors::deserialize(&self.0).unwrap();
        let view = tensors.tensor(key).unwrap_or_else(|e| panic!("{key}: {e}"));
        (view.data().chunks_exact(8))
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn tensor<B: Backend, const D: usize>(&self, key: &str) -> Tensor<B, D> {
        let (values, shape) = self.floats(key);
        Tensor::from_data(TensorData::new(values, shape), &Default::default())
    }
}

/// `actual` has `key`'s shape and values within `tolerance` of its largest magnitude (at least 1).
pub fn assert_close<B: Backend, const D: usize>(
    actual: Tensor<B, D>,
    reference: &Reference,
    key: &str,
    tolerance: f32,
) {
    let (want, shape) = reference.floats(key);
    assert_eq!(actual.dims().to_vec(), shape, "{key}: shape");
    let got = actual.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let gap = (got.iter().zip(&want)).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        gap <= tolerance * scale,
        "{key}: max |Δ| {gap}, max |reference| {scale}"
    );
}

/// The gradients of `linear`'s weight and bias are LatentWire's `grad.{name}.weight` and
/// `grad.{name}.bias` (burn keeps a linear's weight as [in, out], PyTorch as [out, in]).
pub fn assert_linear_grads<B: AutodiffBackend>(
    linear: &Linear<B>,
    grads: &B::Gradients,
    reference: &Reference,
    name: &str,
) {
    let weight = linear.weight.grad(grads).unwrap().transpose();
    assert_close(weight, reference, &format!("grad.{name}.weight"), 1e-5);
    let bias = linear.bias.as_ref().unwrap().grad(grads).unwrap();
    assert_close(bias, reference, &format!("grad.{name}.bias"), 1e-5);
}

/// The gradients of `norm`'s scale and shift are LatentWire's `grad.{name}.weight` and
/// `grad.{name}.bias`.
pub fn assert_norm_grads<B: AutodiffBackend>(
    norm: &LayerNorm<B>,
    grads: &B::Gradients,
    reference: &Reference,
    name: &str,
) {
    let gamma = norm.gamma.grad(grads).unwrap();
    assert_close(gamma, reference, &format!("grad.{name}.weight"), 1e-5);
    let beta = norm.beta.as_ref().unwrap().grad(grads).unwrap();
    assert_close(beta, reference, &format!("grad.{name}.bias"), 1e-5);
}

/// One of kiln-text's tiny generated checkpoints (`llama`, `qwen2`): a ChatML template, a
/// 384-token byte-level BPE.
pub fn language_model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../kiln-text/tests/fixtures")
        .join(name)
}

/// The largest absolute difference of two tensors of one shape.
pub fn max_gap<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let (a, b) = (
        a.into_data().to_vec::<f32>().unwrap(),
        b.into_data().to_vec::<f32>().unwrap(),
    );
    (a.iter().zip(&b)).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The checkpoint `name` given 256 positions (it has 64, too few for the system prompt, a text
/// and an answer; its rotary positions have no table, so its weights load unchanged).
pub fn roomy_reader<B: Backend>(name: &str) -> kiln_latentwire::Reader<B> {
    let dir = language_model(name);
    let mut config = kiln_text::TextConfig::from_hf_config(&dir).unwrap();
    config.max_position_embeddings = 256;
    let unused = ["lm_head.", "model.rotary_emb."];
    let lm = kiln_core::load_checkpoint(config.init(&Default::default()), &dir, &[], &unused);
    let tokenizer = kiln_text::TextTokenizer::from_hf_dir(&dir).unwrap();
    kiln_latentwire::Reader::new(name, lm.unwrap(), tokenizer).unwrap()
}
