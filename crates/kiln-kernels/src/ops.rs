//! Operations of the keep-in-f32 set that need more than a cast around them.

use burn::tensor::backend::Backend;
use burn::tensor::{IndexingUpdateOp, Int, Tensor};

use kiln_core::Precision;
use kiln_core::{cast, widen_to_f32};

/// `dest[.., indices[i], ..] += src[.., i, ..]` along `dim`, for any mix of float dtypes.
///
/// The sum is formed in the wider of f32 and the two operands' dtypes, so thousands of f16 terms
/// (per-atom energies summed into a structure, say) do not lose their low bits, and the result
/// comes back in `dest`'s dtype. This is the operation PyTorch refuses with
/// `index_add_(): self (Half) and source (Float) must have the same scalar type`.
///
/// ```
/// # use burn::backend::Flex;
/// # use burn::tensor::{FloatDType, Int, Tensor};
/// let device = Default::default();
/// let energies = Tensor::<Flex, 1>::zeros([2], &device); // f32, one per structure
/// let per_atom = Tensor::<Flex, 1>::from_floats([1.0, 2.0, 3.0], &device).cast(FloatDType::F16);
/// let structure = Tensor::<Flex, 1, Int>::from_ints([0, 0, 1], &device);
/// let energies = kiln_kernels::scatter_add(energies, 0, structure, per_atom);
/// assert_eq!(energies.to_data().to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
/// ```
pub fn scatter_add<B: Backend, const D: usize>(
    dest: Tensor<B, D>,
    dim: usize,
    indices: Tensor<B, 1, Int>,
    src: Tensor<B, D>,
) -> Tensor<B, D> {
    let dest_precision = Precision::from_dtype(dest.dtype()).unwrap_or(Precision::F32);
    let dest = widen_to_f32(dest);
    let src = widen_to_f32(src);
    let (dest, src) = match (
        Precision::from_dtype(dest.dtype()),
        Precision::from_dtype(src.dtype()),
    ) {
        (Some(Precision::F64), _) | (_, Some(Precision::F64)) => {
            (cast(dest, Precision::F64), cast(src, Precision::F64))
        }
        _ => (dest, src),
    };
    let sum = dest.select_assign(dim, indices, src, IndexingUpdateOp::Add);
    cast(sum, dest_precision)
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::{DType, FloatDType, Tensor};

    type B = Flex;

    fn host(x: Tensor<B, 2>) -> Vec<f64> {
        x.cast(FloatDType::F64).into_data().to_vec::<f64>().unwrap()
    }

    #[test]
    fn scatter_add_accepts_mixed_dtypes_and_accumulates_wide() {
        let device = Default::default();
        let n = 3000;
        let ones = Tensor::<B, 1>::ones([n], &device);
        let to_zero = Tensor::<B, 1, Int>::zeros([n], &device);

        // The PyTorch failure: f16 destination, f32 source.
        let dest = Tensor::<B, 1>::zeros([2], &device).cast(FloatDType::F16);
        let sum = scatter_add(dest, 0, to_zero.clone(), ones.clone());
        assert_eq!(sum.dtype(), DType::F16);
        // 3000 is exact in f16; a sum kept in f16 stalls at 2048, where the spacing becomes 2.
        assert_eq!(host(sum.unsqueeze()), vec![3000.0, 0.0]);

        // f32 destination, f16 source; and both f16.
        let dest = Tensor::<B, 1>::zeros([2], &device);
        let sum = scatter_add(dest, 0, to_zero.clone(), ones.clone().cast(FloatDType::F16));
        assert_eq!(sum.dtype(), DType::F32);
        assert_eq!(host(sum.unsqueeze()), vec![3000.0, 0.0]);
        let dest = Tensor::<B, 1>::zeros([2], &device).cast(FloatDType::BF16);
        let sum = scatter_add(dest, 0, to_zero, ones.cast(FloatDType::BF16));
        assert_eq!(sum.dtype(), DType::BF16);
        assert_eq!(host(sum.unsqueeze()), vec![3008.0, 0.0]); // 3000 rounded to bf16's 8 bits

        // Against f64 on a real scatter pattern: per-structure sums of per-atom values.
        let values: Vec<f32> = (0..1000u64)
            .map(|i| {
                ((i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f32 / (1u64 << 23) as f32
                    - 1.0
            })
            .collect();
        let index: Vec<i64> = (0..1000).map(|i| (i * 7 % 13) as i64).collect();
        let mut want = vec![0.0f64; 13];
        for (v, &i) in values.iter().zip(&index) {
            want[i as usize] += half::f16::from_f32(*v).to_f64();
        }
        let src = Tensor::<B, 1>::from_floats(values.as_slice(), &device).cast(FloatDType::F16);
        let idx = Tensor::<B, 1, Int>::from_ints(index.as_slice(), &device);
        let dest = Tensor::<B, 1>::zeros([13], &device).cast(FloatDType::F64);
        let got = host(scatter_add(dest, 0, idx, src).unsqueeze());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-12, "{g} vs {w}");
        }
    }
}
