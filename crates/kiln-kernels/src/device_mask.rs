//! Dropout masks made where the tensor lives: on burn's CUDA and wgpu backends one cubecl kernel
//! computes a site's whole mask from its rows' hash words ([`HashedMask`]), so a Monte-Carlo
//! pass uploads 8 bytes per row and site instead of the mask (4 bytes per element). The kernel
//! computes the same bits as the host ([`mask_bits`](crate::mask)): masks are identical on every
//! backend and in any batch composition.
//!
//! Host backends scale f32 values in place instead ([`Pass::drop`](crate::Pass::drop)); what
//! is left (autodiff wrappers, half-precision tensors on the host) takes a mask built on the
//! host and uploaded. Each such upload is counted per thread ([`host_mask_uploads`]), so tests
//! can show that a pass uploads none.

use std::cell::Cell;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

use crate::mask::HashedMask;

thread_local! {
    static HOST_MASK_UPLOADS: Cell<u64> = const { Cell::new(0) };
}

/// How many dropout masks this thread has built on the host and uploaded as a tensor (a
/// diagnostic: f32 passes on the host backends and every pass on burn's CUDA and wgpu backends
/// upload none).
pub fn host_mask_uploads() -> u64 {
    HOST_MASK_UPLOADS.with(Cell::get)
}

/// Counts one host-built mask (the dropout pass calls it when [`on_device`] gives none).
pub fn count_host_upload() {
    HOST_MASK_UPLOADS.with(|uploads| uploads.set(uploads.get() + 1));
}

/// `mask` over a `[batch, ..]` tensor of `dims` as values (0 or `1 / (1 − p)`) in `dtype` (f32,
/// bf16 or f16: the masked tensor's own, so the product reads no wider mask), made on `device` by
/// a kernel where `B` is burn's CUDA or wgpu backend (as compiled in), else `None`.
#[allow(unused_variables)]
pub fn on_device<B: Backend, const D: usize>(
    mask: &HashedMask,
    dims: [usize; D],
    dtype: DType,
    device: &B::Device,
) -> Option<Tensor<B, D>> {
    #[cfg(feature = "cuda")]
    if let Some(tensor) =
        cube::fused::<B, cubecl::cuda::CudaRuntime, u8, D>(mask, dims, dtype, device)
    {
        return Some(tensor);
    }
    #[cfg(feature = "wgpu")]
    if let Some(tensor) =
        cube::fused::<B, cubecl::wgpu::WgpuRuntime, u32, D>(mask, dims, dtype, device)
    {
        return Some(tensor);
    }
    None
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub(crate) use cube::{keeps, upload_words};

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube {
    use std::any::Any;

    use crate::cube::{into_fused, is_fused};
    use burn::tensor::backend::Backend;
    use burn::tensor::{DType, Shape, Tensor};
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::{BoolElement, CubeRuntime};
    use cubecl::prelude::*;
    use cubecl::{CubeElement, calculate_cube_count_elemwise};

    use crate::mask::HashedMask;

    /// One element of the mask per unit: `lowbias32(index · multiplier ⊕ offset)` against the
    /// threshold, as `mask_bits` on the host. `words` holds each row's multiplier and offset.
    #[cube(launch)]
    fn hashed_mask_kernel<F: Float>(
        words: &Array<u32>,
        mask: &mut Array<F>,
        per_row: u32,
        threshold: u32,
        kept: f32,
        #[define(F)] _dtype: StorageType,
    ) {
        let position = ABSOLUTE_POS;
        if position < mask.len() {
            let element = position as u32;
            let row = (element / per_row) as usize;
            let index = element % per_row;
            let keep = keeps(index, words[2 * row], words[2 * row + 1], threshold);
            mask[position] = F::cast_from(select(keep, kept, 0.0f32));
        }
    }

    /// Whether element `index` of a row with hash words `multiplier`, `offset` is kept:
    /// `lowbias32(index · multiplier ⊕ offset) ≥ threshold`, as `mask_bits` on the host.
    #[cube]
    pub(crate) fn keeps(index: u32, multiplier: u32, offset: u32, threshold: u32) -> bool {
        let mut x = (index * multiplier) ^ offset;
        x ^= x >> 16u32;
        x *= 0x7feb_352du32;
        x ^= x >> 15u32;
        x *= 0x846c_a68bu32;
        x ^= x >> 16u32;
        x >= threshold
    }

    /// The mask as a tensor of `B` when `B` is burn's fused cubecl backend over runtime `R`
    /// (bool element `BT`), as burn's CUDA and wgpu backends are by default.
    pub(super) fn fused<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
        mask: &HashedMask,
        dims: [usize; D],
        dtype: DType,
        device: &B::Device,
    ) -> Option<Tensor<B, D>> {
        if !is_fused::<B, R, BT>() || !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            return None;
        }
        let device = (device as &dyn Any).downcast_ref::<R::Device>()?;
        into_fused::<B, R, BT, D>(make::<R>(mask, Shape::from(dims.to_vec()), dtype, device)?)
    }

    /// The mask computed on `device` into a new contiguous tensor of `shape` in `dtype`, or
    /// `None` where it is empty, has more rows than `mask` has words, or an element index would
    /// not fit the kernel's 32 bits.
    fn make<R: CubeRuntime>(
        mask: &HashedMask,
        shape: Shape,
        dtype: DType,
        device: &R::Device,
    ) -> Option<CubeTensor<R>> {
        let elements = shape.num_elements();
        let rows = shape[0];
        if elements == 0 || mask.words().len() < rows {
            // Nothing to make, or rows the draw has no words for: the host path says so.
            return None;
        }
        let per_row = u32::try_from(elements / rows).ok()?;
        u32::try_from(elements).ok()?;
        let client = R::client(device);
        let output = client.empty(elements * dtype.size());
        let cube_dim = CubeDim::new(&client, elements);
        let cube_count = calculate_cube_count_elemwise(&client, elements, cube_dim);
        // SAFETY: the length is that of the buffer just allocated (one value per element).
        #[allow(unsafe_code)]
        let output_arg = unsafe { ArrayArg::from_raw_parts(output.clone(), elements) };
        hashed_mask_kernel::launch::<R>(
            &client,
            cube_count,
            cube_dim,
            upload_words(&client, mask, rows),
            output_arg,
            per_row,
            mask.threshold(),
            mask.kept(),
            dtype.into(),
        );
        Some(CubeTensor::new_contiguous(
            client,
            device.clone(),
            shape,
            output,
            dtype,
        ))
    }

    /// The first `rows` rows' hash words (multiplier, offset) on the device, as a kernel's
    /// `&Array<u32>` argument. `mask` has words for at least `rows` rows.
    pub(crate) fn upload_words<R: CubeRuntime>(
        client: &ComputeClient<R>,
        mask: &HashedMask,
        rows: usize,
    ) -> ArrayArg<R> {
        let words: Vec<u32> = mask
            .words()
            .iter()
            .take(rows)
            .flat_map(|&(multiplier, offset)| [multiplier, offset])
            .collect();
        let handle = client.create_from_slice(u32::as_bytes(&words));
        // SAFETY: the length is that of the buffer just made.
        #[allow(unsafe_code)]
        unsafe {
            ArrayArg::from_raw_parts(handle, words.len())
        }
    }
}
