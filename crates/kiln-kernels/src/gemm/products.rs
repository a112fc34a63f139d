//! Which products a precision policy's host operations run: the one place a policy meets the
//! CPU's instruction sets.

use kiln_core::{Policy, Precision};

use super::bf16;

/// The operands host products read: f32, or rounded to bf16 with f32 sums (PyTorch's CPU
/// autocast).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Products {
    /// f32 operands.
    #[default]
    F32,
    /// bf16 operands, f32 sums ([`bf16`]).
    Bf16,
}

/// Whether `policy` keeps f32 parameters and computes in bf16 (`mixed-bf16`): what host
/// autocast and bf16 products both start from.
pub fn is_mixed_bf16(policy: &Policy) -> bool {
    policy.param == Precision::F32 && policy.compute == Precision::BF16
}

impl Products {
    /// The operands host products read under `policy`: bf16 under a bf16 compute policy with
    /// f32 parameters where the CPU multiplies bf16 ([`bf16::supported`]), else f32.
    ///
    /// ```
    /// use kiln_core::{Policy, Precision};
    /// use kiln_kernels::gemm::{Products, bf16};
    ///
    /// assert_eq!(Products::under(&Policy::full()), Products::F32);
    /// let mixed_bf16 = Policy { compute: Precision::BF16, ..Policy::full() };
    /// assert_eq!(Products::under(&mixed_bf16) == Products::Bf16, bf16::supported());
    /// ```
    pub fn under(policy: &Policy) -> Products {
        if is_mixed_bf16(policy) && bf16::supported() {
            Products::Bf16
        } else {
            Products::F32
        }
    }
}
