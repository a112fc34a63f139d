//! Attention as a pass runs it: kiln's host kernel (with its backward in training on Flex), burn's
//! fused kernel or kiln's fused dropout kernel on GPUs, or the probabilities formed explicitly.

use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::{Tensor, TensorData};
use kiln_kernels::host::{self, Rows};
use kiln_kernels::{device_attention, host_op, host_ops_serve};

use super::Pass;
use crate::dropout::{Site, apply_mask};

impl Pass {
    /// Multi-head attention over `[batch, tokens, heads · head_dim]` projections: `query` of
    /// `q_tokens`, `key` and `value` of `kv_tokens`; returns `[batch, q_tokens, heads · head_dim]`.
    ///
    /// On host backends in f32, kiln's attention kernel ([`host::attention`]), with the
    /// probabilities' dropout mask when there is one; in training on Flex the same kernel with
    /// its backward, as one autodiff operation ([`host::AttentionOp`]). On burn's CUDA and wgpu
    /// backends, burn's fused kernel (flash attention) without dropout on the probabilities, and
    /// kiln's fused kernel with it (f32, bf16 or f16; `device_attention.rs`); elsewhere the probabilities are
    /// formed explicitly with the softmax in f32, then dropped.
    pub fn attention<B: Backend>(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        value: Tensor<B, 3>,
        heads: usize,
    ) -> Tensor<B, 3> {
        let [batch, tokens, width] = query.dims();
        if host::serves(&query) {
            let device = query.device();
            let [query, key, value] = [query, key, value].map(Tensor::into_data);
            let (query, key, value) = (Rows::of(&query), Rows::of(&key), Rows::of(&value));
            return self.host_attention(query, key, value, batch, heads, width, &device);
        }
        if [&query, &key, &value].iter().all(|x| host_ops_serve(*x)) {
            let kv_tokens = key.dims()[1];
            let mask = self.mask(Site::AttentionProbs, [batch, heads, tokens, kv_tokens]);
            let op = host::AttentionOp {
                mask: mask.map(|m| m.to_vec::<f32>().expect("dropout masks are f32").into()),
                products: self.prepared().products(),
                ..host::AttentionOp::new(batch, heads, width / heads, tokens, kv_tokens)
            };
            return host_op(op, [&query, &key, &value], [batch, tokens, width])
                .expect("host operations serve these tensors");
        }
        let attended = if let Some(hashed) = self.hashed_mask(Site::AttentionProbs) {
            if let Some(out) = device_attention::attention(&query, &key, &value, heads, &hashed) {
                return out;
            }
            let probs = self.attention_weights(query, key, heads);
            apply_mask(&hashed, probs).matmul(split_heads(value, heads))
        } else {
            let [query, key, value] = [query, key, value].map(|x| split_heads(x, heads));
            attention(query, key, value, None, None, Default::default())
        };
        attended.swap_dims(1, 2).reshape([batch, tokens, width])
    }

    /// The probabilities `softmax(q kᵀ / √head_dim)` of `heads` heads, `[batch, heads,
    /// q_tokens, kv_tokens]`, formed explicitly (softmax in f32 under the policy), without
    /// dropout: where the queries look.
    pub fn attention_weights<B: Backend>(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        heads: usize,
    ) -> Tensor<B, 4> {
        let scale = ((query.dims()[2] / heads) as f64).powf(-0.5);
        let scores = split_heads(query, heads).matmul(split_heads(key, heads).swap_dims(2, 3));
        (self.policy_on::<B>(&scores.device())).keep_f32(scores * scale, |s| softmax(s, 3))
    }

    /// Self-attention on a host backend over the f32 data `qkv` `[batch, tokens, 3 · width]`:
    /// the q, k and v projections side by side in each row, as one product leaves them.
    pub fn attention_side_by_side<B: Backend>(
        &self,
        qkv: TensorData,
        heads: usize,
        device: &B::Device,
    ) -> Tensor<B, 3> {
        let [batch, _, columns] = qkv.shape[..] else {
            panic!("q, k and v side by side are [batch, tokens, 3 · width]");
        };
        let part = |offset| Rows {
            offset,
            ..Rows::of(&qkv)
        };
        let width = columns / 3;
        self.host_attention(
            part(0),
            part(width),
            part(2 * width),
            batch,
            heads,
            width,
            device,
        )
    }

    /// [`host::attention`] of `heads` heads over `width` columns with this pass's probability
    /// dropout, as a `[batch, q_tokens, width]` tensor.
    #[allow(clippy::too_many_arguments)]
    fn host_attention<B: Backend>(
        &self,
        query: Rows,
        key: Rows,
        value: Rows,
        batch: usize,
        heads: usize,
        width: usize,
        device: &B::Device,
    ) -> Tensor<B, 3> {
        let head_dim = width / heads;
        // The kernel forms each probability's multiplier as it normalises the row.
        let mask = self.hashed_mask(Site::AttentionProbs);
        let mask = mask.as_ref().map(host::ProbsDropout::Hashed);
        let scale = (head_dim as f64).powf(-0.5) as f32;
        let shape = host::Heads::all(heads, head_dim);
        let products = self.prepared().products();
        let out = host::attention(query, key, value, batch, shape, scale, mask, products);
        Tensor::from_data(TensorData::new(out, [batch, query.tokens, width]), device)
    }
}

/// `[batch, tokens, heads · head_dim]` → `[batch, heads, tokens, head_dim]`.
fn split_heads<B: Backend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [batch, tokens, width] = x.dims();
    x.reshape([batch, tokens, heads, width / heads])
        .swap_dims(1, 2)
}

#[cfg(test)]
mod tests {
    use kiln_kernels::gemm::Products;
    use kiln_kernels::{HashedMask, dropout_mask};

    use super::*;
    use crate::Draw;

    /// The attention kernel forming the probabilities' multipliers from the hash gives exactly
    /// what multiplying by the materialised mask gives (two images of two heads, tiles of 96
    /// query rows and a partial one).
    #[test]
    fn attention_with_hashed_dropout_equals_the_materialised_mask() {
        let (batch, heads, head_dim, tokens) = (2, 2, 4, 100);
        let width = heads * head_dim;
        let values: Vec<f32> = (0..batch * tokens * width)
            .map(|i| (i * 37 % 101) as f32 / 50.0 - 1.0)
            .collect();
        let rows = || Rows::new(&values, width, tokens);
        let keys = Draw::pass(3, 1, [7, 8]).row_keys();
        let hashed = HashedMask::new(&keys, 2, 0.3);
        let multipliers = dropout_mask(&hashed, [batch, heads, tokens, tokens])
            .to_vec::<f32>()
            .unwrap();
        let attend = |mask| {
            host::attention(
                rows(),
                rows(),
                rows(),
                batch,
                host::Heads::all(heads, head_dim),
                0.5,
                mask,
                Products::F32,
            )
        };
        let fused = attend(Some(host::ProbsDropout::Hashed(&hashed)));
        let materialised = attend(Some(host::ProbsDropout::Multipliers(&multipliers)));
        assert_eq!(fused, materialised);
        assert_ne!(fused, attend(None));
    }
}
