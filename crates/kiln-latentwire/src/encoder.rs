//! The interlingua encoder: LatentWire's `InterlinguaEncoder` (`latentwire/models.py` at
//! 220ce571) as its train.py builds it, the byte encoder with one shared pooler.
//!
//! A text's UTF-8 bytes (cut at `max_bytes`, right-padded with byte 0) → a byte embedding plus
//! sinusoidal positions → a post-norm transformer encoder (PyTorch's `nn.TransformerEncoder`:
//! `x = LN₁(x + attn(x)); x = LN₂(x + W₂ gelu(W₁ x))`) → a LayerNorm → the latent pooler: `M`
//! learned queries attend over the bytes (`out = attn(q, bytes) + q`), a sigmoid gate mixes the
//! result with the queries (`out · g + q · (1 − g)`, `g = σ(W LN(out))`), and a residual
//! feed-forward `out + W₂ gelu(W₁ LN(out))` follows: `[batch, M, d_z]`.
//!
//! As in LatentWire, the padding bytes are attended to (its encoder is never given a padding
//! mask), so a text's latents depend a little on the longest text of its batch.

use std::path::Path;

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{
    Embedding, EmbeddingConfig, Initializer, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::tensor::activation::sigmoid;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_core::CheckpointError;
use kiln_transformer::projection::{Then, project};
use kiln_transformer::{
    Activation, PACKED_ATTENTION_KEYS, PackedAttention, Pass, PreparedWeights, Settings,
};

/// The interlingua's sizes: LatentWire's `InterlinguaEncoder(d_z, n_layers, n_heads, ff_mult,
/// latent_len)` with train.py's defaults.
#[derive(Config, Debug)]
pub struct EncoderConfig {
    /// `M`, the latents per text (`--latent_len`).
    pub latents: usize,
    /// The latents' width `d_z`.
    #[config(default = 256)]
    pub width: usize,
    /// Transformer layers over the bytes.
    #[config(default = 6)]
    pub layers: usize,
    /// Attention heads, in the encoder and the pooler.
    #[config(default = 8)]
    pub heads: usize,
    /// The feed-forward width in multiples of `width`.
    #[config(default = 4)]
    pub ff_mult: usize,
    /// The bytes of a text the encoder reads (`ByteTokenizer(max_bytes)`).
    #[config(default = 512)]
    pub max_bytes: usize,
}

/// Texts as the byte encoder reads them: each text's UTF-8 bytes, cut at `max_bytes` (which may
/// split a character, as LatentWire's `ByteTokenizer` does) and right-padded with byte 0 to the
/// longest (`core_utils.collate_bytes`; a batch of empty texts is one padding byte long).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByteBatch {
    bytes: Vec<i32>,
    texts: usize,
    length: usize,
}

impl ByteBatch {
    /// The bytes of `texts`, each cut at `max_bytes`.
    pub fn new<S: AsRef<str>>(texts: &[S], max_bytes: usize) -> ByteBatch {
        let cut = |text: &S| text.as_ref().len().min(max_bytes);
        let length = texts.iter().map(cut).max().unwrap_or(0).max(1);
        let mut bytes = vec![0; texts.len() * length];
        for (row, text) in bytes.chunks_exact_mut(length).zip(texts) {
            for (slot, &byte) in row.iter_mut().zip(&text.as_ref().as_bytes()[..cut(text)]) {
                *slot = i32::from(byte);
            }
        }
        ByteBatch {
            bytes,
            texts: texts.len(),
            length,
        }
    }

    /// The bytes, row by row.
    pub fn bytes(&self) -> &[i32] {
        &self.bytes
    }

    /// `[texts, bytes]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.texts, self.length]
    }

    fn tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        let data = TensorData::new(self.bytes.clone(), self.dims());
        Tensor::from_data(data, device)
    }
}

/// One post-norm layer of `nn.TransformerEncoder` (exact GELU, no dropout).
#[derive(Module, Debug)]
pub struct EncoderLayer<B: Backend> {
    /// Self-attention over the bytes.
    pub self_attn: PackedAttention<B>,
    /// `d → ff_mult · d`.
    pub linear1: Linear<B>,
    /// `ff_mult · d → d`.
    pub linear2: Linear<B>,
    /// After the attention's residual add.
    pub norm1: LayerNorm<B>,
    /// After the feed-forward's residual add.
    pub norm2: LayerNorm<B>,
}

impl<B: Backend> EncoderLayer<B> {
    fn forward(&self, x: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let attended = self.self_attn.attend_self(x.clone(), pass);
        let x = pass.norm(
            &self.norm1,
            add_projected(&self.self_attn.out_proj, attended, x, pass),
        );
        let hidden = project(&self.linear1, x.clone(), gelu(), pass);
        pass.norm(&self.norm2, add_projected(&self.linear2, hidden, x, pass))
    }
}

/// LatentWire's `ByteEncoder`: byte embedding + sinusoidal positions → post-norm layers → LN.
#[derive(Module, Debug)]
pub struct ByteEncoder<B: Backend> {
    /// `[256, d]`.
    pub byte_emb: Embedding<B>,
    /// The transformer layers (`encoder.layers.{i}`).
    pub layers: Vec<EncoderLayer<B>>,
    /// The final LayerNorm.
    pub ln: LayerNorm<B>,
}

impl<B: Backend> ByteEncoder<B> {
    /// Every byte's features `[batch, bytes, d]`.
    fn forward(&self, bytes: Tensor<B, 2, Int>, pass: &Pass) -> Tensor<B, 3> {
        let [_, length] = bytes.dims();
        let width = self.ln.gamma.dims()[0];
        let positions: Tensor<B, 2> = Tensor::from_data(sinusoids(length, width), &bytes.device());
        let x = self.byte_emb.forward(bytes) + positions.unsqueeze();
        let x = self
            .layers
            .iter()
            .fold(x, |x, layer| layer.forward(x, pass));
        pass.norm(&self.ln, x)
    }
}

/// LatentWire's `LatentPooler`: `M` learned queries read the bytes' features.
#[derive(Module, Debug)]
pub struct LatentPooler<B: Backend> {
    /// The queries `[M, d]`.
    pub latent: Param<Tensor<B, 2>>,
    /// The queries' attention over the bytes.
    pub cross_attn: PackedAttention<B>,
    /// The gate's LayerNorm (`gate.0`).
    pub gate_norm: LayerNorm<B>,
    /// The gate, `σ(gate(gate_norm(out)))` per slot and channel (`gate.1`).
    pub gate: Linear<B>,
    /// The feed-forward's LayerNorm (`ff.0`).
    pub ff_norm: LayerNorm<B>,
    /// `d → 2d` (`ff.1`).
    pub ff_in: Linear<B>,
    /// `2d → d` (`ff.3`).
    pub ff_out: Linear<B>,
}

impl<B: Backend> LatentPooler<B> {
    /// `latents` queries of width `d` over `heads` heads, initialised as LatentWire's (queries
    /// N(0, 1/d), PyTorch's defaults elsewhere).
    pub(crate) fn init(latents: usize, d: usize, heads: usize, device: &B::Device) -> Self {
        let linear = |inputs, outputs| LinearConfig::new(inputs, outputs).init(device);
        let norm = || LayerNormConfig::new(d).init(device);
        let queries = Initializer::Normal {
            mean: 0.0,
            std: (d as f64).powf(-0.5),
        };
        LatentPooler {
            latent: queries.init([latents, d], device),
            cross_attn: PackedAttention::init(d, heads, device),
            gate_norm: norm(),
            gate: linear(d, d),
            ff_norm: norm(),
            ff_in: linear(d, 2 * d),
            ff_out: linear(2 * d, d),
        }
    }

    /// The latents `[batch, M, d]` read from `features` `[batch, tokens, d]`.
    pub(crate) fn forward(&self, features: Tensor<B, 3>, pass: &Pass) -> Tensor<B, 3> {
        let [batch, _, width] = features.dims();
        let latent = self.latent.val();
        let queries = latent.clone().unsqueeze_dim::<3>(0);
        let queries = queries.expand([batch, latent.dims()[0], width]);
        let attended = self.cross_attn.attend_from(latent, features, pass);
        let out = add_projected(&self.cross_attn.out_proj, attended, queries.clone(), pass);
        let normed = pass.norm(&self.gate_norm, out.clone());
        let gate = sigmoid(project(&self.gate, normed, Then::Nothing, pass));
        // out · g + q · (1 − g)
        let out = queries.clone() + gate * (out - queries);
        let hidden = project(
            &self.ff_in,
            pass.norm(&self.ff_norm, out.clone()),
            gelu(),
            pass,
        );
        add_projected(&self.ff_out, hidden, out, pass)
    }
}

/// The interlingua: the byte encoder and the pooler every language model's latents come from
/// (`shared_pooler`; LatentWire's per-model private poolers are off in its train.py and not
/// built).
#[derive(Module, Debug)]
pub struct InterlinguaEncoder<B: Backend> {
    /// The byte encoder.
    pub backbone: ByteEncoder<B>,
    /// The latent pooler.
    pub shared_pooler: LatentPooler<B>,
    #[module(skip)]
    max_bytes: usize,
    #[module(skip)]
    prepared: PreparedWeights,
}

impl EncoderConfig {
    /// A new encoder initialised as LatentWire's (PyTorch's defaults: N(0, 1) byte embeddings,
    /// Kaiming-uniform linears, Xavier-uniform packed attention projections, queries
    /// N(0, 1/d)). PyTorch's `nn.TransformerEncoder` starts all its layers as copies of one;
    /// here each layer is drawn on its own.
    pub fn init<B: Backend>(&self, device: &B::Device) -> InterlinguaEncoder<B> {
        let d = self.width;
        let linear = |inputs, outputs| LinearConfig::new(inputs, outputs).init(device);
        let norm = || LayerNormConfig::new(d).init(device);
        let layer = || EncoderLayer {
            self_attn: PackedAttention::init(d, self.heads, device),
            linear1: linear(d, self.ff_mult * d),
            linear2: linear(self.ff_mult * d, d),
            norm1: norm(),
            norm2: norm(),
        };
        InterlinguaEncoder {
            backbone: ByteEncoder {
                byte_emb: EmbeddingConfig::new(256, d).init(device),
                layers: (0..self.layers).map(|_| layer()).collect(),
                ln: norm(),
            },
            shared_pooler: LatentPooler::init(self.latents, d, self.heads, device),
            max_bytes: self.max_bytes,
            prepared: PreparedWeights::default(),
        }
    }
}

impl<B: Backend> InterlinguaEncoder<B> {
    /// The latents `[texts, M, d_z]` of `texts`.
    pub fn encode<S: AsRef<str>>(&self, texts: &[S]) -> Tensor<B, 3> {
        self.forward(&ByteBatch::new(texts, self.max_bytes))
    }

    /// The latents `[texts, M, d_z]` of texts already read as bytes.
    pub fn forward(&self, bytes: &ByteBatch) -> Tensor<B, 3> {
        let pass = Pass::new(&Settings::default(), &self.prepared, None);
        let bytes = bytes.tensor(&self.backbone.byte_emb.weight.device());
        let features = self.backbone.forward(bytes, &pass);
        self.shared_pooler.forward(features, &pass)
    }

    /// The bytes of a text the encoder reads.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// The encoder with the weights of the checkpoint directory `dir` (`model.safetensors`
    /// holding LatentWire's `InterlinguaEncoder.state_dict()` under its names).
    pub fn with_weights(self, dir: &Path) -> Result<Self, CheckpointError> {
        let mut loaded = kiln_core::load_checkpoint(self, dir, REMAPPING, &[])?;
        loaded.prepared = PreparedWeights::default();
        Ok(loaded)
    }
}

/// LatentWire's state-dict names → this module's paths.
const REMAPPING: &[(&str, &str)] = &[
    (r"^backbone\.encoder\.layers\.", "backbone.layers."),
    PACKED_ATTENTION_KEYS,
    (r"^shared_pooler\.gate\.0\.", "shared_pooler.gate_norm."),
    (r"^shared_pooler\.gate\.1\.", "shared_pooler.gate."),
    (r"^shared_pooler\.ff\.0\.", "shared_pooler.ff_norm."),
    (r"^shared_pooler\.ff\.1\.", "shared_pooler.ff_in."),
    (r"^shared_pooler\.ff\.3\.", "shared_pooler.ff_out."),
];

fn gelu<B: Backend>() -> Then<B, 3> {
    Then::Activate(Activation::Gelu)
}

/// `residual + (x W + b)`.
fn add_projected<B: Backend>(
    linear: &Linear<B>,
    x: Tensor<B, 3>,
    residual: Tensor<B, 3>,
    pass: &Pass,
) -> Tensor<B, 3> {
    let then = Then::AddTo {
        residual,
        scale: None,
    };
    project(linear, x, then, pass)
}

/// The sinusoidal positions `[length, width]` LatentWire adds to the byte embeddings:
/// `sin(p · ω_i)` in even and `cos(p · ω_i)` in odd channels, `ω_i = 10000^(−2i/width)`, in f32
/// as PyTorch computes them.
fn sinusoids(length: usize, width: usize) -> TensorData {
    let rate = -(10000f32.ln()) / width as f32;
    let frequencies: Vec<f32> = (0..width.div_ceil(2))
        .map(|i| ((2 * i) as f32 * rate).exp())
        .collect();
    let mut values = Vec::with_capacity(length * width);
    for position in 0..length {
        values.extend((0..width).map(|channel| {
            let angle = position as f32 * frequencies[channel / 2];
            if channel % 2 == 0 {
                angle.sin()
            } else {
                angle.cos()
            }
        }));
    }
    TensorData::new(values, [length, width])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_cut_and_right_padded_with_zero() {
        let batch = ByteBatch::new(&["ab", "héllo", ""], 4);
        assert_eq!(batch.dims(), [3, 4]);
        let [h, e] = "é".as_bytes() else { panic!() };
        let expected = [97, 98, 0, 0, 104, *h as i32, *e as i32, 108, 0, 0, 0, 0];
        assert_eq!(batch.bytes, expected);
        assert_eq!(ByteBatch::new(&["", ""], 8).dims(), [2, 1]);
    }

    #[test]
    fn positions_are_sines_and_cosines_of_decreasing_frequency() {
        let table = sinusoids(3, 4).to_vec::<f32>().unwrap();
        let row = |p: usize| &table[p * 4..][..4];
        assert_eq!(row(0), [0.0, 1.0, 0.0, 1.0]);
        let slow = 0.01f32; // 10000^(−2/4)
        let expected = [
            2f32.sin(),
            2f32.cos(),
            (2.0 * slow).sin(),
            (2.0 * slow).cos(),
        ];
        for (got, want) in row(2).iter().zip(expected) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
    }
}
