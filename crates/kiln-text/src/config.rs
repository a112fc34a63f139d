//! Language-model configurations as Hugging Face `config.json` describes them, with transformers'
//! defaults (`LlamaConfig`, `Qwen2Config`) for missing keys and named constructors for the
//! released sizes kiln's workloads use.
//!
//! ```
//! use kiln_text::{Family, TextConfig};
//!
//! let json = r#"{"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
//!                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
//!                "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "rope_scaling": null,
//!                "tie_word_embeddings": true, "vocab_size": 49152,
//!                "max_position_embeddings": 8192}"#;
//! let config = TextConfig::from_hf_json(json)?;
//! assert_eq!(config, TextConfig::smollm2_135m());
//! assert_eq!((config.family, config.head_dim()), (Family::Llama, 64));
//! # Ok::<(), kiln_text::TextError>(())
//! ```

use std::path::Path;

use kiln_core::read_config;
use kiln_core::{MAX_LAYERS, MAX_WIDTH, check_limits};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::TextError;

/// Which transformers class a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Family {
    /// `LlamaForCausalLM` (SmolLM2, TinyLlama).
    Llama,
    /// `Qwen2ForCausalLM`: Llama with biases on the q, k and v projections.
    Qwen2,
    /// `Gemma3ForCausalLM` (`gemma3_text`): embeddings scaled by √hidden, RMSNorms of
    /// `(1 + weight)`, norms on both sides of each block, an RMSNorm of each query and key head,
    /// a GELU-tanh gate, and sliding-window layers with their own RoPE base ([`SlidingLayers`]).
    Gemma3,
}

/// The `model_type`s kiln-text reads.
pub const MODEL_TYPES: [&str; 3] = ["llama", "qwen2", "gemma3_text"];

/// Gemma 3's sliding-window layers: which layers attend only to the last `window` positions,
/// and the RoPE base they rotate by (the full layers rotate by [`TextConfig::rope_theta`]).
/// kiln-text reads such a model at most `window` positions long (its
/// `max_position_embeddings` is cut to the window), where a sliding layer attends as a full
/// one does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlidingLayers {
    /// Per layer, whether it slides (`layer_types`' `sliding_attention`).
    pub layers: Vec<bool>,
    /// The window, in positions.
    pub window: usize,
    /// The sliding layers' RoPE base θ (`rope_local_base_freq`).
    pub rope_theta: f64,
}

/// How rotary embeddings stretch positions (transformers' `rope_type`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Positions as they are (`rope_scaling: null`, `rope_type: "default"`).
    None,
    /// Positions divided by `factor` (`rope_type: "linear"`).
    Linear {
        /// The divisor.
        factor: f64,
    },
}

/// A decoder-only language model's shape (transformers `LlamaConfig` / `Qwen2Config`; in
/// kiln's own saved models, these fields as they are).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextConfig {
    /// The model class.
    pub family: Family,
    /// Token ids `0 .. vocab_size`.
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// SwiGLU hidden width.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key and value heads (grouped-query attention when fewer than the query heads).
    pub num_key_value_heads: usize,
    /// Columns per head (`hidden_size / num_attention_heads` unless given).
    pub head_dim: Option<usize>,
    /// The longest sequence the positions cover.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// RoPE position scaling.
    pub rope_scaling: RopeScaling,
    /// Biases on q, k, v and o (Llama's `attention_bias`; Qwen2 has q, k, v biases always).
    pub attention_bias: bool,
    /// Biases on the MLP's projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// Whether `lm_head` is the token embedding matrix.
    pub tie_word_embeddings: bool,
    /// Token that begins a sequence, when the checkpoint names one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation (`eos_token_id`, one or a list).
    pub eos_token_ids: Vec<u32>,
    /// Gemma 3's sliding-window layers (none in Llama and Qwen2).
    #[serde(default)]
    pub sliding: Option<SlidingLayers>,
}

impl TextConfig {
    /// HuggingFaceTB/SmolLM2-135M(-Instruct): the language model of fVLM.
    pub fn smollm2_135m() -> Self {
        TextConfig {
            family: Family::Llama,
            vocab_size: 49152,
            hidden_size: 576,
            intermediate_size: 1536,
            num_hidden_layers: 30,
            num_attention_heads: 9,
            num_key_value_heads: 3,
            head_dim: None,
            max_position_embeddings: 8192,
            rms_norm_eps: 1e-5,
            rope_theta: 100_000.0,
            rope_scaling: RopeScaling::None,
            attention_bias: false,
            mlp_bias: false,
            tie_word_embeddings: true,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            sliding: None,
        }
    }

    /// TinyLlama/TinyLlama-1.1B (LatentWire's Llama).
    pub fn tinyllama_1_1b() -> Self {
        TextConfig {
            vocab_size: 32000,
            hidden_size: 2048,
            intermediate_size: 5632,
            num_hidden_layers: 22,
            num_attention_heads: 32,
            num_key_value_heads: 4,
            max_position_embeddings: 2048,
            rope_theta: 10_000.0,
            tie_word_embeddings: false,
            ..Self::smollm2_135m()
        }
    }

    /// Qwen/Qwen2-0.5B (LatentWire's Qwen2).
    pub fn qwen2_0_5b() -> Self {
        TextConfig {
            family: Family::Qwen2,
            vocab_size: 151_936,
            hidden_size: 896,
            intermediate_size: 4864,
            num_hidden_layers: 24,
            num_attention_heads: 14,
            num_key_value_heads: 2,
            max_position_embeddings: 131_072,
            rms_norm_eps: 1e-6,
            rope_theta: 1_000_000.0,
            tie_word_embeddings: true,
            bos_token_id: None,
            eos_token_ids: vec![151_643],
            ..Self::smollm2_135m()
        }
    }

    /// Columns per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Query heads per key/value head.
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads.max(1)
    }

    /// Whether q, k and v have biases.
    pub fn qkv_bias(&self) -> bool {
        self.family == Family::Qwen2 || self.attention_bias
    }

    /// Reads `config.json` at `path` (a file, or a checkpoint directory holding one).
    pub fn from_hf_config(path: impl AsRef<Path>) -> Result<Self, TextError> {
        let (file, value) = read_config(path.as_ref())?;
        Self::from_hf_value(value).map_err(|e| match e {
            TextError::Config(e) => TextError::Config(format!("{}: {e}", file.display())),
            other => other,
        })
    }

    /// Parses the text of a `config.json`.
    pub fn from_hf_json(json: &str) -> Result<Self, TextError> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| TextError::Config(e.to_string()))?;
        Self::from_hf_value(value)
    }

    /// [`Self::from_hf_json`] on the parsed JSON.
    pub fn from_hf_value(value: Value) -> Result<Self, TextError> {
        let model_type = value
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| TextError::Config("no `model_type`".into()))?;
        let family = match model_type {
            "llama" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "gemma3_text" => Family::Gemma3,
            other => {
                return Err(TextError::Config(format!(
                    "model_type `{other}` is not supported; kiln-text reads {}",
                    MODEL_TYPES.join(", ")
                )));
            }
        };
        // transformers' LlamaConfig begins and ends with ids 1 and 2 unless told otherwise (also
        // `null`); Qwen2Config names none.
        let defaults = |key: &str, llama: u32| match (value.get(key), family) {
            (None, Family::Llama) => vec![llama],
            _ => Vec::new(),
        };
        let (bos, eos) = (defaults("bos_token_id", 1), defaults("eos_token_id", 2));
        let raw: RawConfig =
            kiln_core::config_from_json(value).map_err(|e| TextError::Config(e.to_string()))?;
        let mut config = raw.into_config(family)?;
        if config.bos_token_id.is_none() {
            config.bos_token_id = bos.first().copied();
        }
        if config.eos_token_ids.is_empty() {
            config.eos_token_ids = eos;
        }
        Ok(config)
    }

    /// Refuses shapes the model cannot be built with (heads that do not divide the width, or
    /// query heads that are not a multiple of the key/value heads) and settings outside their
    /// domain (`rms_norm_eps`, `rope_theta` and a scaling factor must be finite and > 0).
    pub fn validate(&self) -> Result<(), TextError> {
        let problem = if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            Some("num_attention_heads and num_key_value_heads must be positive".to_string())
        } else if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            Some(format!(
                "num_attention_heads = {} is not a multiple of num_key_value_heads = {}",
                self.num_attention_heads, self.num_key_value_heads
            ))
        } else if self.head_dim.is_none()
            && !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            Some(format!(
                "hidden_size = {} is not a multiple of num_attention_heads = {} (and no head_dim)",
                self.hidden_size, self.num_attention_heads
            ))
        } else if self.head_dim() == 0 {
            Some("head_dim = 0: each head needs at least one pair of dimensions".to_string())
        } else if !self.head_dim().is_multiple_of(2) {
            Some(format!(
                "head_dim = {} is odd: RoPE rotates pairs",
                self.head_dim()
            ))
        } else if let Err(over) = check_limits(&[
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("vocab_size", self.vocab_size, MAX_WIDTH),
            ("hidden_size", self.hidden_size, MAX_WIDTH),
            ("intermediate_size", self.intermediate_size, MAX_WIDTH),
            ("num_attention_heads", self.num_attention_heads, MAX_WIDTH),
            ("num_key_value_heads", self.num_key_value_heads, MAX_WIDTH),
            ("head_dim", self.head_dim.unwrap_or(0), MAX_WIDTH),
        ]) {
            Some(over.to_string())
        } else if self.vocab_size == 0 || self.hidden_size == 0 {
            Some("vocab_size and hidden_size must be positive".to_string())
        } else if self.intermediate_size == 0 || self.max_position_embeddings == 0 {
            Some("intermediate_size and max_position_embeddings must be positive".to_string())
        } else if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps.is_finite()) {
            // RMSNorm divides by sqrt(mean square + eps): eps ≤ 0 divides by zero.
            Some(format!(
                "rms_norm_eps = {}: must be a finite number > 0",
                self.rms_norm_eps
            ))
        } else if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            // The rotation frequencies are θ^(−2i/d): θ ≤ 0 makes them NaN.
            Some(format!(
                "rope_theta = {}: must be a finite number > 0",
                self.rope_theta
            ))
        } else if let RopeScaling::Linear { factor } = self.rope_scaling
            && !(factor > 0.0 && factor.is_finite())
        {
            Some(format!(
                "rope_scaling factor = {factor}: must be a finite number > 0"
            ))
        } else {
            None
        };
        problem.map_or(Ok(()), |p| Err(TextError::Config(p)))
    }
}

/// `config.json` as transformers writes it: absent keys are `None` and get the family's default.
#[derive(Debug, Deserialize)]
struct RawConfig {
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    hidden_act: Option<String>,
    /// Gemma's name for `hidden_act`.
    hidden_activation: Option<String>,
    /// Gemma 3: `sliding_attention` or `full_attention` per layer, or every
    /// `sliding_window_pattern`-th layer full (older configs).
    layer_types: Option<Vec<String>>,
    sliding_window: Option<usize>,
    sliding_window_pattern: Option<usize>,
    rope_local_base_freq: Option<f64>,
    query_pre_attn_scalar: Option<f64>,
    final_logit_softcapping: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    /// transformers 4: `rope_theta` and `rope_scaling`.
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
    /// transformers 5: both in `rope_parameters`.
    rope_parameters: Option<Value>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    tie_word_embeddings: Option<bool>,
    use_sliding_window: Option<bool>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
}

impl RawConfig {
    fn into_config(self, family: Family) -> Result<TextConfig, TextError> {
        let activation = self
            .hidden_act
            .as_deref()
            .or(self.hidden_activation.as_deref());
        let expected = match family {
            Family::Gemma3 => "gelu_pytorch_tanh",
            Family::Llama | Family::Qwen2 => "silu",
        };
        if let Some(act) = activation.filter(|&a| a != expected) {
            return Err(TextError::Config(format!(
                "hidden_act `{act}`: kiln-text's {family:?} MLP computes {expected}"
            )));
        }
        for (key, value) in [
            ("final_logit_softcapping", self.final_logit_softcapping),
            ("attn_logit_softcapping", self.attn_logit_softcapping),
        ] {
            if let Some(cap) = value {
                return Err(TextError::Config(format!(
                    "{key} = {cap}: soft-capped logits are not supported"
                )));
            }
        }
        if self.use_sliding_window == Some(true) {
            return Err(TextError::Config(
                "use_sliding_window = true: sliding-window attention is not supported".into(),
            ));
        }
        // transformers' LlamaConfig / Qwen2Config defaults.
        let (vocab, hidden, intermediate, max_positions) = match family {
            Family::Llama => (32000, 4096, 11008, 2048),
            Family::Qwen2 => (151_936, 4096, 22016, 32768),
            Family::Gemma3 => (262_208, 2304, 9216, 131_072),
        };
        let heads = self.num_attention_heads.unwrap_or(32);
        let sizes = [
            ("vocab_size", self.vocab_size, vocab),
            ("hidden_size", self.hidden_size, hidden),
            ("intermediate_size", self.intermediate_size, intermediate),
            ("num_hidden_layers", self.num_hidden_layers, 32),
            ("num_attention_heads", self.num_attention_heads, 32),
        ];
        let absent: Vec<(&str, usize)> = sizes
            .iter()
            .filter(|(_, given, _)| given.is_none())
            .map(|&(key, _, default)| (key, default))
            .collect();
        if !absent.is_empty() {
            // A checkpoint of another size then fails its shape check: say where the sizes
            // came from.
            let keys: Vec<&str> = absent.iter().map(|(key, _)| *key).collect();
            let values: Vec<String> = absent.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            log::warn!(
                "config.json gives no {}: transformers' defaults taken ({})",
                keys.join(", "),
                values.join(", ")
            );
        }
        // Gemma 3 in transformers 5 gives each layer type its own `rope_parameters`.
        let per_type = |kind: &str| {
            (self.rope_parameters.as_ref())
                .and_then(|p| p.get(kind))
                .filter(|p| p.is_object())
        };
        let full_parameters = per_type("full_attention").or(self.rope_parameters.as_ref());
        let (rope_theta, rope_scaling) =
            rope(full_parameters, self.rope_theta, self.rope_scaling.as_ref())?;
        let layers = self.num_hidden_layers.unwrap_or(32);
        let sliding = match family {
            Family::Gemma3 => Some(self.sliding_layers(layers, per_type("sliding_attention"))?),
            Family::Llama | Family::Qwen2 => None,
        };
        let head_dim = self.head_dim.or((family == Family::Gemma3).then_some(256));
        if let (Some(scalar), Some(dim)) = (self.query_pre_attn_scalar, head_dim)
            && scalar != dim as f64
        {
            return Err(TextError::Config(format!(
                "query_pre_attn_scalar = {scalar}: kiln-text scales attention scores by \
                 1/√head_dim = 1/√{dim}"
            )));
        }
        let mut max_position_embeddings = self.max_position_embeddings.unwrap_or(max_positions);
        if let Some(sliding) = sliding.as_ref().filter(|s| s.layers.contains(&true)) {
            max_position_embeddings = max_position_embeddings.min(sliding.window);
        }
        let config = TextConfig {
            family,
            vocab_size: self.vocab_size.unwrap_or(vocab),
            hidden_size: self.hidden_size.unwrap_or(hidden),
            intermediate_size: self.intermediate_size.unwrap_or(intermediate),
            num_hidden_layers: layers,
            num_attention_heads: heads,
            num_key_value_heads: self.num_key_value_heads.unwrap_or(heads),
            head_dim,
            max_position_embeddings,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            attention_bias: self.attention_bias.unwrap_or(false),
            mlp_bias: self.mlp_bias.unwrap_or(false),
            tie_word_embeddings: (self.tie_word_embeddings).unwrap_or(family == Family::Gemma3),
            bos_token_id: token_ids(self.bos_token_id.as_ref(), "bos_token_id")?
                .first()
                .copied(),
            eos_token_ids: token_ids(self.eos_token_id.as_ref(), "eos_token_id")?,
            sliding,
        };
        config.validate()?;
        Ok(config)
    }

    /// Gemma 3's sliding layers among `layers`: from `layer_types`, else every
    /// `sliding_window_pattern`-th layer full (transformers' default 6), the rest sliding; their
    /// RoPE base from `sliding_parameters` (transformers 5) or `rope_local_base_freq`.
    fn sliding_layers(
        &self,
        layers: usize,
        sliding_parameters: Option<&Value>,
    ) -> Result<SlidingLayers, TextError> {
        let kinds = match &self.layer_types {
            Some(types) => (types.iter())
                .map(|kind| match kind.as_str() {
                    "sliding_attention" => Ok(true),
                    "full_attention" => Ok(false),
                    other => Err(TextError::Config(format!(
                        "layer_types: `{other}` is neither sliding_attention nor full_attention"
                    ))),
                })
                .collect::<Result<Vec<bool>, _>>()?,
            None => {
                let pattern = self.sliding_window_pattern.unwrap_or(6).max(1);
                (0..layers).map(|i| (i + 1) % pattern != 0).collect()
            }
        };
        if kinds.len() != layers {
            return Err(TextError::Config(format!(
                "layer_types names {} layers and num_hidden_layers is {layers}",
                kinds.len()
            )));
        }
        let (rope_theta, scaling) = rope(sliding_parameters, self.rope_local_base_freq, None)?;
        if scaling != RopeScaling::None {
            return Err(TextError::Config(
                "the sliding layers' RoPE is scaled: kiln-text reads unscaled sliding layers"
                    .into(),
            ));
        }
        Ok(SlidingLayers {
            layers: kinds,
            window: self.sliding_window.unwrap_or(4096),
            rope_theta,
        })
    }
}

/// θ and the scaling from transformers 5's `rope_parameters`, or 4's `rope_theta` and
/// `rope_scaling` (θ 10 000 when neither gives it).
fn rope(
    parameters: Option<&Value>,
    theta: Option<f64>,
    scaling: Option<&Value>,
) -> Result<(f64, RopeScaling), TextError> {
    let parameters = parameters.filter(|p| !p.is_null());
    let theta = parameters
        .and_then(|p| p.get("rope_theta"))
        .and_then(Value::as_f64)
        .or(theta)
        .unwrap_or(10_000.0);
    let Some(scaling) = parameters.or(scaling.filter(|s| !s.is_null())) else {
        return Ok((theta, RopeScaling::None));
    };
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => {
            let factor = scaling.get("factor").and_then(Value::as_f64);
            match factor {
                Some(factor) if factor > 0.0 => RopeScaling::Linear { factor },
                _ => {
                    return Err(TextError::Config(
                        "rope_scaling `linear` needs a positive `factor`".into(),
                    ));
                }
            }
        }
        other => {
            return Err(TextError::Config(format!(
                "rope_type `{other}` is not supported; kiln-text reads `default` and `linear`"
            )));
        }
    };
    Ok((theta, scaling))
}

/// A token id or a list of them (`eos_token_id` is either), or none.
fn token_ids(value: Option<&Value>, key: &str) -> Result<Vec<u32>, TextError> {
    let one = |v: &Value| {
        v.as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| TextError::Config(format!("{key}: `{v}` is not a token id")))
    };
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(ids)) => ids.iter().map(one).collect(),
        Some(id) => Ok(vec![one(id)?]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3's config as the Hub's older files write it: one RoPE base for the full layers, the
    /// sliding layers' apart, every sixth layer full; the window bounds the positions read.
    #[test]
    fn gemma3_configs_name_their_sliding_layers() {
        let json = r#"{"model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048,
            "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 256, "query_pre_attn_scalar": 256, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "sliding_window": 512, "sliding_window_pattern": 6,
            "max_position_embeddings": 32768, "vocab_size": 262144,
            "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": null}"#;
        let config = TextConfig::from_hf_json(json).unwrap();
        assert_eq!(config.family, Family::Gemma3);
        let sliding = config.sliding.clone().unwrap();
        let full: Vec<usize> = (0..8).filter(|&i| !sliding.layers[i]).collect();
        assert_eq!(full, [5]);
        assert_eq!((sliding.window, sliding.rope_theta), (512, 10_000.0));
        assert_eq!(
            (config.rope_theta, config.max_position_embeddings),
            (1e6, 512)
        );
        assert!(config.tie_word_embeddings);
        let refused = |extra: &str| {
            let json = json.replace("\"vocab_size\"", &format!("{extra}, \"vocab_size\""));
            TextConfig::from_hf_json(&json).unwrap_err().to_string()
        };
        assert!(refused(r#""attn_logit_softcapping": 50.0"#).contains("soft-capped"));
        let scalar = r#""query_pre_attn_scalar": 224, "x": 0"#;
        let error =
            TextConfig::from_hf_json(&json.replace(r#""query_pre_attn_scalar": 256"#, scalar));
        assert!(
            error
                .unwrap_err()
                .to_string()
                .contains("query_pre_attn_scalar")
        );
        let silu = json.replace("gelu_pytorch_tanh", "silu");
        assert!(
            TextConfig::from_hf_json(&silu)
                .unwrap_err()
                .to_string()
                .contains("gelu_pytorch_tanh")
        );
    }

    #[test]
    fn defaults_follow_transformers() {
        let llama = TextConfig::from_hf_json(r#"{"model_type": "llama"}"#).unwrap();
        assert_eq!(
            (
                llama.vocab_size,
                llama.hidden_size,
                llama.num_key_value_heads
            ),
            (32000, 4096, 32)
        );
        assert_eq!((llama.rope_theta, llama.rms_norm_eps), (10_000.0, 1e-6));
        let qwen = TextConfig::from_hf_json(r#"{"model_type": "qwen2"}"#).unwrap();
        assert!(qwen.qkv_bias() && !llama.qkv_bias());
        assert_eq!(qwen.max_position_embeddings, 32768);
    }

    #[test]
    fn reads_both_rope_forms() {
        let v5 = r#"{"model_type": "llama", "rope_parameters":
                     {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}"#;
        let v4 = r#"{"model_type": "llama", "rope_theta": 500.0,
                     "rope_scaling": {"type": "linear", "factor": 2.0}}"#;
        for json in [v5, v4] {
            let config = TextConfig::from_hf_json(json).unwrap();
            assert_eq!(config.rope_theta, 500.0);
            assert_eq!(config.rope_scaling, RopeScaling::Linear { factor: 2.0 });
        }
    }

    #[test]
    fn explains_what_it_cannot_read() {
        let err = |json: &str| TextConfig::from_hf_json(json).unwrap_err().to_string();
        assert!(err(r#"{"model_type": "gpt2"}"#).contains("llama, qwen2"));
        assert!(err(r#"{"hidden_size": 8}"#).contains("model_type"));
        let yarn = r#"{"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4}}"#;
        assert!(err(yarn).contains("`yarn` is not supported"));
        let heads =
            r#"{"model_type": "llama", "num_attention_heads": 6, "num_key_value_heads": 4}"#;
        assert!(err(heads).contains("multiple of num_key_value_heads"));
        let empty_heads = r#"{"model_type": "llama", "head_dim": 0}"#;
        assert!(err(empty_heads).contains("head_dim = 0: each head needs"));
        let act = r#"{"model_type": "llama", "hidden_act": "gelu"}"#;
        assert!(err(act).contains("silu"));
    }

    #[test]
    fn stop_tokens_come_as_one_or_a_list() {
        let one = TextConfig::from_hf_json(r#"{"model_type": "llama", "eos_token_id": 2}"#);
        assert_eq!(one.unwrap().eos_token_ids, [2]);
        let list = r#"{"model_type": "llama", "eos_token_id": [2, 7], "bos_token_id": null}"#;
        let list = TextConfig::from_hf_json(list).unwrap();
        assert_eq!((list.eos_token_ids, list.bos_token_id), (vec![2, 7], None));
        let absent = TextConfig::from_hf_json(r#"{"model_type": "llama"}"#).unwrap();
        assert_eq!(
            (absent.eos_token_ids, absent.bos_token_id),
            (vec![2], Some(1))
        );
        let qwen = TextConfig::from_hf_json(r#"{"model_type": "qwen2"}"#).unwrap();
        assert_eq!((qwen.eos_token_ids, qwen.bos_token_id), (vec![], None));
    }
}
