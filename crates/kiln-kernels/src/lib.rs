//! # kiln-kernels
//!
//! The compute kernels kiln's model crates share, kept below them so that none holds a copy:
//!
//! - [`gemm`]: every matrix product, chosen by element type in one place: [`gemm::sgemm`]
//!   (packed-panel f32 products with fused epilogues: the vision encoders' projections, the
//!   force field's host potential), [`gemm::bf16`] (bf16 products with f32 sums on AMX tiles or
//!   AVX512-BF16: the mixed-bf16 policy's host products), [`gemm::strided`] (products of
//!   strided views on host slices through the `gemm` crate) and [`gemm::cublaslt`] (burn's
//!   CUDA backend through NVIDIA's cuBLASLt, the bias, the tanh GELU and a residual in the
//!   kernel; feature `cuda`, the product's description everywhere);
//! - [`math`] and [`gelu`]: vectorised host math and the GELU as a differentiable host kernel;
//! - [`host`]: f32 kernels for the host backends — bias + activation, softmax, RMSNorm, SwiGLU,
//!   attention and its backward ([`host::AttentionOp`]);
//! - [`rotary`]: rotary position embeddings' rotation of rows and its transpose;
//! - [`HashedMask`]: counter-based Monte-Carlo dropout masks, the same bits on every backend; on
//!   burn's CUDA and wgpu backends one kernel makes each mask on the device, and attention with
//!   dropout on its probabilities is one kernel (features `cuda`, `wgpu`);
//! - [`HostValues`]: a host tensor's f32 values, read in place from Flex's storage;
//! - [`HostOp`] / [`host_op`]: a host kernel turned into a differentiable operation (training
//!   on Flex);
//! - [`cross_entropy`]: token cross-entropy with its gradient in one host pass;
//! - [`adamw_on_host`]: one-pass AdamW over a parameter's values, moments and gradient;
//! - [`scatter_add`]: index-add across dtypes, accumulated in at least f32;
//! - [`RowIndex`]: rows gathered and scattered by one index, as a graph network passes
//!   messages; a segment-sum kernel of kiln's own on burn's GPU backends (module `cube`,
//!   features `cuda` and `wgpu`).
//!
//! ```
//! use kiln_kernels::gemm::sgemm;
//!
//! if sgemm::supported() {
//!     // W [3, 2] packed once, then y = x W + b for x [2, 3].
//!     let w = [1.0, 0.0, 0.0, 1.0, 1.0, -1.0];
//!     let packed = sgemm::Packed::new(3, &[(&w, 2)]);
//!     let x = [1.0, 2.0, 3.0, 0.5, 0.5, 0.5];
//!     let mut y = [0.0; 4];
//!     sgemm::product_on_this_thread(&mut y, &x, &packed, 2, &[0.5, 0.5]);
//!     assert_eq!(y, [4.5, -0.5, 1.5, 0.5]);
//! }
//! ```

mod activation;
mod adamw;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub mod cube;
pub mod device_attention;
pub mod device_mask;
pub mod gemm;
pub mod host;
mod host_op;
mod loss;
mod mask;
pub mod math;
mod ops;
pub mod rotary;
mod row_index;
mod segment;
mod values;

pub use activation::gelu;
pub use adamw::{AdamWInputs, AdamWStep, adamw_on_host};
pub use device_attention::fused_attention_launches;
pub use device_mask::host_mask_uploads;
pub use host_op::{HostOp, host_op, host_ops_serve};
pub use loss::{cross_entropy, distillation, weighted_cross_entropy};
pub use mask::{HashedMask, RowMask, dropout_mask, for_each_factor, row_key};
pub use ops::scatter_add;
pub use row_index::{RowIndex, RowIndexError};
pub use segment::segment_sum_launches;
pub use values::{HostValues, StorageKey, sum_of_squares, zeros};
