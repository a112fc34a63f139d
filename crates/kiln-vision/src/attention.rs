//! The one attention function every tower uses: burn's fused `attention` (the backend's own
//! kernel: tiled on Flex, flash attention on the GPU backends), `softmax(q·kᵀ / √d)·v` per head.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;

/// Multi-head attention over `[batch, tokens, heads · head_dim]` projections: `query` of
/// `q_tokens`, `key` and `value` of `kv_tokens`; returns `[batch, q_tokens, heads · head_dim]`.
pub fn multi_head_attention<B: Backend>(
    query: Tensor<B, 3>,
    key: Tensor<B, 3>,
    value: Tensor<B, 3>,
    heads: usize,
) -> Tensor<B, 3> {
    let split = |x: Tensor<B, 3>| {
        let [batch, tokens, width] = x.dims();
        x.reshape([batch, tokens, heads, width / heads])
            .swap_dims(1, 2)
    };
    let [batch, tokens, width] = query.dims();
    attention(
        split(query),
        split(key),
        split(value),
        None,
        None,
        Default::default(),
    )
    .swap_dims(1, 2)
    .reshape([batch, tokens, width])
}
