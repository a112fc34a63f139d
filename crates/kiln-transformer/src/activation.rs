//! The activations of transformer MLPs, by transformers' `hidden_act` names.

use burn::tensor::Tensor;
use burn::tensor::activation::{gelu_approximate, sigmoid};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

/// An MLP activation (transformers' `hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Activation {
    /// `x · σ(1.702 x)` (OpenAI CLIP).
    #[serde(rename = "quick_gelu")]
    QuickGelu,
    /// The tanh approximation of GELU (SigLIP).
    #[serde(rename = "gelu_pytorch_tanh", alias = "gelu_new", alias = "gelu_fast")]
    GeluTanh,
    /// Exact GELU, `x · Φ(x)` (DINOv2).
    #[serde(rename = "gelu")]
    Gelu,
}

impl Activation {
    /// `activation(x)` through burn's operations.
    pub fn forward<B: Backend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            // x · σ(1.702 x)
            Activation::QuickGelu => x.clone() * sigmoid(x * 1.702),
            Activation::GeluTanh => gelu_approximate(x),
            Activation::Gelu => kiln_kernels::gelu(x),
        }
    }
}
