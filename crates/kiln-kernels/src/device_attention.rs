//! Attention with dropout on its probabilities as one kernel on burn's CUDA and wgpu backends:
//! scores, softmax, the hashed dropout mask and the product with the values, with no
//! `[batch, heads, q_tokens, kv_tokens]` tensor in memory. burn's fused attention has no
//! dropout; without this kernel a Monte-Carlo pass forms the probabilities, their mask and the
//! masked probabilities as tensors, and multiplies them with the values.
//!
//! One cube per (query tile, head, batch row); each unit owns one query row and keeps its
//! output row in registers, the cube loads keys and values a tile at a time into shared memory,
//! and the softmax runs online (a running maximum rescales the running sums, as flash attention
//! does). The dropped probabilities are those of [`mask_bits`](crate::mask) over the
//! `[batch, heads, q_tokens, kv_tokens]` tensor: the same bits as the host kernel and the
//! device masks.

use std::cell::Cell;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::mask::HashedMask;

thread_local! {
    static LAUNCHES: Cell<u64> = const { Cell::new(0) };
}

/// How many attentions with probability dropout this thread has run as kiln's fused kernel (a
/// diagnostic: tests show with it that Monte-Carlo passes on burn's CUDA and wgpu backends take
/// the kernel).
pub fn fused_attention_launches() -> u64 {
    LAUNCHES.with(Cell::get)
}

/// `softmax(q kᵀ / √head_dim)` with `mask`'s dropout, times `v`, over `[batch, tokens, heads ·
/// head_dim]` projections, as `[batch, q_tokens, heads · head_dim]`, where `B` is burn's CUDA
/// or wgpu backend (as compiled in) and the inputs share one float dtype (f32, bf16 or f16: read
/// into f32, the softmax and sums in f32, the output in their dtype); else `None`.
#[allow(unused_variables)]
pub fn attention<B: Backend>(
    query: &Tensor<B, 3>,
    key: &Tensor<B, 3>,
    value: &Tensor<B, 3>,
    heads: usize,
    mask: &HashedMask,
) -> Option<Tensor<B, 3>> {
    #[cfg(feature = "cuda")]
    if let Some(out) =
        cube::attention::<B, cubecl::cuda::CudaRuntime, u8>(query, key, value, heads, mask)
    {
        return Some(out);
    }
    #[cfg(feature = "wgpu")]
    if let Some(out) =
        cube::attention::<B, cubecl::wgpu::WgpuRuntime, u32>(query, key, value, heads, mask)
    {
        return Some(out);
    }
    None
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube {
    use crate::cube::{float_input, into_fused, is_fused};
    use burn::tensor::backend::Backend;
    use burn::tensor::{DType, Shape, Tensor};
    use burn_cubecl::tensor::CubeTensor;
    use burn_cubecl::{BoolElement, CubeRuntime};
    use cubecl::prelude::{CubeCount, CubeDim};

    use super::LAUNCHES;
    use crate::device_mask::upload_words;
    use crate::mask::HashedMask;

    /// Query rows per cube, and keys per shared-memory tile.
    const TILE: usize = 32;
    /// The widest head the kernel keeps in registers.
    const MAX_HEAD_DIM: usize = 128;

    mod kernel {
        use cubecl::prelude::*;

        use crate::device_mask::keeps;

        /// One query row per unit; keys and values a tile at a time through shared memory.
        #[cube(launch)]
        #[allow(clippy::too_many_arguments)]
        pub(super) fn attention_dropout_kernel<F: Float>(
            query: &Tensor<F>,
            key: &Tensor<F>,
            value: &Tensor<F>,
            words: &Array<u32>,
            output: &mut Tensor<F>,
            scale: f32,
            threshold: u32,
            kept: f32,
            #[comptime] head_dim: usize,
            #[comptime] tile: usize,
            #[define(F)] _dtype: StorageType,
        ) {
            let q_tokens = query.shape(1);
            let kv_tokens = key.shape(1);
            let batch_row = CUBE_POS_Z as usize;
            let head = CUBE_POS_Y as usize;
            let unit = UNIT_POS_X as usize;
            let row = CUBE_POS_X as usize * tile + unit;
            let active = row < q_tokens;
            let first_column = head * head_dim;

            let mut q = Array::<f32>::new(head_dim);
            let mut out = Array::<f32>::new(head_dim);
            let q_row = select(active, row, 0);
            let q_at = batch_row * query.stride(0) + q_row * query.stride(1);
            #[unroll]
            for c in 0..head_dim {
                q[c] = f32::cast_from(query[q_at + (first_column + c) * query.stride(2)]) * scale;
                out[c] = 0.0f32;
            }
            let mut keys = SharedMemory::<f32>::new(tile * head_dim);
            let mut values = SharedMemory::<f32>::new(tile * head_dim);
            let mut running_max = f32::min_value();
            let mut running_sum = 0.0f32;
            let multiplier = words[2 * batch_row];
            let offset = words[2 * batch_row + 1];
            // Element (head, row, 0) of this batch row's [heads, q_tokens, kv_tokens] mask.
            let first_element = ((head * q_tokens + q_row) * kv_tokens) as u32;

            let tiles = kv_tokens.div_ceil(tile);
            for t in 0..tiles {
                let start = t * tile;
                let loaded = start + unit;
                if loaded < kv_tokens {
                    let k_at = batch_row * key.stride(0) + loaded * key.stride(1);
                    let v_at = batch_row * value.stride(0) + loaded * value.stride(1);
                    #[unroll]
                    for c in 0..head_dim {
                        keys[unit * head_dim + c] =
                            f32::cast_from(key[k_at + (first_column + c) * key.stride(2)]);
                        values[unit * head_dim + c] =
                            f32::cast_from(value[v_at + (first_column + c) * value.stride(2)]);
                    }
                }
                sync_cube();
                if active {
                    for j in 0..tile {
                        let k_token = start + j;
                        if k_token < kv_tokens {
                            let mut score = 0.0f32;
                            #[unroll]
                            for c in 0..head_dim {
                                score += q[c] * keys[j * head_dim + c];
                            }
                            if score > running_max {
                                let rescale = (running_max - score).exp();
                                running_sum *= rescale;
                                #[unroll]
                                for c in 0..head_dim {
                                    out[c] *= rescale;
                                }
                                running_max = score;
                            }
                            let weight = (score - running_max).exp();
                            running_sum += weight;
                            let element = first_element + k_token as u32;
                            if keeps(element, multiplier, offset, threshold) {
                                let kept_weight = weight * kept;
                                #[unroll]
                                for c in 0..head_dim {
                                    out[c] += kept_weight * values[j * head_dim + c];
                                }
                            }
                        }
                    }
                }
                sync_cube();
            }
            if active {
                let out_at = batch_row * output.stride(0) + row * output.stride(1);
                let normaliser = 1.0f32 / running_sum;
                #[unroll]
                for c in 0..head_dim {
                    output[out_at + (first_column + c) * output.stride(2)] =
                        F::cast_from(out[c] * normaliser);
                }
            }
        }
    }

    pub(super) fn attention<B: Backend, R: CubeRuntime, BT: BoolElement>(
        query: &Tensor<B, 3>,
        key: &Tensor<B, 3>,
        value: &Tensor<B, 3>,
        heads: usize,
        mask: &HashedMask,
    ) -> Option<Tensor<B, 3>> {
        let [batch, q_tokens, width] = query.dims();
        let [_, kv_tokens, _] = key.dims();
        let head_dim = width / heads;
        let dtype = query.dtype();
        let served = is_fused::<B, R, BT>()
            && matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
            && [key, value].iter().all(|x| x.dtype() == dtype)
            && head_dim * heads == width
            && (1..=MAX_HEAD_DIM).contains(&head_dim)
            && batch * q_tokens * kv_tokens > 0
            && mask.words().len() >= batch
            // Element indices within a batch row are 32-bit, as the host's.
            && u32::try_from(heads * q_tokens * kv_tokens).is_ok();
        if !served {
            return None;
        }
        let [query, key, value] =
            [query, key, value].map(|x| float_input::<B, R, BT, 3>(x.clone()));
        let (query, key, value) = (query?, key?, value?);
        let client = query.client.clone();
        let handle = client.empty(batch * q_tokens * width * dtype.size());
        let output = CubeTensor::new_contiguous(
            client.clone(),
            query.device.clone(),
            Shape::new([batch, q_tokens, width]),
            handle,
            dtype,
        );
        let cube_count =
            CubeCount::new_3d(q_tokens.div_ceil(TILE) as u32, heads as u32, batch as u32);
        kernel::attention_dropout_kernel::launch::<R>(
            &client,
            cube_count,
            CubeDim::new_1d(TILE as u32),
            query.into_tensor_arg(),
            key.into_tensor_arg(),
            value.into_tensor_arg(),
            upload_words(&client, mask, batch),
            output.clone().into_tensor_arg(),
            // As the host kernel scales.
            (head_dim as f64).powf(-0.5) as f32,
            mask.threshold(),
            mask.kept(),
            head_dim,
            TILE,
            dtype.into(),
        );
        LAUNCHES.with(|launches| launches.set(launches.get() + 1));
        into_fused::<B, R, BT, 3>(output)
    }
}
