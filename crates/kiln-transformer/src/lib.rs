//! # kiln-transformer
//!
//! The transformer machinery kiln's model crates share (kiln-vision's towers, kiln-text's
//! language models), so that every model gets the same CPU speed without a copy:
//!
//! - [`projection`]: `x W + b` with what follows it fused in (bias, activation, LayerScale and the
//!   residual add), and self-attention's q, k and v as one product; in training on Flex one
//!   autodiff operation with its gradients as products per block of rows;
//! - [`host`]: f32 kernels for the host backends (vectorised activations and softmax, the
//!   attention kernel and its backward);
//! - [`rotary`]: rotary position embeddings' rotation of rows and its transpose;
//! - [`matmul`]: strided products on host slices through the `gemm` crate;
//! - [`checkpoint`]: Hugging Face safetensors checkpoints (single or sharded, f32/f16/bf16),
//!   checked against the model before loading, every missing or mis-shaped tensor named;
//! - [`prepared`]: projection weights packed once per weight, not once per forward;
//! - [`Pass`]: one forward's precision policy (compute-dtype casts, norms and softmax in f32)
//!   and its Monte-Carlo dropout, whose masks come from a counter-based hash of
//!   `(seed, item, pass, site, element)` so they are the same on every backend and in any batch; on burn's CUDA and wgpu backends
//!   one kernel makes each mask on the device, and attention with dropout on its probabilities
//!   is one kernel (features `cuda`, `wgpu`).
//!
//! ```
//! use burn::backend::Flex;
//! use burn::nn::LinearConfig;
//! use burn::tensor::Tensor;
//! use kiln_transformer::projection::{Then, project};
//! use kiln_transformer::{Activation, Pass, PreparedWeights, Settings};
//!
//! let device = Default::default();
//! let fc1 = LinearConfig::new(8, 32).init::<Flex>(&device);
//! let pass = Pass::new(&Settings::default(), &PreparedWeights::default(), None);
//! let x = Tensor::<Flex, 3>::ones([2, 5, 8], &device);
//! // gelu(x W + b), the activation applied as the product's tiles are stored.
//! let hidden = project(&fc1, x, Then::Activate(Activation::Gelu), &pass);
//! assert_eq!(hidden.dims(), [2, 5, 32]);
//! ```

mod activation;
pub mod checkpoint;
mod device_attention;
mod device_mask;
pub mod host;
mod layers;
mod linear_op;
pub mod matmul;
mod pass;
pub mod prepared;
pub mod projection;
pub mod rotary;

pub use activation::Activation;
pub use device_attention::fused_attention_launches;
pub use device_mask::host_mask_uploads;
pub use layers::run_layers;
pub use pass::{
    Draw, DropoutError, DropoutSites, HashedMask, Pass, RowMask, Sample, Settings, Site,
    in_compute_dtype,
};
pub use prepared::PreparedWeights;
