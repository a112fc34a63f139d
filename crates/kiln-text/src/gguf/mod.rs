//! llama.cpp's GGUF files as kiln-text models: the `llama` and `qwen2` architectures' metadata as
//! a [`TextConfig`] (the keys llama.cpp's `llama-model.cpp` and transformers'
//! `gguf_config_mapping` read), and the tensors under a transformers checkpoint's names (the
//! table of llama.cpp's `convert_hf_to_gguf.py`), with the row permutation that converter
//! applies to a Llama's q and k projections undone.
//!
//! The weights are held as [`Weights`] says: by default the quantized projection and embedding
//! matrices stay in their blocks and the CPU multiplies them as stored (kiln-kernels'
//! `gemm::quantized`), a quarter to an eighth of the bytes f32 takes (F16 and BF16 ones stay in
//! their 16 bits); with [`Weights::Bf16`] every such matrix is rounded to bf16; with
//! [`Weights::F32`] each tensor is decoded to the policy's parameter dtype as it is loaded.
//!
//! ```no_run
//! use burn::backend::Flex;
//! use kiln_core::Policy;
//! use kiln_text::{CausalLm, Weights};
//!
//! let device = Default::default();
//! let path = "SmolLM2-135M-Instruct.Q4_1.gguf";
//! let model = CausalLm::<Flex>::from_gguf(path, &device, &Policy::full(), Weights::AsStored)?;
//! assert_eq!(model.config().num_hidden_layers, 30);
//! # Ok::<(), kiln_text::TextError>(())
//! ```

use std::path::Path;
use std::rc::Rc;

use burn::module::ParamId;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, TensorData};
use burn_store::{TensorSnapshot, TensorSnapshotError};
use kiln_core::gguf::{GgufFile, GgufTensor, Value};
use kiln_core::{Policy, load_snapshots_keeping};

mod tokenizer;

use crate::config::{Family, MODEL_TYPES, RopeScaling, TextConfig};
use crate::llama::CausalLm;
use crate::{TextError, Weights};

impl TextConfig {
    /// The model a GGUF file's metadata describes (`general.architecture` `llama` or `qwen2`).
    /// A setting the file lacks takes llama.cpp's default where it has one (RoPE base 10 000,
    /// as many key/value heads as query heads); the vocabulary is `{arch}.vocab_size`, else the
    /// tokenizer's token count, else the embedding's rows; the output projection is tied when
    /// the file has no `output.weight`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TextError> {
        let meta = Metadata(file);
        let architecture = meta.string("general.architecture")?;
        let family = match architecture {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            other => {
                return Err(meta.error(format!(
                    "architecture `{other}` is not supported; kiln-text reads {}",
                    MODEL_TYPES.join(", ")
                )));
            }
        };
        let key = |name: &str| format!("{architecture}.{name}");
        let hidden_size = meta.count(&key("embedding_length"))?;
        let num_attention_heads = meta.count(&key("attention.head_count"))?;
        let head_dim = meta.optional_count(&key("attention.key_length"))?;
        let rotated = meta.optional_count(&key("rope.dimension_count"))?;
        let whole_head = head_dim.unwrap_or(hidden_size / num_attention_heads.max(1));
        if let Some(rotated) = rotated.filter(|&rotated| rotated != whole_head) {
            return Err(meta.error(format!(
                "{} = {rotated} rotates part of each {whole_head}-wide head; kiln-text's RoPE \
                 rotates whole heads",
                key("rope.dimension_count")
            )));
        }
        if file.tensor("rope_freqs.weight").is_some() {
            return Err(meta.error(
                "rope_freqs.weight scales RoPE's frequencies one by one (Llama 3.1's scaling), \
                 which kiln-text does not do"
                    .into(),
            ));
        }
        let vocab_size = match meta.optional_count(&key("vocab_size"))? {
            Some(size) => size,
            None => match file.get("tokenizer.ggml.tokens").and_then(Value::as_array) {
                Some(tokens) => tokens.len(),
                None => file
                    .tensor("token_embd.weight")
                    .and_then(|t| t.shape.first().copied())
                    .unwrap_or(0),
            },
        };
        let has = |name: &str| file.tensor(name).is_some();
        let config = TextConfig {
            family,
            vocab_size,
            hidden_size,
            intermediate_size: meta.count(&key("feed_forward_length"))?,
            num_hidden_layers: meta.count(&key("block_count"))?,
            num_attention_heads,
            num_key_value_heads: meta
                .optional_count(&key("attention.head_count_kv"))?
                .unwrap_or(num_attention_heads),
            head_dim,
            max_position_embeddings: meta.count(&key("context_length"))?,
            rms_norm_eps: meta.float(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: meta
                .optional_float(&key("rope.freq_base"))?
                .unwrap_or(10_000.0),
            rope_scaling: meta.rope_scaling(architecture)?,
            // Qwen2's q, k and v biases come with the family; a Llama's are its own setting.
            attention_bias: family == Family::Llama && has("blk.0.attn_q.bias"),
            mlp_bias: has("blk.0.ffn_gate.bias"),
            tie_word_embeddings: !has("output.weight"),
            bos_token_id: meta.optional_id("tokenizer.ggml.bos_token_id")?,
            eos_token_ids: meta.end_of_generation_ids()?,
            sliding: None,
        };
        config.validate().map_err(|e| meta.error(e.to_string()))?;
        Ok(config)
    }
}

impl<B: Backend> CausalLm<B> {
    /// Reads the GGUF file at `path` (llama.cpp's format, versions 2 and 3): its metadata as the
    /// model's [`TextConfig`] ([`TextConfig::from_gguf`]) and its tensors, held as `weights`
    /// says: the quantized and 16-bit matrices kept as stored ([`Weights::AsStored`], on the
    /// CPU), every matrix rounded to bf16 ([`Weights::Bf16`], on the CPU), or every tensor decoded
    /// one at a time into the policy's parameter dtype on `device` ([`Weights::F32`]). Every
    /// tensor the model needs that is missing or of another shape is named in the error.
    pub fn from_gguf(
        path: impl AsRef<Path>,
        device: &B::Device,
        policy: &Policy,
        weights: Weights,
    ) -> Result<Self, TextError> {
        Self::from_gguf_file(GgufFile::open(path)?, device, policy, weights)
    }

    /// [`Self::from_gguf`] of a file already open (to build its tokenizer from the same
    /// reading: [`crate::TextTokenizer::from_gguf`]).
    pub fn from_gguf_file(
        file: GgufFile,
        device: &B::Device,
        policy: &Policy,
        weights: Weights,
    ) -> Result<Self, TextError> {
        let file = Rc::new(file);
        let config = TextConfig::from_gguf(&file)?;
        let kept = crate::stored::kept_tensors::<B>(&file, device, policy, weights)?;
        let names: Vec<String> = kept.iter().map(|t| t.name.clone()).collect();
        let snapshots = tensor_snapshots(&file, &config, policy.param.dtype());
        let model = config.init::<B>(device);
        let model = load_snapshots_keeping(model, file.path(), snapshots, &[], &names)?;
        let stored = crate::stored::StoredMatrices::read(&file, &config, &kept, weights)?;
        Ok(stored.put_into(model).with_policy(policy))
    }
}

/// The file's tensors as snapshots under transformers' names (those llama.cpp's converter does
/// not write, such as `rope_freqs`, under their own), in `dtype`, each decoded when read.
fn tensor_snapshots(
    file: &Rc<GgufFile>,
    config: &TextConfig,
    dtype: DType,
) -> Vec<(String, TensorSnapshot)> {
    file.tensors()
        .iter()
        .map(|tensor| {
            let name = transformers_name(&tensor.name).unwrap_or_else(|| tensor.name.clone());
            let read = decoder(file.clone(), tensor.clone(), permuted_heads(config, &name));
            let snapshot = TensorSnapshot::from_closure(
                read,
                dtype,
                tensor.shape.clone().into(),
                name.split('.').map(str::to_string).collect(),
                Vec::new(),
                ParamId::new(),
            );
            (tensor.name.clone(), snapshot)
        })
        .collect()
}

/// The heads whose rows llama.cpp's converter interleaved in the tensor called `name` by
/// transformers (a Llama's q and k projections), none for the others.
pub(crate) fn permuted_heads(config: &TextConfig, name: &str) -> Option<usize> {
    match (config.family, name.rsplit('.').nth(1)) {
        (Family::Llama, Some("q_proj")) => Some(config.num_attention_heads),
        (Family::Llama, Some("k_proj")) => Some(config.num_key_value_heads),
        _ => None,
    }
}

/// What decodes `tensor` of `file` to f32, its rows put back in transformers' order when it is a
/// Llama's q or k projection of `heads` heads.
fn decoder(
    file: Rc<GgufFile>,
    tensor: GgufTensor,
    heads: Option<usize>,
) -> Rc<dyn Fn() -> Result<TensorData, TensorSnapshotError>> {
    Rc::new(move || {
        let values = file
            .dequantize(&tensor)
            .map_err(|e| TensorSnapshotError::DataError(e.to_string()))?;
        let values = match heads {
            Some(heads) => unpermute_rows(&values, tensor.shape[0], heads),
            None => values,
        };
        Ok(TensorData::new(values, tensor.shape.clone()))
    })
}

/// transformers' name for a llama.cpp tensor name, when it is one the model has.
pub(crate) fn transformers_name(gguf: &str) -> Option<String> {
    let global = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = global {
        return Some(name.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (part, kind) = rest.rsplit_once('.')?;
    let module = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    layer.parse::<usize>().ok()?;
    Some(format!("model.layers.{layer}.{module}.{kind}"))
}

/// The rows of a q or k projection (`rows` of them, `values.len() / rows` columns each) in
/// transformers' order. llama.cpp's converter stores each head's rows interleaved — the rotary
/// pairs (`i`, `i + d/2`) side by side, as its RoPE rotates adjacent values — by reshaping them
/// to `[heads, 2, d/2]` and swapping the last two axes; this swaps them back.
fn unpermute_rows(values: &[f32], rows: usize, heads: usize) -> Vec<f32> {
    let columns = values.len() / rows.max(1);
    let mut out = vec![0.0; values.len()];
    let order = stored_row_order(rows, heads);
    for (out, stored) in out.chunks_exact_mut(columns.max(1)).zip(order) {
        out.copy_from_slice(&values[stored * columns..][..columns]);
    }
    out
}

/// Where llama.cpp's converter put each of a q or k projection's `rows` rows (of `heads`
/// heads): row `r` in transformers' order is row `order[r]` in the file.
pub(crate) fn stored_row_order(rows: usize, heads: usize) -> Vec<usize> {
    let half = rows / heads.max(1) / 2;
    (0..rows)
        .map(|row| {
            // Row `row` is (head, j, i) of [heads, 2, half]; llama.cpp holds it at (head, i, j).
            let (head, j, i) = (row / (2 * half), row / half % 2, row % half);
            head * 2 * half + i * 2 + j
        })
        .collect()
}

/// A GGUF file's metadata, read for a model's settings.
struct Metadata<'a>(&'a GgufFile);

impl Metadata<'_> {
    fn error(&self, message: String) -> TextError {
        TextError::Config(format!("{}: {message}", self.0.path().display()))
    }

    fn value(&self, key: &str) -> Result<&Value, TextError> {
        self.0
            .get(key)
            .ok_or_else(|| self.error(format!("no `{key}` in the metadata")))
    }

    fn wrong(&self, key: &str, value: &Value, wanted: &str) -> TextError {
        let per_layer = if value.as_array().is_some() {
            " (a value per layer: models whose layers differ are not supported)"
        } else {
            ""
        };
        self.error(format!(
            "`{key}` is a {}, not {wanted}{per_layer}",
            value.type_name()
        ))
    }

    fn string(&self, key: &str) -> Result<&str, TextError> {
        let value = self.value(key)?;
        value
            .as_str()
            .ok_or_else(|| self.wrong(key, value, "a string"))
    }

    fn count(&self, key: &str) -> Result<usize, TextError> {
        self.optional_count(key)?
            .ok_or_else(|| self.error(format!("no `{key}` in the metadata")))
    }

    fn optional_count(&self, key: &str) -> Result<Option<usize>, TextError> {
        self.optional(key, "a count", |v| usize::try_from(v.as_u64()?).ok())
    }

    fn optional_id(&self, key: &str) -> Result<Option<u32>, TextError> {
        self.optional(key, "a token id", |v| u32::try_from(v.as_u64()?).ok())
    }

    fn float(&self, key: &str) -> Result<f64, TextError> {
        self.optional_float(key)?
            .ok_or_else(|| self.error(format!("no `{key}` in the metadata")))
    }

    fn optional_float(&self, key: &str) -> Result<Option<f64>, TextError> {
        self.optional(key, "a number", Value::as_f64)
    }

    /// The value under `key` as `read` reads it, `None` when the file has no such key, and an
    /// error saying it is not `wanted` when `read` cannot read it.
    fn optional<T>(
        &self,
        key: &str,
        wanted: &str,
        read: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<T>, TextError> {
        let Some(value) = self.0.get(key) else {
            return Ok(None);
        };
        read(value)
            .map(Some)
            .ok_or_else(|| self.wrong(key, value, wanted))
    }

    /// `{arch}.rope.scaling.type` and `.factor` (or the older `rope.scale_linear`).
    fn rope_scaling(&self, architecture: &str) -> Result<RopeScaling, TextError> {
        let key = |name: &str| format!("{architecture}.rope.{name}");
        let kind = match self.0.get(&key("scaling.type")) {
            Some(_) => Some(self.string(&key("scaling.type"))?),
            None => None,
        };
        match kind {
            None => Ok(match self.optional_float(&key("scale_linear"))? {
                Some(factor) => RopeScaling::Linear { factor },
                None => RopeScaling::None,
            }),
            Some("none") => Ok(RopeScaling::None),
            Some("linear") => match self.optional_float(&key("scaling.factor"))? {
                Some(factor) => Ok(RopeScaling::Linear { factor }),
                None => Err(self.error(format!(
                    "linear RoPE scaling without `{}`",
                    key("scaling.factor")
                ))),
            },
            Some(other) => Err(self.error(format!(
                "RoPE scaling `{other}` is not supported; kiln-text scales positions linearly \
                 or not at all"
            ))),
        }
    }

    /// The tokens llama.cpp ends generation on: end of sequence, and end of turn where the file
    /// names another.
    fn end_of_generation_ids(&self) -> Result<Vec<u32>, TextError> {
        let mut ids = Vec::new();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"] {
            if let Some(id) = self.optional_id(key)?
                && !ids.contains(&id)
            {
                ids.push(id);
            }
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_names_become_transformers_names() {
        for (gguf, hf) in [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output.weight", "lm_head.weight"),
            ("output_norm.weight", "model.norm.weight"),
            (
                "blk.12.attn_k.bias",
                "model.layers.12.self_attn.k_proj.bias",
            ),
            (
                "blk.0.ffn_norm.weight",
                "model.layers.0.post_attention_layernorm.weight",
            ),
            (
                "blk.3.ffn_down.weight",
                "model.layers.3.mlp.down_proj.weight",
            ),
        ] {
            assert_eq!(transformers_name(gguf).as_deref(), Some(hf));
        }
        for other in [
            "rope_freqs.weight",
            "blk.x.attn_q.weight",
            "blk.0.attn_qkv.weight",
        ] {
            assert_eq!(transformers_name(other), None, "{other}");
        }
    }

    /// llama.cpp's `permute`: `w.reshape(heads, 2, d/2, cols).swapaxes(1, 2)`, undone.
    #[test]
    fn unpermuting_inverts_llama_cpps_permutation() {
        let (heads, head_dim, columns) = (3, 8, 2);
        let rows = heads * head_dim;
        let original: Vec<f32> = (0..rows * columns).map(|i| i as f32).collect();
        let half = head_dim / 2;
        let mut permuted = vec![0.0; original.len()];
        for head in 0..heads {
            for j in 0..2 {
                for i in 0..half {
                    let (from, to) = (head * head_dim + j * half + i, head * head_dim + i * 2 + j);
                    permuted[to * columns..][..columns]
                        .copy_from_slice(&original[from * columns..][..columns]);
                }
            }
        }
        assert_ne!(permuted, original);
        assert_eq!(unpermute_rows(&permuted, rows, heads), original);
    }
}
