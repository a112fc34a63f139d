//! Llama, Qwen2 and Gemma 3 decoder-only language models, as transformers implements them
//! (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `Gemma3ForCausalLM`; candle-transformers' `llama.rs`,
//! `qwen2.rs` and `gemma3.rs`): token embeddings, pre-RMSNorm decoder layers of grouped-query
//! attention with rotary position embeddings and a gated MLP, a final RMSNorm and `lm_head` (or
//! the embedding matrix, tied). Qwen2 is Llama with biases on the q, k and v projections. Gemma 3
//! scales the embeddings by √hidden, normalises each query and key head, puts a second norm after
//! each block (`post_attention_layernorm` after attention, `pre_`/`post_feedforward_layernorm`
//! around the MLP), gates with GELU-tanh, and rotates its sliding-window layers by their own base;
//! its RMSNorms multiply by `1 + weight`, which loading folds into the weights. Field names mirror
//! the checkpoint's keys (`model.layers.N.self_attn.q_proj`, `model.layers.N.mlp.gate_proj`,
//! `lm_head`, ...).

use burn::module::{Module, ModuleMapper, Param};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_core::Policy;
use kiln_kernels::gemm::quantized::QuantMatrix;
use kiln_transformer::decoder::{
    AttentionShape, DecoderStep, Gate, GroupedQueryAttention, KvCache, LayerCache, NewTokens, Rope,
    SharedPrefix, SwiGlu,
};
use kiln_transformer::projection::{Then, project, project_by_table};
use kiln_transformer::{
    Pass, PreparedWeights, Settings, StoredWeights, in_compute_dtype, run_layers,
};

use crate::TextError;
use crate::config::{Family, RopeScaling, TextConfig};
use crate::input::{Logits, TextInput, Tokens};

/// One pre-norm decoder layer (`model.layers.N`): `x + self_attn(input_layernorm x)`, then
/// `+ mlp(post_attention_layernorm ·)`; in Gemma 3 `x + post_attention_layernorm(self_attn(
/// input_layernorm x))`, then `+ post_feedforward_layernorm(mlp(pre_feedforward_layernorm ·))`.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    self_attn: GroupedQueryAttention<B>,
    mlp: SwiGlu<B>,
    input_layernorm: RmsNorm<B>,
    post_attention_layernorm: RmsNorm<B>,
    /// Gemma 3's norm before the MLP.
    pre_feedforward_layernorm: Option<RmsNorm<B>>,
    /// Gemma 3's norm after the MLP.
    post_feedforward_layernorm: Option<RmsNorm<B>>,
    /// Whether it is one of Gemma 3's sliding-window layers (rotated by their own base).
    #[module(skip)]
    sliding: bool,
}

impl<B: Backend> DecoderLayer<B> {
    fn forward(
        &self,
        x: Tensor<B, 3>,
        step: &mut DecoderStep<B>,
        cache: &mut LayerCache<B>,
        pass: &Pass,
    ) -> Tensor<B, 3> {
        let residual = step.residual(x);
        match (
            &self.pre_feedforward_layernorm,
            &self.post_feedforward_layernorm,
        ) {
            (Some(before), Some(after)) => residual
                .add_attention_normed(
                    &self.input_layernorm,
                    &self.self_attn,
                    Some(&self.post_attention_layernorm),
                    cache,
                    pass,
                )
                .add_mlp_normed(before, &self.mlp, Some(after), pass),
            _ => residual
                .add_attention(&self.input_layernorm, &self.self_attn, cache, pass)
                .add_mlp(&self.post_attention_layernorm, &self.mlp, pass),
        }
        .into_tensor()
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

/// A causal language model of the Llama family (`LlamaForCausalLM`, `Qwen2ForCausalLM`,
/// `Gemma3ForCausalLM`).
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
        let hidden = self.hidden_size;
        let norm = || {
            RmsNormConfig::new(hidden)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        let attention = AttentionShape {
            hidden,
            heads: self.num_attention_heads,
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim(),
            qkv_bias: self.qkv_bias(),
            output_bias: self.attention_bias,
            head_norm_eps: (self.family == Family::Gemma3).then_some(self.rms_norm_eps),
        };
        let gemma = self.family == Family::Gemma3;
        let gate = if gemma { Gate::GeluTanh } else { Gate::Silu };
        let layers = (0..self.num_hidden_layers)
            .map(|layer| DecoderLayer {
                self_attn: GroupedQueryAttention::init(attention, device),
                mlp: SwiGlu::init(hidden, self.intermediate_size, self.mlp_bias, device)
                    .with_gate(gate),
                input_layernorm: norm(),
                post_attention_layernorm: norm(),
                pre_feedforward_layernorm: gemma.then(norm),
                post_feedforward_layernorm: gemma.then(norm),
                sliding: (self.sliding.as_ref()).is_some_and(|s| s.layers[layer]),
            })
            .collect();
        CausalLm {
            model: LlamaModel {
                embed_tokens: EmbeddingConfig::new(self.vocab_size, hidden).init(device),
                layers,
                norm: norm(),
            },
            lm_head: (!self.tie_word_embeddings).then(|| {
                LinearConfig::new(hidden, self.vocab_size)
                    .with_bias(false)
                    .init(device)
            }),
            config: self.clone(),
            settings: Settings::default(),
            prepared: PreparedWeights::in_place(),
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
        // Weights kept as stored run with f32 parameters (`Weights::AsStored` checks the policy),
        // and casting would decode them (burn's cast initialises each lazy parameter).
        let mut model = match self.prepared.stored().is_empty() {
            true => policy.cast_params(self),
            false => self,
        };
        model.settings.policy = *policy;
        let stored = model.prepared.stored().clone();
        model.prepared = PreparedWeights::in_place().with_stored(stored);
        model
    }

    /// The model reading `stored`'s matrices in place of their parameters.
    pub(crate) fn with_stored(mut self, stored: StoredWeights) -> Self {
        self.prepared = PreparedWeights::in_place().with_stored(stored);
        self
    }

    /// The weights read as a GGUF file stores them (none unless loaded so:
    /// [`crate::Weights::AsStored`]).
    pub fn stored_weights(&self) -> &StoredWeights {
        self.prepared.stored()
    }

    /// The token embeddings of `ids` `[batch, tokens]`, `[batch, tokens, hidden]` (what
    /// [`Tokens::Embeddings`] takes, for models that splice other embeddings in).
    pub fn embed(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let table = &self.model.embed_tokens.weight;
        let x = match self.prepared.stored().get(table.id) {
            Some(stored) => stored_rows(stored, ids),
            None => self.model.embed_tokens.forward(ids),
        };
        match self.config.family {
            Family::Gemma3 => x * self.embedding_scale(),
            Family::Llama | Family::Qwen2 => x,
        }
    }

    /// What [`Self::embed`] multiplies the embedding table's rows by: √hidden in Gemma 3
    /// (transformers' `Gemma3TextScaledWordEmbedding`), 1 otherwise.
    pub fn embedding_scale(&self) -> f32 {
        match self.config.family {
            Family::Gemma3 => (self.config.hidden_size as f32).sqrt(),
            Family::Llama | Family::Qwen2 => 1.0,
        }
    }

    /// Gemma 3's RMSNorms multiply by `1 + weight`: the checkpoint's weights with 1 added, so
    /// that they run as every other RMSNorm (llama.cpp's GGUF stores them so). Others as they
    /// are.
    pub(crate) fn with_norm_weights_folded(self) -> Self {
        match self.config.family {
            Family::Gemma3 => self.map(&mut NormsPlusOne::default()),
            Family::Llama | Family::Qwen2 => self,
        }
    }

    /// The token embedding table `[vocab, hidden]` (transformers' `get_input_embeddings().weight`).
    pub fn input_embeddings(&self) -> Tensor<B, 2> {
        self.model.embed_tokens.weight.val()
    }

    /// The output projection's weight `[vocab, hidden]`: `lm_head`'s, or the token embeddings
    /// when they are tied (transformers' `get_output_embeddings().weight`).
    pub fn output_embeddings(&self) -> Tensor<B, 2> {
        match &self.lm_head {
            Some(head) => head.weight.val().transpose(),
            None => self.model.embed_tokens.weight.val(),
        }
    }

    /// One forward pass over `input`'s new tokens, after those already in `cache` (an empty
    /// [`KvCache::new`] for a prompt); appends their keys and values to it.
    pub fn forward_cached(
        &self,
        input: TextInput<B>,
        cache: &mut KvCache<B>,
    ) -> Result<CausalLmOutput<B>, TextError> {
        // On one of rayon's threads: each product's parallel region then starts on this thread
        // rather than waking the pool's sleeping workers (hundreds of regions a decoded token).
        rayon::scope(|_| self.forward_on_this_thread(input, cache))
    }

    /// [`Self::forward_cached`] on the calling thread.
    fn forward_on_this_thread(
        &self,
        input: TextInput<B>,
        cache: &mut KvCache<B>,
    ) -> Result<CausalLmOutput<B>, TextError> {
        let device = self.model.embed_tokens.weight.lazy_device();
        let (batch, tokens) = input.tokens.dims();
        let layers = self.config.num_hidden_layers;
        let kv_width = self.config.num_key_value_heads * self.config.head_dim();
        if !cache.fits(layers, kv_width) {
            return Err(TextError::Input(format!(
                "the cache holds another model's keys and values (this one has {layers} layers \
                 of {kv_width}-wide keys)"
            )));
        }
        if let Tokens::Ids(ids) = &input.tokens {
            self.check_ids(ids, tokens)?;
        }
        let new = NewTokens {
            batch,
            tokens,
            attention_mask: input.attention_mask.as_deref(),
            position_ids: input.position_ids.as_deref(),
        };
        let positions = cache.extend(new, self.config.max_position_embeddings)?;
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
        let mut step = DecoderStep::new(&x, &positions, &self.config.rope(), cache, &pass);
        let mut sliding_step = (self.config.sliding.as_ref()).map(|sliding| {
            let rope = Rope::new(self.config.head_dim(), sliding.rope_theta, 1.0);
            DecoderStep::new(&x, &positions, &rope, cache, &pass)
        });
        let mut caches = cache.layers(model.model.layers.len());
        let (x, mut hidden_states) = run_layers(
            x,
            &model.model.layers,
            input.hidden_states,
            &pass,
            |layer, x, pass| {
                let cache = caches.next().expect("one cache per layer");
                let step = match (&mut sliding_step, layer.sliding) {
                    (Some(sliding), true) => sliding,
                    _ => &mut step,
                };
                layer.forward(x, step, cache, pass)
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
        let logits = match &model.lm_head {
            Some(head) => project(head, head_input, Then::Nothing, &pass),
            None => project_by_table(head_input, &model.model.embed_tokens.weight, &pass),
        };
        Ok(CausalLmOutput {
            logits: pass.output(logits),
            last_hidden_state: pass.output(last_hidden_state),
            hidden_states,
        })
    }

    /// The keys and values of `ids`, which many sequences start with (a chat template's system
    /// turn): computed once, then each forward after them ([`KvCache::after`],
    /// [`KvCache::discarding_after`]) reads them instead of recomputing them, training included.
    /// Compute it under the policy the model runs under.
    ///
    /// ```no_run
    /// use burn::backend::Flex;
    /// use kiln_core::Policy;
    /// use kiln_text::{CausalLm, KvCache, TextInput};
    ///
    /// let device = Default::default();
    /// let model = CausalLm::<Flex>::from_hf_dir("SmolLM2-135M-Instruct", &device, &Policy::full())?;
    /// let system = model.prefix(&[1, 9690, 198])?;
    /// let mut cache = KvCache::discarding_after(&system, 2);
    /// let out = model.forward_cached(TextInput::ids(vec![vec![4, 2], vec![7, 7]]), &mut cache)?;
    /// assert_eq!(out.logits.dims()[..2], [2, 2]);
    /// # Ok::<(), kiln_text::TextError>(())
    /// ```
    pub fn prefix(&self, ids: &[u32]) -> Result<SharedPrefix, TextError> {
        let mut cache = KvCache::new();
        let input = TextInput::ids(vec![ids.to_vec()]).with_last_logits_only();
        self.forward_cached(input, &mut cache)?;
        Ok(cache.share()?)
    }

    /// [`Self::forward_cached`] of whole sequences, keeping no keys and values (scoring,
    /// training, embeddings).
    pub fn forward(&self, input: TextInput<B>) -> Result<CausalLmOutput<B>, TextError> {
        self.forward_cached(input, &mut KvCache::discarding())
    }

    /// Refuses sequences of other lengths than the first's (`tokens`) and token ids outside the
    /// vocabulary, naming the first (1-based row and position).
    fn check_ids(&self, ids: &[Vec<u32>], tokens: usize) -> Result<(), TextError> {
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
        if let Some(row) = ids.iter().position(|row| row.len() != tokens) {
            return Err(TextError::Input(format!(
                "sequence {} has {} tokens and sequence 1 has {tokens}: pad them to one length",
                row + 1,
                ids[row].len()
            )));
        }
        Ok(())
    }
}

/// The rows `ids` `[batch, tokens]` of a table kept as stored, decoded: `[batch, tokens, width]`.
fn stored_rows<B: Backend>(table: &QuantMatrix, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
    let [batch, tokens] = ids.dims();
    let device = ids.device();
    let ids: Vec<i64> = ids
        .into_data()
        .convert::<i64>()
        .into_vec()
        .expect("ids convert");
    let width = table.columns();
    let mut rows = vec![0f32; ids.len() * width];
    for (row, &id) in rows.chunks_exact_mut(width).zip(&ids) {
        let id = id as usize;
        table.dequantize_rows_into(id..id + 1, row);
    }
    Tensor::from_data(TensorData::new(rows, [batch, tokens, width]), &device)
}

impl TextConfig {
    /// The rotary frequencies of this model's heads.
    fn rope(&self) -> Rope {
        let divisor = match self.rope_scaling {
            RopeScaling::None => 1.0,
            RopeScaling::Linear { factor } => factor,
        };
        Rope::new(self.head_dim(), self.rope_theta, divisor)
    }
}

/// Adds 1 to the weight of every RMSNorm of a module (Gemma's `1 + weight`).
#[derive(Default)]
struct NormsPlusOne {
    /// The containers entered, innermost last.
    inside: Vec<String>,
}

impl<B: Backend> ModuleMapper<B> for NormsPlusOne {
    fn enter_module(&mut self, _: &str, container_type: &str) {
        self.inside.push(container_type.to_string());
    }

    fn exit_module(&mut self, _: &str, _: &str) {
        self.inside.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let in_norm = self.inside.last().is_some_and(|c| c == "Struct:RmsNorm");
        let tensor = if in_norm {
            // A new leaf, trainable as the weight it replaces.
            let trainable = tensor.is_require_grad();
            (tensor + 1.0).detach().set_require_grad(trainable)
        } else {
            tensor
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}
