//! Operations of the keep-in-f32 set that need more than a cast around them.

use burn::tensor::backend::Backend;
use burn::tensor::{IndexingUpdateOp, Int, Tensor};

use crate::dtype::Precision;
use crate::policy::{cast, widen_to_f32};

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
/// let energies = kiln_precision::scatter_add(energies, 0, structure, per_atom);
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
