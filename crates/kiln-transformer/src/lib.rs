//! # kiln-transformer
//!
//! The transformer machinery kiln's model crates share (kiln-vision's towers, kiln-text's
//! language models), so that every model gets the same CPU speed without a copy:
//!
//! - [`projection`]: `x W + b` with what follows it fused in (bias, activation, LayerScale and the
//!   residual add), and self-attention's q, k and v as one product; in training on Flex one
//!   autodiff operation with its gradients as products per block of rows;
//! - [`prepared`]: projection weights packed once per weight, not once per forward;
//! - [`decoder`]: the layers of Llama-family language models (causal grouped-query attention
//!   with rotary embeddings and a key/value cache, the SwiGLU MLP) written once per layer, each
//!   choosing host, autodiff or tensor execution itself;
//! - [`image`]: NHWC images on the host and their layers: convolutions (kernels prepared once,
//!   transposed ones by output phase), group norm, pooling, bilinear resizing (the real-time
//!   frame models);
//! - [`PackedAttention`]: PyTorch's `nn.MultiheadAttention`, q, k and v from one packed
//!   projection (LatentWire's encoder, the real-time U-Net's bottleneck);
//! - [`Pass`]: one forward's precision policy (compute-dtype casts, norms and softmax in f32)
//!   and its Monte-Carlo dropout, whose masks come from a counter-based hash of
//!   `(seed, item, pass, site, element)` so they are the same on every backend and in any
//!   batch.
//!
//! The kernels all of this runs on (host attention, softmax, norms, device masks and attention)
//! are kiln-kernels'.
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
pub mod decoder;
mod dropout;
pub mod image;
mod layers;
mod linear_op;
mod packed_attention;
mod pass;
pub mod prepared;
pub mod projection;

pub use activation::Activation;
pub use dropout::{Draw, DropoutError, DropoutSites, Sample, Site};
pub use kiln_kernels::gemm::Products;
pub use layers::run_layers;
pub use packed_attention::{PACKED_ATTENTION_KEYS, PackedAttention};
pub use pass::{Pass, Settings, host_autocast, in_compute_dtype};
pub use prepared::{PreparedWeights, StoredWeights};
