//! Causal grouped-query self-attention with rotary position embeddings and a key/value cache
//! (transformers' `LlamaAttention`; field names mirror `model.layers.N.self_attn`).

use std::sync::Arc;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use kiln_kernels::host::{self, AttentionOp, Heads, RotaryAngles, Rows};
use kiln_kernels::host_op;
use kiln_kernels::rotary::{self, Angles, Turn};

use super::cache::LayerCache;
use super::rope::Rope;
use super::{HostBuffers, HostContext, sized};
use crate::Pass;
use crate::projection::{Then, add_product, product_rows_into, project};

/// Grouped-query self-attention: `heads` query heads sharing `kv_heads` key/value heads, each
/// serving `heads / kv_heads` of them.
#[derive(Module, Debug)]
pub struct GroupedQueryAttention<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    o_proj: Linear<B>,
    #[module(skip)]
    heads: usize,
    #[module(skip)]
    kv_heads: usize,
}

/// The shape of a [`GroupedQueryAttention`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// The residual stream's width.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key and value heads (`heads` for multi-head attention).
    pub kv_heads: usize,
    /// Columns per head.
    pub head_dim: usize,
    /// Biases on q, k and v (Qwen2).
    pub qkv_bias: bool,
    /// A bias on the output projection.
    pub output_bias: bool,
}

impl<B: Backend> GroupedQueryAttention<B> {
    /// Randomly initialised weights of `shape`.
    pub fn init(shape: AttentionShape, device: &B::Device) -> Self {
        let linear = |inputs, outputs, bias| {
            LinearConfig::new(inputs, outputs)
                .with_bias(bias)
                .init(device)
        };
        let q_width = shape.heads * shape.head_dim;
        let kv_width = shape.kv_heads * shape.head_dim;
        GroupedQueryAttention {
            q_proj: linear(shape.hidden, q_width, shape.qkv_bias),
            k_proj: linear(shape.hidden, kv_width, shape.qkv_bias),
            v_proj: linear(shape.hidden, kv_width, shape.qkv_bias),
            o_proj: linear(q_width, shape.hidden, shape.output_bias),
            heads: shape.heads,
            kv_heads: shape.kv_heads,
        }
    }

    /// `residual + o_proj(attention(normed))` in training on Flex: the projections and
    /// [`AttentionOp`] each one autodiff operation, the heads never split or merged by copies;
    /// after the keys and values of the prefix `cache` shares, when it does (constants: no
    /// gradient reaches them).
    pub(super) fn add_trained(
        &self,
        normed: Tensor<B, 3>,
        residual: Tensor<B, 3>,
        (rotary, real_keys): (&RotaryAngles, &Option<Arc<[bool]>>),
        cache: &LayerCache<B>,
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let [batch, tokens, _] = normed.dims();
        let [query, mut key, mut value] = [&self.q_proj, &self.k_proj, &self.v_proj]
            .map(|linear| project(linear, normed.clone(), Then::Nothing, pass));
        let width = query.dims()[2];
        let head_dim = width / self.heads;
        let mut past = 0;
        if let Some((shared_keys, shared_values)) = cache.shared_rows(batch, &normed.device()) {
            past = shared_keys.dims()[1];
            key = Tensor::cat(vec![shared_keys, key], 1);
            value = Tensor::cat(vec![shared_values, value], 1);
        }
        let op = AttentionOp {
            kv_heads: self.kv_heads,
            causal: true,
            past,
            real_keys: real_keys.clone(),
            rotary: Some(rotary.clone()),
            products: pass.prepared().products(),
            ..AttentionOp::new(batch, self.heads, head_dim, tokens, past + tokens)
        };
        let attended = host_op(op, [&query, &key, &value], [batch, tokens, width])
            .expect("host operations serve training on Flex in f32");
        let then = Then::AddTo {
            residual,
            scale: None,
        };
        project(&self.o_proj, attended, then, pass)
    }

    /// `residual + o_proj(attention(normed))` through burn's operations; appends this step's
    /// keys and values to `cache`. `cos` and `sin` are `[batch, 1, new, head_dim]`, `bias` the
    /// additive mask `[batch, 1, new, past + new]`.
    pub(super) fn add_by_tensors(
        &self,
        normed: Tensor<B, 3>,
        residual: Tensor<B, 3>,
        (cos, sin, bias): (&Tensor<B, 4>, &Tensor<B, 4>, &Tensor<B, 4>),
        cache: &mut LayerCache<B>,
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let [batch, tokens, _] = normed.dims();
        let project_heads = |linear: &Linear<B>, count: usize| {
            let y = project(linear, normed.clone(), Then::Nothing, pass);
            let width = y.dims()[2];
            y.reshape([batch, tokens, count, width / count])
                .swap_dims(1, 2)
        };
        let query = Rope::apply(project_heads(&self.q_proj, self.heads), cos, sin);
        let key = Rope::apply(project_heads(&self.k_proj, self.kv_heads), cos, sin);
        let value = project_heads(&self.v_proj, self.kv_heads);
        let (key, value) = cache.append(key, value);
        let attended = grouped_attention(query, key, value, bias.clone(), pass);
        let [_, heads, _, head_dim] = attended.dims();
        let attended = attended
            .swap_dims(1, 2)
            .reshape([batch, tokens, heads * head_dim]);
        let then = Then::AddTo {
            residual,
            scale: None,
        };
        project(&self.o_proj, attended, then, pass)
    }

    /// `residual += o_proj(attention(buffers.normed))` on the host kernels (f32 on Flex or
    /// NdArray): q, k and v from one product, rotated in place, the keys and values appended to
    /// the host cache, then kiln's causal grouped-query attention kernel.
    pub(super) fn add_on_host(
        &self,
        residual: &mut [f32],
        [batch, tokens, hidden]: [usize; 3],
        context: &HostContext,
        cache: &mut LayerCache<B>,
        pass: &Pass,
        buffers: &mut HostBuffers,
    ) {
        let HostContext {
            cos,
            sin,
            real_keys,
            past,
        } = context;
        let rows = batch * tokens;
        let weight = pass
            .prepared()
            .side_by_side(&[&self.q_proj, &self.k_proj, &self.v_proj]);
        let columns = weight.columns();
        let qkv = sized(&mut buffers.qkv, rows * columns);
        product_rows_into(qkv, &buffers.normed, hidden, &weight, |v| v);
        let head_dim = cos.len() / rows.max(1);
        let (q_width, kv_width) = (self.heads * head_dim, self.kv_heads * head_dim);
        let angles = Angles { cos, sin };
        rotary::rotate_rows(
            qkv,
            columns,
            0,
            self.heads + self.kv_heads,
            angles,
            Turn::Forward,
        );
        let kept = cache.append_host(
            qkv,
            columns,
            q_width,
            q_width + kv_width,
            kv_width,
            batch,
            *past,
        );
        // The keys and values so far, or (nothing kept) the new ones where the product left them.
        let (keys, values) = match kept {
            Some(kept) => kept,
            None => (
                Rows {
                    offset: q_width,
                    ..Rows::new(qkv, columns, tokens)
                },
                Rows {
                    offset: q_width + kv_width,
                    ..Rows::new(qkv, columns, tokens)
                },
            ),
        };
        let shape = Heads {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim,
            causal_past: Some(*past),
            real_keys: real_keys.as_deref(),
        };
        let scale = (head_dim as f64).powf(-0.5) as f32;
        let attended = sized(&mut buffers.attended, rows * q_width);
        host::attention_into(
            attended,
            Rows::new(qkv, columns, tokens),
            keys,
            values,
            batch,
            shape,
            scale,
            None,
            pass.prepared().products(),
        );
        add_product(
            residual,
            attended,
            q_width,
            &pass.prepared().linear(&self.o_proj, None),
        );
    }
}

/// `softmax(q kᵀ / √d + bias) v` per head, each key/value head serving `heads / kv_heads` query
/// heads; the scores' softmax in f32 whatever the compute dtype.
fn grouped_attention<B: Backend>(
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    value: Tensor<B, 4>,
    bias: Tensor<B, 4>,
    pass: &Pass,
) -> Tensor<B, 4> {
    let [batch, heads, _, head_dim] = query.dims();
    let [_, kv_heads, kv_tokens, _] = key.dims();
    let repeat = |x: Tensor<B, 4>| {
        if kv_heads == heads {
            return x;
        }
        x.unsqueeze_dim::<5>(2)
            .repeat_dim(2, heads / kv_heads)
            .reshape([batch, heads, kv_tokens, head_dim])
    };
    let scores = query.matmul(repeat(key).swap_dims(2, 3)) * (head_dim as f64).powf(-0.5);
    let probs = pass
        .policy_on::<B>(&scores.device())
        .keep_f32(scores, |scores| softmax(scores + bias, 3));
    probs.matmul(repeat(value))
}
