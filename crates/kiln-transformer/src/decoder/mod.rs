//! The layers of decoder-only language models of the Llama family (Llama, Qwen2, and those built
//! the same way): pre-RMSNorm residual blocks of causal grouped-query attention with rotary
//! position embeddings and a key/value cache ([`GroupedQueryAttention`], [`KvCache`], [`Rope`]),
//! and of a SwiGLU MLP ([`SwiGlu`]). A model writes each layer once:
//!
//! ```
//! use burn::backend::Flex;
//! use burn::module::Module;
//! use burn::nn::{RmsNorm, RmsNormConfig};
//! use burn::tensor::Tensor;
//! use burn::tensor::backend::Backend;
//! use kiln_transformer::decoder::{
//!     AttentionShape, DecoderStep, GroupedQueryAttention, KvCache, LayerCache, NewTokens, Rope,
//!     SwiGlu,
//! };
//! use kiln_transformer::{Pass, PreparedWeights, Settings};
//!
//! #[derive(Module, Debug)]
//! struct Layer<B: Backend> {
//!     input_layernorm: RmsNorm<B>,
//!     self_attn: GroupedQueryAttention<B>,
//!     post_attention_layernorm: RmsNorm<B>,
//!     mlp: SwiGlu<B>,
//! }
//!
//! impl<B: Backend> Layer<B> {
//!     fn forward(&self, x: Tensor<B, 3>, step: &mut DecoderStep<B>, cache: &mut LayerCache<B>,
//!                pass: &Pass) -> Tensor<B, 3> {
//!         step.residual(x)
//!             .add_attention(&self.input_layernorm, &self.self_attn, cache, pass)
//!             .add_mlp(&self.post_attention_layernorm, &self.mlp, pass)
//!             .into_tensor()
//!     }
//! }
//!
//! let device = Default::default();
//! let shape = AttentionShape {
//!     hidden: 16, heads: 4, kv_heads: 2, head_dim: 4, qkv_bias: false, output_bias: false,
//!     head_norm_eps: None,
//! };
//! let layer = Layer::<Flex> {
//!     input_layernorm: RmsNormConfig::new(16).init(&device),
//!     self_attn: GroupedQueryAttention::init(shape, &device),
//!     post_attention_layernorm: RmsNormConfig::new(16).init(&device),
//!     mlp: SwiGlu::init(16, 32, false, &device),
//! };
//! let pass = Pass::new(&Settings::default(), &PreparedWeights::default(), None);
//! let mut cache = KvCache::new();
//! let new = NewTokens { batch: 2, tokens: 5, attention_mask: None, position_ids: None };
//! let positions = cache.extend(new, 64)?;
//! let x = Tensor::<Flex, 3>::ones([2, 5, 16], &device);
//! let mut step = DecoderStep::new(&x, &positions, &Rope::new(4, 10_000.0, 1.0), &cache, &pass);
//! let layer_cache = cache.layers(1).next().unwrap();
//! let y = layer.forward(x, &mut step, layer_cache, &pass);
//! assert_eq!(y.dims(), [2, 5, 16]);
//! # Ok::<(), kiln_transformer::decoder::TokensError>(())
//! ```
//!
//! [`DecoderStep`] chooses how the layers run, once per forward: f32 on a host backend (Flex,
//! NdArray) on kiln's host kernels, the residual stream updated in place and the working buffers
//! reused by every layer; training on Flex in f32 (whole sequences, or after a
//! [`SharedPrefix`], no cache kept) through burn's operations with attention as one autodiff
//! operation ([`AttentionOp`](kiln_kernels::host::AttentionOp)); and elsewhere (GPUs, half precision) through burn's operations.

mod attention;
mod cache;
mod mlp;
mod rope;

use std::sync::Arc;

use burn::nn::RmsNorm;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln_kernels::host::{self, RotaryAngles};
use kiln_kernels::{HostValues, host_ops_serve};

use crate::Pass;

pub use attention::{AttentionShape, GroupedQueryAttention};
pub use cache::{KvCache, LayerCache, NewTokens, Positions, SharedPrefix, TokensError};
pub use mlp::{Gate, SwiGlu};
pub use rope::Rope;

/// How one forward over new tokens runs its decoder layers, chosen once from its input and
/// cache, with the host path's working buffers that every layer reuses.
pub struct DecoderStep<B: Backend> {
    context: Context<B>,
    buffers: HostBuffers,
}

/// What one layer's attention sees besides its input: the new tokens' rotary angles and which
/// keys each may attend to, as the host kernels or burn's operations take them.
enum Context<B: Backend> {
    /// f32 on Flex or NdArray.
    Host(HostContext),
    /// Training on Flex in f32 (`Autodiff<Flex>`), whole sequences after a shared prefix or
    /// none: burn's operations, but attention (the rotation, grouped heads, causal and padding
    /// masks) as one autodiff operation.
    Trained {
        rotary: RotaryAngles,
        real_keys: Option<Arc<[bool]>>,
    },
    /// `cos` and `sin` `[batch, 1, new, head_dim]` and the additive mask `[batch, 1, new, past
    /// + new]` (0 where a query may look, the most negative f32 where it may not).
    Tensors {
        cos: Tensor<B, 4>,
        sin: Tensor<B, 4>,
        bias: Tensor<B, 4>,
    },
}

/// The host kernels' context: row-major `cos` and `sin` `[batch · new, head_dim]`, each
/// sequence's real keys `[batch · (past + new)]` (`None`: no padding) and the count of tokens
/// before the new ones.
struct HostContext {
    cos: Vec<f32>,
    sin: Vec<f32>,
    real_keys: Option<Vec<bool>>,
    past: usize,
}

/// The host path's working buffers, reused by every layer of a forward pass: allocated afresh
/// per layer, an 8 × 512-token batch's 10–16 MB buffers had their pages faulted in and cleared
/// by the kernel each time (docs/PERFORMANCE.md).
#[derive(Default)]
struct HostBuffers {
    /// A norm's output `[rows, hidden]`.
    normed: Vec<f32>,
    /// q, k and v side by side `[rows, (heads + 2 · kv_heads) · head_dim]`.
    qkv: Vec<f32>,
    /// Attention's output, heads merged `[rows, heads · head_dim]`.
    attended: Vec<f32>,
    /// One MLP block's gate and up side by side `[≤ MLP_ROWS, 2 · intermediate]`.
    gate_up: Vec<f32>,
    /// One MLP block's `silu(gate) ⊙ up` `[≤ MLP_ROWS, intermediate]`.
    activated: Vec<f32>,
    /// A block's output before its norm after the block (Gemma 3).
    post: Vec<f32>,
    /// Normalised heads, or a block's output normalised (Gemma 3).
    normed_heads: Vec<f32>,
}

/// `buffer` holding `len` values, for a kernel that overwrites them all (only growth is zeroed).
fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buffer.resize(len, 0.0);
    buffer
}

impl<B: Backend> DecoderStep<B> {
    /// How a forward over the new tokens' embeddings `x` `[batch, new, hidden]` at `positions`
    /// (from [`KvCache::extend`]) runs, rotated by `rope`, appending to `cache`.
    pub fn new(
        x: &Tensor<B, 3>,
        positions: &Positions,
        rope: &Rope,
        cache: &KvCache<B>,
        pass: &Pass,
    ) -> Self {
        let context = if host::serves(x) {
            let (cos, sin) = rope.table(&positions.ids);
            Context::Host(HostContext {
                cos,
                sin,
                real_keys: positions.real_keys(),
                past: positions.past,
            })
        } else if host_ops_serve(x) && !cache.keeps() {
            let (cos, sin) = rope.table(&positions.ids);
            Context::Trained {
                rotary: RotaryAngles {
                    cos: cos.into(),
                    sin: sin.into(),
                },
                real_keys: positions.real_keys().map(Into::into),
            }
        } else {
            let device = x.device();
            let (cos, sin) = rope.angles::<B>(&positions.ids, &device);
            Context::Tensors {
                cos: pass.input(cos),
                sin: pass.input(sin),
                bias: positions.bias(&device),
            }
        };
        DecoderStep {
            context,
            buffers: HostBuffers::default(),
        }
    }

    /// A layer's residual stream, starting from its input `x` `[batch, new, hidden]`.
    pub fn residual(&mut self, x: Tensor<B, 3>) -> Residual<'_, B> {
        let stream = match self.context {
            Context::Host(_) => Stream::Host {
                dims: x.dims(),
                device: x.device(),
                data: x.into_data(),
            },
            _ => Stream::Tensor(x),
        };
        Residual { step: self, stream }
    }
}

/// One layer's residual stream, onto which pre-norm blocks add their outputs: `x + block(norm
/// x)`.
pub struct Residual<'a, B: Backend> {
    step: &'a mut DecoderStep<B>,
    stream: Stream<B>,
}

/// The stream as the forward's execution holds it.
enum Stream<B: Backend> {
    /// Row-major f32 values, updated in place by the host kernels.
    Host {
        data: TensorData,
        dims: [usize; 3],
        device: B::Device,
    },
    Tensor(Tensor<B, 3>),
}

impl<B: Backend> Residual<'_, B> {
    /// `x + attention(norm(x))`, appending the new tokens' keys and values to `cache`.
    pub fn add_attention(
        self,
        norm: &RmsNorm<B>,
        attention: &GroupedQueryAttention<B>,
        cache: &mut LayerCache<B>,
        pass: &Pass,
    ) -> Self {
        self.add_attention_normed(norm, attention, None, cache, pass)
    }

    /// `x + post(attention(norm(x)))` (Gemma 3's norms on both sides of a block), or without
    /// `post` as [`Self::add_attention`].
    pub fn add_attention_normed(
        mut self,
        norm: &RmsNorm<B>,
        attention: &GroupedQueryAttention<B>,
        post: Option<&RmsNorm<B>>,
        cache: &mut LayerCache<B>,
        pass: &Pass,
    ) -> Self {
        let DecoderStep { context, buffers } = &mut *self.step;
        self.stream = match (self.stream, &*context) {
            (Stream::Host { data, dims, device }, Context::Host(context)) => {
                Stream::host(data, dims, device, norm, buffers, |residual, buffers| {
                    attention.add_on_host(residual, dims, (context, cache), post, pass, buffers)
                })
            }
            (Stream::Tensor(x), Context::Trained { rotary, real_keys }) => {
                let normed = pass.rms_norm(norm, x.clone());
                let context = (rotary, real_keys);
                Stream::Tensor(attention.add_trained(normed, x, context, cache, post, pass))
            }
            (Stream::Tensor(x), Context::Tensors { cos, sin, bias }) => {
                let normed = pass.rms_norm(norm, x.clone());
                let angles = (cos, sin, bias);
                Stream::Tensor(attention.add_by_tensors(normed, x, angles, cache, post, pass))
            }
            _ => unreachable!("the stream is on the host exactly when the context is"),
        };
        self
    }

    /// `x + mlp(norm(x))`.
    pub fn add_mlp(self, norm: &RmsNorm<B>, mlp: &SwiGlu<B>, pass: &Pass) -> Self {
        self.add_mlp_normed(norm, mlp, None, pass)
    }

    /// `x + post(mlp(norm(x)))`, or without `post` as [`Self::add_mlp`].
    pub fn add_mlp_normed(
        mut self,
        norm: &RmsNorm<B>,
        mlp: &SwiGlu<B>,
        post: Option<&RmsNorm<B>>,
        pass: &Pass,
    ) -> Self {
        let buffers = &mut self.step.buffers;
        self.stream = match self.stream {
            Stream::Host { data, dims, device } => {
                Stream::host(data, dims, device, norm, buffers, |residual, buffers| {
                    mlp.add_on_host(residual, dims[2], post, pass, buffers)
                })
            }
            Stream::Tensor(x) => {
                let normed = pass.rms_norm(norm, x.clone());
                Stream::Tensor(mlp.add_by_tensors(normed, x, post, pass))
            }
        };
        self
    }

    /// The stream as a tensor, the layer's output.
    pub fn into_tensor(self) -> Tensor<B, 3> {
        match self.stream {
            Stream::Host { data, device, .. } => Tensor::from_data(data, &device),
            Stream::Tensor(x) => x,
        }
    }
}

impl<B: Backend> Stream<B> {
    /// `norm(residual)` into `buffers.normed`, then `add` onto the residual values in place.
    fn host(
        mut data: TensorData,
        dims: [usize; 3],
        device: B::Device,
        norm: &RmsNorm<B>,
        buffers: &mut HostBuffers,
        add: impl FnOnce(&mut [f32], &mut HostBuffers),
    ) -> Self {
        let residual = data.as_mut_slice::<f32>().expect("host tensors are f32");
        let weight = HostValues::of(&norm.gamma.val());
        let normed = sized(&mut buffers.normed, residual.len());
        host::rms_norm_into(normed, residual, weight.values(), norm.epsilon as f32);
        add(residual, buffers);
        Stream::Host { data, dims, device }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::module::{AutodiffModule, Module};
    use burn::nn::RmsNormConfig;
    use burn::tensor::Distribution;

    use super::*;
    use crate::{PreparedWeights, Settings};

    #[derive(Module, Debug)]
    struct Layer<B: Backend> {
        input_layernorm: RmsNorm<B>,
        self_attn: GroupedQueryAttention<B>,
        post_attention_layernorm: RmsNorm<B>,
        mlp: SwiGlu<B>,
        /// Gemma 3's norms after the blocks, in the variant that has them.
        after_attention: Option<RmsNorm<B>>,
        after_mlp: Option<RmsNorm<B>>,
    }

    impl<B: Backend> Layer<B> {
        fn forward(
            &self,
            step: &mut DecoderStep<B>,
            x: Tensor<B, 3>,
            cache: &mut LayerCache<B>,
            pass: &Pass,
        ) -> Tensor<B, 3> {
            let post = self.after_attention.as_ref();
            step.residual(x)
                .add_attention_normed(&self.input_layernorm, &self.self_attn, post, cache, pass)
                .add_mlp_normed(
                    &self.post_attention_layernorm,
                    &self.mlp,
                    self.after_mlp.as_ref(),
                    pass,
                )
                .into_tensor()
        }
    }

    /// One layer over a left-padded batch of two 5-token sequences, then one more token each
    /// through `cache` when it keeps them: both outputs, flattened.
    fn run<B: Backend>(layer: &Layer<B>, x: Tensor<B, 3>, mut cache: KvCache<B>) -> Vec<f32> {
        let pass = Pass::new(&Settings::default(), &PreparedWeights::default(), None);
        let rope = Rope::new(4, 10_000.0, 1.0);
        let mask = [vec![false, false, true, true, true], vec![true; 5]];
        let mut outputs = Vec::new();
        let steps = if cache.keeps() { 2 } else { 1 };
        for x in [x.clone(), x.slice([0..2, 4..5])].into_iter().take(steps) {
            let tokens = x.dims()[1];
            let new = NewTokens {
                batch: 2,
                tokens,
                attention_mask: (tokens == 5).then_some(&mask[..]),
                position_ids: None,
            };
            let positions = cache.extend(new, 64).unwrap();
            let mut step = DecoderStep::new(&x, &positions, &rope, &cache, &pass);
            let layer_cache = cache.layers(1).next().unwrap();
            let y = layer.forward(&mut step, x, layer_cache, &pass);
            outputs.extend(y.into_data().to_vec::<f32>().unwrap());
        }
        outputs
    }

    /// A grouped-query layer of width 16 (4 query heads over 2 key/value heads), random; with
    /// `gemma`, Gemma 3's: norms of each query and key head, norms after both blocks, a
    /// GELU-tanh gate.
    fn layer(gemma: bool) -> Layer<Flex> {
        let device = Default::default();
        let shape = AttentionShape {
            hidden: 16,
            heads: 4,
            kv_heads: 2,
            head_dim: 4,
            qkv_bias: true,
            output_bias: false,
            head_norm_eps: gemma.then_some(1e-6),
        };
        // Norm weights away from 1, so that a norm applied twice or not at all shows.
        let norm = |width: usize| {
            let mut norm = RmsNormConfig::new(width).init(&device);
            let gamma = Tensor::random([width], Distribution::Uniform(0.5, 1.5), &device);
            norm.gamma = burn::module::Param::from_tensor(gamma);
            norm
        };
        let mut self_attn = GroupedQueryAttention::init(shape, &device);
        if gemma {
            self_attn.q_norm = Some(norm(4));
            self_attn.k_norm = Some(norm(4));
        }
        let gate = if gemma { Gate::GeluTanh } else { Gate::Silu };
        Layer {
            input_layernorm: norm(16),
            self_attn,
            post_attention_layernorm: norm(16),
            mlp: SwiGlu::init(16, 24, false, &device).with_gate(gate),
            after_attention: gemma.then(|| norm(16)),
            after_mlp: gemma.then(|| norm(16)),
        }
    }

    /// The largest difference between two runs' values.
    fn differ(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
    }

    /// The host kernels (Flex), training's autodiff operations (`Autodiff<Flex>`, no cache kept)
    /// and burn's operations (`Autodiff<Flex>` keeping a cache) compute one grouped-query layer
    /// alike, padding and a cached decoding step included.
    #[test]
    fn the_three_executions_agree() {
        for gemma in [false, true] {
            three_executions_agree(gemma);
        }
    }

    fn three_executions_agree(gemma: bool) {
        let device = Default::default();
        let layer = layer(gemma);
        let x = Tensor::<Flex, 3>::random([2, 5, 16], Distribution::Normal(0.0, 1.0), &device);
        let input = x.to_data().to_vec::<f32>().unwrap();
        let on_autodiff = || Layer::<Autodiff<Flex>>::from_inner(layer.clone());
        let host = run(&layer, x.clone(), KvCache::new());
        let tensors = run(
            &on_autodiff(),
            Tensor::from_inner(x.clone()),
            KvCache::new(),
        );
        let trained = run(&on_autodiff(), Tensor::from_inner(x), KvCache::discarding());
        assert_eq!(host.len(), 2 * 5 * 16 + 2 * 16);
        // The first two rows are padding queries, which attend to nothing: each execution fills
        // them its own way (burn's operations attend uniformly), and nothing reads them.
        let real = 2 * 16;
        assert!(differ(&host[real..], &tensors[real..]) < 1e-4);
        assert!(differ(&host[real..160], &trained[real..]) < 1e-4);
        // The layer does something: its output is not its input.
        assert!(differ(&host[..160], &input) > 1e-2);
    }

    /// One forward of `x` through `layer` after what `cache` holds, with `mask` over the new
    /// tokens (none: all real).
    fn forward<B: Backend>(
        layer: &Layer<B>,
        x: Tensor<B, 3>,
        cache: &mut KvCache<B>,
        mask: Option<&[Vec<bool>]>,
    ) -> Tensor<B, 3> {
        let pass = Pass::new(&Settings::default(), &PreparedWeights::default(), None);
        let [batch, tokens, _] = x.dims();
        let new = NewTokens {
            batch,
            tokens,
            attention_mask: mask,
            position_ids: None,
        };
        let positions = cache.extend(new, 64).unwrap();
        let rope = Rope::new(4, 10_000.0, 1.0);
        let mut step = DecoderStep::new(&x, &positions, &rope, cache, &pass);
        let layer_cache = cache.layers(1).next().unwrap();
        layer.forward(&mut step, x, layer_cache, &pass)
    }

    /// Sequences that start with a shared prefix, its keys and values computed once: every
    /// execution (host kernels, burn's operations keeping the cache, training's operation keeping
    /// nothing) gives the new tokens what a forward over each whole sequence gives them, with
    /// padding among the new tokens; training's gradient with respect to the new tokens is the
    /// whole sequence's.
    #[test]
    fn sequences_after_a_shared_prefix_read_as_whole_sequences() {
        for gemma in [false, true] {
            after_a_shared_prefix(gemma);
        }
    }

    fn after_a_shared_prefix(gemma: bool) {
        type Ad = Autodiff<Flex>;
        let device = Default::default();
        let layer = layer(gemma);
        let on_autodiff = || Layer::<Ad>::from_inner(layer.clone());
        let (shared, new) = (3, 4);
        let normal =
            |shape| Tensor::<Flex, 3>::random(shape, Distribution::Normal(0.0, 1.0), &device);
        let (start, x) = (normal([1, shared, 16]), normal([2, new, 16]));
        let mask = [vec![true, false, true, true], vec![true; new]];
        let whole_mask: Vec<Vec<bool>> = mask
            .iter()
            .map(|row| [vec![true; shared], row.clone()].concat())
            .collect();
        let whole = Tensor::cat(vec![start.clone().repeat_dim(0, 2), x.clone()], 1);
        let values = |y: Tensor<Flex, 3>| y.into_data().to_vec::<f32>().unwrap();
        let want = forward(
            &layer,
            whole.clone(),
            &mut KvCache::new(),
            Some(&whole_mask),
        );
        let want = values(want.slice([0..2, shared..shared + new]));

        let mut cache = KvCache::new();
        forward(&layer, start, &mut cache, None);
        let prefix = cache.share().unwrap();
        assert_eq!(
            (prefix.tokens(), prefix.layers(), prefix.kv_width()),
            (3, 1, 8)
        );
        let host = forward(
            &layer,
            x.clone(),
            &mut KvCache::after(&prefix, 2),
            Some(&mask),
        );
        assert!(differ(&values(host), &want) < 1e-4);
        let mut tensors_cache = KvCache::after(&prefix, 2);
        let tensors = forward(
            &on_autodiff(),
            Tensor::from_inner(x.clone()),
            &mut tensors_cache,
            Some(&mask),
        );
        assert!(differ(&values(tensors.inner()), &want) < 1e-4);

        let weights = normal([2, new, 16]);
        let gradient = |y: Tensor<Ad, 3>, x: &Tensor<Ad, 3>| {
            let grads = (y * Tensor::from_inner(weights.clone())).sum().backward();
            values(x.grad(&grads).unwrap())
        };
        let x_trained = Tensor::<Ad, 3>::from_inner(x).require_grad();
        let mut trained_cache = KvCache::discarding_after(&prefix, 2);
        let trained = forward(
            &on_autodiff(),
            x_trained.clone(),
            &mut trained_cache,
            Some(&mask),
        );
        assert!(differ(&values(trained.clone().inner()), &want) < 1e-4);
        let whole_x = Tensor::<Ad, 3>::from_inner(whole).require_grad();
        let whole_y = forward(
            &on_autodiff(),
            whole_x.clone(),
            &mut KvCache::discarding(),
            Some(&whole_mask),
        );
        let whole_y = whole_y.slice([0..2, shared..shared + new]);
        let want_gradient = Tensor::<Flex, 3>::from_data(
            TensorData::new(gradient(whole_y, &whole_x), [2, shared + new, 16]),
            &device,
        );
        let want_gradient = values(want_gradient.slice([0..2, shared..shared + new]));
        let got_gradient = gradient(trained, &x_trained);
        assert!(differ(&got_gradient, &want_gradient) < 1e-4);
        assert!(want_gradient.iter().any(|g| g.abs() > 1e-3));

        // A cache that keeps nothing serves one forward.
        let again = trained_cache.extend(
            NewTokens {
                batch: 2,
                tokens: 1,
                attention_mask: None,
                position_ids: None,
            },
            64,
        );
        assert_eq!(again.unwrap_err(), TokensError::Spent);
    }
}
