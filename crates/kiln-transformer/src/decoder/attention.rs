//! Causal grouped-query self-attention with rotary position embeddings and a key/value cache
//! (transformers' `LlamaAttention`; field names mirror `model.layers.N.self_attn`), with Gemma 3's
//! RMSNorm of each query and key head before the rotation where the model has one (`q_norm`,
//! `k_norm`).

use std::sync::Arc;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::Tensor;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use kiln_kernels::host::{self, AttentionOp, Heads, RotaryAngles, Rows};
use kiln_kernels::rotary::{self, Angles, Turn};
use kiln_kernels::{HostValues, host_op};

use super::cache::LayerCache;
use super::rope::Rope;
use super::{HostBuffers, HostContext, sized};
use crate::Pass;
use crate::prepared::HostWeight;
use crate::projection::{Then, add_product, product_rows_into, project};

/// Grouped-query self-attention: `heads` query heads sharing `kv_heads` key/value heads, each
/// serving `heads / kv_heads` of them.
#[derive(Module, Debug)]
pub struct GroupedQueryAttention<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    o_proj: Linear<B>,
    /// Each query head's RMSNorm before the rotation (Gemma 3), over `head_dim`.
    pub(crate) q_norm: Option<RmsNorm<B>>,
    /// Each key head's RMSNorm before the rotation (Gemma 3).
    pub(crate) k_norm: Option<RmsNorm<B>>,
    #[module(skip)]
    heads: usize,
    #[module(skip)]
    kv_heads: usize,
}

/// The shape of a [`GroupedQueryAttention`].
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// The epsilon of an RMSNorm of each query and key head before the rotation (Gemma 3's
    /// `q_norm`, `k_norm`); none without.
    pub head_norm_eps: Option<f64>,
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
            q_norm: shape
                .head_norm_eps
                .map(|eps| head_norm(shape.head_dim, eps, device)),
            k_norm: shape
                .head_norm_eps
                .map(|eps| head_norm(shape.head_dim, eps, device)),
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
        post: Option<&RmsNorm<B>>,
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let [batch, tokens, _] = normed.dims();
        let [query, key, mut value] = [&self.q_proj, &self.k_proj, &self.v_proj]
            .map(|linear| project(linear, normed.clone(), Then::Nothing, pass));
        let width = query.dims()[2];
        let head_dim = width / self.heads;
        let query = norm_heads(&self.q_norm, query, head_dim, pass);
        let mut key = norm_heads(&self.k_norm, key, head_dim, pass);
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
        add_output(&self.o_proj, attended, residual, post, pass)
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
        post: Option<&RmsNorm<B>>,
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let [batch, tokens, _] = normed.dims();
        let project_heads = |linear: &Linear<B>, count: usize| {
            let y = project(linear, normed.clone(), Then::Nothing, pass);
            let width = y.dims()[2];
            y.reshape([batch, tokens, count, width / count])
                .swap_dims(1, 2)
        };
        let heads_normed = |norm: &Option<RmsNorm<B>>, x: Tensor<B, 4>| match norm {
            Some(norm) => pass.rms_norm(norm, x),
            None => x,
        };
        let query = heads_normed(&self.q_norm, project_heads(&self.q_proj, self.heads));
        let key = heads_normed(&self.k_norm, project_heads(&self.k_proj, self.kv_heads));
        let query = Rope::apply(query, cos, sin);
        let key = Rope::apply(key, cos, sin);
        let value = project_heads(&self.v_proj, self.kv_heads);
        let (key, value) = cache.append(key, value);
        let attended = grouped_attention(query, key, value, bias.clone(), pass);
        let [_, heads, _, head_dim] = attended.dims();
        let attended = attended
            .swap_dims(1, 2)
            .reshape([batch, tokens, heads * head_dim]);
        add_output(&self.o_proj, attended, residual, post, pass)
    }

    /// `residual += o_proj(attention(buffers.normed))` on the host kernels (f32 on Flex or
    /// NdArray): q, k and v from one product, rotated in place, the keys and values appended to
    /// the host cache, then kiln's causal grouped-query attention kernel.
    pub(super) fn add_on_host(
        &self,
        residual: &mut [f32],
        [batch, tokens, hidden]: [usize; 3],
        (context, cache): (&HostContext, &mut LayerCache<B>),
        post: Option<&RmsNorm<B>>,
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
        for (norm, offset, width) in [
            (&self.q_norm, 0, q_width),
            (&self.k_norm, q_width, kv_width),
        ] {
            if let Some(norm) = norm {
                norm_heads_on_host(
                    qkv,
                    columns,
                    offset..offset + width,
                    norm,
                    &mut buffers.normed_heads,
                );
            }
        }
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
        let o_proj = pass.prepared().linear(&self.o_proj, None);
        let scratch = (&mut buffers.post, &mut buffers.normed_heads);
        add_output_on_host(residual, attended, q_width, &o_proj, post, scratch);
    }
}

/// A head's RMSNorm over `head_dim` columns.
fn head_norm<B: Backend>(head_dim: usize, eps: f64, device: &B::Device) -> RmsNorm<B> {
    RmsNormConfig::new(head_dim).with_epsilon(eps).init(device)
}

/// `x` `[batch, tokens, heads · head_dim]` with each head normalised by `norm` (none: as it is).
fn norm_heads<B: Backend>(
    norm: &Option<RmsNorm<B>>,
    x: Tensor<B, 3>,
    head_dim: usize,
    pass: &Pass,
) -> Tensor<B, 3> {
    let Some(norm) = norm else { return x };
    let [batch, tokens, width] = x.dims();
    let heads = x.reshape([batch, tokens, width / head_dim, head_dim]);
    pass.rms_norm(norm, heads).reshape([batch, tokens, width])
}

/// Each head of the `columns` of every row of `qkv` normalised in place by `norm`.
fn norm_heads_on_host<B: Backend>(
    qkv: &mut [f32],
    width: usize,
    columns: std::ops::Range<usize>,
    norm: &RmsNorm<B>,
    scratch: &mut Vec<f32>,
) {
    let weight = HostValues::of(&norm.gamma.val());
    let span = columns.len();
    let out = sized(scratch, span);
    for row in qkv.chunks_mut(width) {
        let heads = &mut row[columns.clone()];
        host::rms_norm_into(out, heads, weight.values(), norm.epsilon as f32);
        heads.copy_from_slice(out);
    }
}

/// `residual += x · weight` (rows of `inputs` values), or `residual += post(x · weight)` (Gemma
/// 3's norm after a block), the product and its norm in `scratch`'s buffers.
pub(super) fn add_output_on_host<B: Backend>(
    residual: &mut [f32],
    x: &[f32],
    inputs: usize,
    weight: &HostWeight,
    post: Option<&RmsNorm<B>>,
    (out, normed): (&mut Vec<f32>, &mut Vec<f32>),
) {
    let Some(post) = post else {
        return add_product(residual, x, inputs, weight);
    };
    let out = sized(out, residual.len());
    product_rows_into(out, x, inputs, weight, |v| v);
    let gamma = HostValues::of(&post.gamma.val());
    let normed = sized(normed, out.len());
    host::rms_norm_into(normed, out, gamma.values(), post.epsilon as f32);
    for (sum, value) in residual.iter_mut().zip(normed.iter()) {
        *sum += value;
    }
}

/// `residual + linear(x)`, or `residual + post(linear(x))` (Gemma 3's norm after a block).
pub(super) fn add_output<B: Backend>(
    linear: &Linear<B>,
    x: Tensor<B, 3>,
    residual: Tensor<B, 3>,
    post: Option<&RmsNorm<B>>,
    pass: &Pass,
) -> Tensor<B, 3> {
    match post {
        None => {
            let then = Then::AddTo {
                residual,
                scale: None,
            };
            project(linear, x, then, pass)
        }
        Some(post) => residual + pass.rms_norm(post, project(linear, x, Then::Nothing, pass)),
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
