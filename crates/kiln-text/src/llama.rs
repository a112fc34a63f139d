//! Llama and Qwen2 decoder-only language models, as transformers implements them
//! (`LlamaForCausalLM`, `Qwen2ForCausalLM`; candle-transformers' `llama.rs` and `qwen2.rs`):
//! token embeddings, pre-RMSNorm decoder layers of grouped-query attention with rotary position
//! embeddings and a SwiGLU MLP, a final RMSNorm and `lm_head` (or the embedding matrix, tied).
//! Qwen2 is Llama with biases on the q, k and v projections. Field names mirror the checkpoint's
//! keys (`model.layers.N.self_attn.q_proj`, `model.layers.N.mlp.gate_proj`, `lm_head`, ...).

use std::sync::Arc;

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_core::Policy;
use kiln_kernels::host::{self, AttentionOp, Heads, RotaryAngles, Rows};
use kiln_kernels::rotary::{self, Angles, Turn};
use kiln_kernels::{HostValues, host_op, host_ops_serve};
use kiln_transformer::projection::{
    Then, add_product, product_rows_into, product_then, project, project_by_table,
};
use kiln_transformer::{Pass, PreparedWeights, Settings, in_compute_dtype, run_layers};

use crate::TextError;
use crate::cache::{KvCache, LayerCache};
use crate::config::TextConfig;
use crate::input::{Logits, TextInput, Tokens};
use crate::rope::Rope;

/// Grouped-query self-attention (`model.layers.N.self_attn`).
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    o_proj: Linear<B>,
    #[module(skip)]
    heads: usize,
    #[module(skip)]
    kv_heads: usize,
}

/// What one layer's attention sees besides its input: the new tokens' rotary angles and which
/// keys each may attend to, as the host kernels or burn's operations take them.
enum Context<B: Backend> {
    /// f32 on Flex or NdArray.
    Host(HostContext),
    /// Training on Flex in f32 (`Autodiff<Flex>`), whole sequences: burn's operations, but
    /// attention (the rotation, grouped heads, causal and padding masks) as one autodiff
    /// operation ([`AttentionOp`]).
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

/// The host kernels' context: row-major `cos` and `sin` `[batch · new, head_dim]`, each image's
/// real keys `[batch · (past + new)]` (`None`: no padding) and the count of tokens before the
/// new ones.
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
}

/// `buffer` holding `len` values, for a kernel that overwrites them all (only growth is zeroed).
fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buffer.resize(len, 0.0);
    buffer
}

impl<B: Backend> Attention<B> {
    /// `residual + o_proj(attention(x))` through burn's operations; appends this step's keys and
    /// values to `cache`.
    fn forward(
        &self,
        x: Tensor<B, 3>,
        residual: Tensor<B, 3>,
        (cos, sin, bias): (&Tensor<B, 4>, &Tensor<B, 4>, &Tensor<B, 4>),
        cache: &mut LayerCache<B>,
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let attended = self.attend(x, (cos, sin), bias.clone(), cache, pass);
        let then = Then::AddTo {
            residual,
            scale: None,
        };
        project(&self.o_proj, attended, then, pass)
    }

    /// `residual + o_proj(attention(x))` in training on Flex: the projections and
    /// [`AttentionOp`] each one autodiff operation, the heads never split or merged by copies.
    fn forward_trained(
        &self,
        x: Tensor<B, 3>,
        residual: Tensor<B, 3>,
        (rotary, real_keys): (&RotaryAngles, &Option<Arc<[bool]>>),
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let [batch, tokens, _] = x.dims();
        let [query, key, value] = [&self.q_proj, &self.k_proj, &self.v_proj]
            .map(|linear| project(linear, x.clone(), Then::Nothing, pass));
        let width = query.dims()[2];
        let head_dim = width / self.heads;
        let op = AttentionOp {
            kv_heads: self.kv_heads,
            causal: true,
            real_keys: real_keys.clone(),
            rotary: Some(rotary.clone()),
            ..AttentionOp::new(batch, self.heads, head_dim, tokens, tokens)
        };
        let attended = host_op(op, [&query, &key, &value], [batch, tokens, width])
            .expect("host operations serve training on Flex in f32");
        let then = Then::AddTo {
            residual,
            scale: None,
        };
        project(&self.o_proj, attended, then, pass)
    }

    /// Attention through burn's operations; the heads merged, before `o_proj`.
    fn attend(
        &self,
        x: Tensor<B, 3>,
        (cos, sin): (&Tensor<B, 4>, &Tensor<B, 4>),
        bias: Tensor<B, 4>,
        cache: &mut LayerCache<B>,
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let [batch, tokens, _] = x.dims();
        let project_heads = |linear: &Linear<B>, count: usize| {
            let y = project(linear, x.clone(), Then::Nothing, pass);
            let width = y.dims()[2];
            y.reshape([batch, tokens, count, width / count])
                .swap_dims(1, 2)
        };
        let query = Rope::apply(project_heads(&self.q_proj, self.heads), cos, sin);
        let key = Rope::apply(project_heads(&self.k_proj, self.kv_heads), cos, sin);
        let value = project_heads(&self.v_proj, self.kv_heads);
        let (key, value) = cache.append(key, value);
        let attended = grouped_attention(query, key, value, bias, pass);
        let [_, heads, _, head_dim] = attended.dims();
        attended
            .swap_dims(1, 2)
            .reshape([batch, tokens, heads * head_dim])
    }

    /// `residual += o_proj(attention(normed))` on the host kernels (f32 on Flex or NdArray): q, k
    /// and v from one product, rotated in place, the keys and values appended to the host
    /// cache, then kiln's causal grouped-query attention kernel.
    fn forward_on_host(
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
        .policy()
        .keep_f32(scores, |scores| softmax(scores + bias, 3));
    probs.matmul(repeat(value))
}

/// The SwiGLU MLP (`model.layers.N.mlp`): `down_proj(silu(gate_proj x) ⊙ up_proj x)`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    gate_proj: Linear<B>,
    up_proj: Linear<B>,
    down_proj: Linear<B>,
}

/// Rows of the host MLP's blocks: its `[rows, 2 · intermediate]` products stay a few MB (in
/// cache) whatever the batch.
const MLP_ROWS: usize = 256;

impl<B: Backend> Mlp<B> {
    /// `residual + mlp(x)` through burn's operations.
    fn forward(&self, x: Tensor<B, 3>, residual: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let gate = project(&self.gate_proj, x.clone(), Then::Nothing, pass);
        let hidden = silu(gate) * project(&self.up_proj, x, Then::Nothing, pass);
        let then = Then::AddTo {
            residual,
            scale: None,
        };
        project(&self.down_proj, hidden, then, pass)
    }

    /// `residual += mlp(normed)` on the host kernels, blocks of rows at a time: gate and up as
    /// one product, `silu(gate) ⊙ up` in one pass over it, and `down_proj` added onto the
    /// residual stream in place.
    fn forward_on_host(
        &self,
        residual: &mut [f32],
        hidden: usize,
        pass: &Pass,
        buffers: &mut HostBuffers,
    ) {
        let gate_up_weight = pass
            .prepared()
            .side_by_side(&[&self.gate_proj, &self.up_proj]);
        let down = pass.prepared().linear(&self.down_proj, None);
        let width = gate_up_weight.columns() / 2;
        for (x, sums) in buffers
            .normed
            .chunks(MLP_ROWS * hidden)
            .zip(residual.chunks_mut(MLP_ROWS * hidden))
        {
            let rows = x.len() / hidden;
            let gate_up = sized(&mut buffers.gate_up, rows * 2 * width);
            product_rows_into(gate_up, x, hidden, &gate_up_weight, |v| v);
            let activated = sized(&mut buffers.activated, rows * width);
            host::swiglu_into(activated, gate_up, width);
            add_product(sums, activated, width, &down);
        }
    }
}

/// One pre-norm decoder layer (`model.layers.N`).
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    self_attn: Attention<B>,
    mlp: Mlp<B>,
    input_layernorm: RmsNorm<B>,
    post_attention_layernorm: RmsNorm<B>,
}

impl<B: Backend> DecoderLayer<B> {
    fn forward(
        &self,
        x: Tensor<B, 3>,
        context: &Context<B>,
        cache: &mut LayerCache<B>,
        pass: &Pass,
        buffers: &mut HostBuffers,
    ) -> Tensor<B, 3> {
        match context {
            Context::Host(context) => {
                let (dims, device) = (x.dims(), x.device());
                let mut data = x.into_data();
                let residual = data.as_mut_slice::<f32>().expect("host tensors are f32");
                self.forward_on_host(residual, dims, context, cache, pass, buffers);
                Tensor::from_data(data, &device)
            }
            Context::Trained { rotary, real_keys } => {
                let normed = pass.rms_norm(&self.input_layernorm, x.clone());
                let x = (self.self_attn).forward_trained(normed, x, (rotary, real_keys), pass);
                let normed = pass.rms_norm(&self.post_attention_layernorm, x.clone());
                self.mlp.forward(normed, x, pass)
            }
            Context::Tensors { cos, sin, bias } => {
                let normed = pass.rms_norm(&self.input_layernorm, x.clone());
                let x = self
                    .self_attn
                    .forward(normed, x, (cos, sin, bias), cache, pass);
                let normed = pass.rms_norm(&self.post_attention_layernorm, x.clone());
                self.mlp.forward(normed, x, pass)
            }
        }
    }

    /// The layer on the host kernels, the residual stream `[batch, tokens, hidden]` updated in
    /// place.
    fn forward_on_host(
        &self,
        residual: &mut [f32],
        dims: [usize; 3],
        context: &HostContext,
        cache: &mut LayerCache<B>,
        pass: &Pass,
        buffers: &mut HostBuffers,
    ) {
        let norm_into = |out: &mut Vec<f32>, residual: &[f32], norm: &RmsNorm<B>| {
            let weight = HostValues::of(&norm.gamma.val());
            let out = sized(out, residual.len());
            host::rms_norm_into(out, residual, weight.values(), norm.epsilon as f32);
        };
        norm_into(&mut buffers.normed, residual, &self.input_layernorm);
        self.self_attn
            .forward_on_host(residual, dims, context, cache, pass, buffers);
        norm_into(
            &mut buffers.normed,
            residual,
            &self.post_attention_layernorm,
        );
        self.mlp.forward_on_host(residual, dims[2], pass, buffers);
    }
}

/// The decoder (`model`).
#[derive(Module, Debug)]
pub struct LlamaModel<B: Backend> {
    embed_tokens: Embedding<B>,
    layers: Vec<DecoderLayer<B>>,
    norm: RmsNorm<B>,
}

/// What a forward pass gives, in the policy's output dtype.
#[derive(Debug, Clone)]
pub struct CausalLmOutput<B: Backend> {
    /// Next-token logits `[batch, tokens, vocab]`, or of the tokens [`TextInput::logits`] names
    /// (the last: `[batch, 1, vocab]`; from position p: `[batch, tokens − p, vocab]`, at least
    /// the last token's).
    pub logits: Tensor<B, 3>,
    /// The final norm's output `[batch, tokens, hidden]`.
    pub last_hidden_state: Tensor<B, 3>,
    /// With [`TextInput::hidden_states`]: the embeddings, each layer's output, and for the last
    /// layer the final norm's output (transformers' `hidden_states`, `layers + 1` of them).
    pub hidden_states: Vec<Tensor<B, 3>>,
}

/// A causal language model of the Llama family (`LlamaForCausalLM`, `Qwen2ForCausalLM`).
#[derive(Module, Debug)]
pub struct CausalLm<B: Backend> {
    model: LlamaModel<B>,
    /// Absent when the embeddings are tied (`tie_word_embeddings`).
    lm_head: Option<Linear<B>>,
    #[module(skip)]
    config: TextConfig,
    #[module(skip)]
    settings: Settings,
    #[module(skip)]
    prepared: PreparedWeights,
}

impl TextConfig {
    /// A randomly initialised model of this shape (load a checkpoint into it with
    /// [`CausalLm::from_hf_dir`]'s loader).
    pub fn init<B: Backend>(&self, device: &B::Device) -> CausalLm<B> {
        let (hidden, head_dim) = (self.hidden_size, self.head_dim());
        let linear = |inputs, outputs, bias| {
            LinearConfig::new(inputs, outputs)
                .with_bias(bias)
                .init(device)
        };
        let norm = || {
            RmsNormConfig::new(hidden)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let q_width = self.num_attention_heads * head_dim;
        let kv_width = self.num_key_value_heads * head_dim;
        let qkv_bias = self.qkv_bias();
        let layers = (0..self.num_hidden_layers)
            .map(|_| DecoderLayer {
                self_attn: Attention {
                    q_proj: linear(hidden, q_width, qkv_bias),
                    k_proj: linear(hidden, kv_width, qkv_bias),
                    v_proj: linear(hidden, kv_width, qkv_bias),
                    o_proj: linear(q_width, hidden, self.attention_bias),
                    heads: self.num_attention_heads,
                    kv_heads: self.num_key_value_heads,
                },
                mlp: Mlp {
                    gate_proj: linear(hidden, self.intermediate_size, self.mlp_bias),
                    up_proj: linear(hidden, self.intermediate_size, self.mlp_bias),
                    down_proj: linear(self.intermediate_size, hidden, self.mlp_bias),
                },
                input_layernorm: norm(),
                post_attention_layernorm: norm(),
            })
            .collect();
        CausalLm {
            model: LlamaModel {
                embed_tokens: EmbeddingConfig::new(self.vocab_size, hidden).init(device),
                layers,
                norm: norm(),
            },
            lm_head: (!self.tie_word_embeddings).then(|| linear(hidden, self.vocab_size, false)),
            config: self.clone(),
            settings: Settings::default(),
            prepared: PreparedWeights::default(),
        }
    }
}

impl<B: Backend> CausalLm<B> {
    /// The model's shape.
    pub fn config(&self) -> &TextConfig {
        &self.config
    }

    /// The precision policy the model runs under.
    pub fn policy(&self) -> &Policy {
        &self.settings.policy
    }

    /// The model under `policy`: parameters cast to its parameter dtype once, forward passes in
    /// its compute dtype (norms and softmax in f32), results in its output dtype.
    ///
    /// For inference, prefer a pure policy (parameters in the compute dtype, e.g. `bf16`): under
    /// a mixed one (f32 parameters, bf16 compute) every forward casts the whole model to the
    /// compute dtype first, as autocast casts weights per operation — once per generated token
    /// when decoding. Mixed policies are for training, where the f32 master weights matter.
    pub fn with_policy(self, policy: &Policy) -> Self {
        let mut model = policy.cast_params(self);
        model.settings.policy = *policy;
        model.prepared = PreparedWeights::default();
        model
    }

    /// The token embeddings of `ids` `[batch, tokens]`, `[batch, tokens, hidden]` (what
    /// [`Tokens::Embeddings`] takes, for models that splice other embeddings in).
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.model.embed_tokens.forward(ids)
    }

    /// One forward pass over `input`'s new tokens, after those already in `cache` (an empty
    /// [`KvCache::new`] for a prompt); appends their keys and values to it.
    pub fn forward_cached(
        &self,
        input: TextInput<B>,
        cache: &mut KvCache<B>,
    ) -> Result<CausalLmOutput<B>, TextError> {
        let device = self.devices()[0].clone();
        let (batch, tokens) = input.tokens.dims();
        if let Tokens::Ids(ids) = &input.tokens {
            self.check_ids(ids)?;
        }
        let positions = cache.extend(&input, self.config.max_position_embeddings)?;
        let pass = Pass::new(&self.settings, &self.prepared, None);
        let model = in_compute_dtype(self, &self.settings.policy);
        let x = match input.tokens {
            Tokens::Ids(ids) => {
                let flat: Vec<i64> = ids.iter().flatten().map(|&id| i64::from(id)).collect();
                let ids = Tensor::from_data(TensorData::new(flat, [batch, tokens]), &device);
                model.embed(ids)
            }
            Tokens::Embeddings(x) => x,
        };
        let x = pass.input(x);
        let rope = Rope::new(&self.config);
        let context = if host::serves(&x) {
            let (cos, sin) = rope.table(&positions.ids);
            Context::Host(HostContext {
                cos,
                sin,
                real_keys: positions.real_keys(),
                past: positions.past,
            })
        } else if host_ops_serve(&x) && !cache.keeps() {
            let (cos, sin) = rope.table(&positions.ids);
            Context::Trained {
                rotary: RotaryAngles {
                    cos: cos.into(),
                    sin: sin.into(),
                },
                real_keys: positions.real_keys().map(Into::into),
            }
        } else {
            let (cos, sin) = rope.angles::<B>(&positions.ids, &device);
            Context::Tensors {
                cos: pass.input(cos),
                sin: pass.input(sin),
                bias: positions.bias(&device),
            }
        };
        let mut caches = cache.layers(model.model.layers.len());
        let mut buffers = HostBuffers::default();
        let (x, mut hidden_states) = run_layers(
            x,
            &model.model.layers,
            input.hidden_states,
            &pass,
            |layer, x, pass| {
                let cache = caches.next().expect("one cache per layer");
                layer.forward(x, &context, cache, pass, &mut buffers)
            },
        );
        let last_hidden_state = pass.rms_norm(&model.model.norm, x);
        if let Some(last) = hidden_states.last_mut() {
            *last = pass.output(last_hidden_state.clone());
        }
        let first = match input.logits {
            Logits::All => 0,
            Logits::Last => tokens - 1,
            Logits::From(position) => position.min(tokens - 1),
        };
        let head_input = if first > 0 {
            let hidden = last_hidden_state.dims()[2];
            last_hidden_state
                .clone()
                .slice([0..batch, first..tokens, 0..hidden])
        } else {
            last_hidden_state.clone()
        };
        let embedding = &model.model.embed_tokens.weight;
        let logits = match &model.lm_head {
            Some(head) => project(head, head_input, Then::Nothing, &pass),
            None if host::serves(&head_input) => {
                let [batch, tokens, _] = head_input.dims();
                let weight = pass.prepared().transposed(embedding);
                let logits = product_then(head_input.into_data(), &weight, |v| v);
                let shape = [batch, tokens, weight.columns()];
                Tensor::from_data(TensorData::new(logits, shape), &device)
            }
            None => project_by_table(head_input, embedding.val()),
        };
        Ok(CausalLmOutput {
            logits: pass.output(logits),
            last_hidden_state: pass.output(last_hidden_state),
            hidden_states,
        })
    }

    /// [`Self::forward_cached`] of whole sequences, keeping no keys and values (scoring,
    /// training, embeddings).
    pub fn forward(&self, input: TextInput<B>) -> Result<CausalLmOutput<B>, TextError> {
        self.forward_cached(input, &mut KvCache::discarding())
    }

    /// Refuses token ids outside the vocabulary, naming the first (1-based row and position).
    fn check_ids(&self, ids: &[Vec<u32>]) -> Result<(), TextError> {
        let vocab = self.config.vocab_size;
        for (row, ids) in ids.iter().enumerate() {
            if let Some((at, id)) = ids
                .iter()
                .enumerate()
                .find(|&(_, &id)| id as usize >= vocab)
            {
                return Err(TextError::Input(format!(
                    "sequence {}, token {}: id {id} is not below the vocabulary size {vocab}",
                    row + 1,
                    at + 1
                )));
            }
        }
        Ok(())
    }
}
