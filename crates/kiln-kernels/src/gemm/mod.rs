//! Matrix products, by element type and device: where each instruction set is chosen once and
//! the callers ask for a product, not for an instruction set.
//!
//! - f32: [`sgemm`] (packed panels, 6 × 16 AVX2 / 6 × 64 AVX-512 register tiles), [`strided`]
//!   (the `gemm` crate, for strided views);
//! - bf16 operands with f32 accumulation, as PyTorch's CPU autocast multiplies: [`bf16`], on
//!   Intel's AMX tiles (`tdpbf16ps`, Sapphire Rapids and later) or AVX512-BF16's `vdpbf16ps`
//!   (Cooper Lake, AMD Zen 4 and Zen 5; by default on AMD's only), chosen by
//!   [`Bf16Isa::chosen`];
//! - weights kept in llama.cpp's quantized blocks, activations quantized per block to 8 bits:
//!   [`quantized`] (AVX2's byte products, plain Rust elsewhere);
//! - on burn's CUDA backend: [`cublaslt`] (NVIDIA's cuBLASLt, epilogues in the kernel).
//!
//! A precision policy picks its products in one place, [`Products::under`].
//!
//! ```
//! use kiln_kernels::gemm::bf16;
//!
//! if bf16::supported() {
//!     // W [3, 2] rounded to bf16 and packed once, then y = x W + b for x [2, 3].
//!     let w = [1.0, 0.0, 0.0, 1.0, 1.0, -1.0];
//!     let packed = bf16::Packed::new(3, &[(&w, 2)]);
//!     let x = [1.0, 2.0, 3.0, 0.5, 0.5, 0.5];
//!     let y = bf16::new_product(&x, &packed, 2, &[0.5, 0.5], |v| v);
//!     assert_eq!(y, [4.5, -0.5, 1.5, 0.5]);
//! }
//! ```

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512_bf16;
pub mod bf16;
pub mod cublaslt;
pub(crate) mod heads;
mod isa;
pub(crate) mod lines;
mod padded;
mod products;
pub mod quantized;
pub mod sgemm;
pub mod strided;

pub use isa::Bf16Isa;
pub use products::{Products, is_mixed_bf16};
