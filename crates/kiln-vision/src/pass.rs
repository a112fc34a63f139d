//! How one forward pass runs: the precision policy's casts and keep-in-f32 ops, and
//! Monte-Carlo dropout that stays active at inference on every backend.
//!
//! burn's `Dropout` only acts under autodiff, and its masks come from the backend's global
//! random state, which any other thread's `Tensor::random` advances. Monte-Carlo inference needs
//! masks that are reproducible and independent of how images are batched, so kiln draws them
//! itself: every batch row has its own ChaCha8 stream keyed by `(seed, item id, pass)`, consumed
//! site by site in forward order. An image gets the same masks whatever batch it is in.

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use burn::nn::LayerNorm;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::{Tensor, TensorData};
use kiln_precision::{Policy, Precision, cast, cast_module, host_op, host_ops_serve};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rayon::prelude::*;

use crate::VisionError;
use crate::host::{self, Rows};
use crate::prepared::PreparedWeights;

/// Monte-Carlo dropout rates per site (0 turns a site off). Each is a probability in `[0, 1)`;
/// kept activations are scaled by `1 / (1 − p)`, as PyTorch's dropout does.
///
/// Parses from `"0.1"` (every site) or a list such as `"attention_probs=0.1,mlp_hidden=0.05"`:
///
/// ```
/// let sites: kiln_vision::DropoutSites = "attention_probs=0.1,mlp=0.05".parse()?;
/// assert_eq!((sites.attention_probs, sites.mlp_hidden, sites.embeddings), (0.1, 0.05, 0.0));
/// # Ok::<(), kiln_vision::VisionError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DropoutSites {
    /// After the position embeddings are added (and CLIP's class token joined).
    pub embeddings: f64,
    /// On the attention probabilities, after the softmax (attention then runs unfused).
    pub attention_probs: f64,
    /// On the attention block's output projection, before the residual add.
    pub attention_output: f64,
    /// On the MLP's hidden activations, between `fc1`'s activation and `fc2`.
    pub mlp_hidden: f64,
}

/// The site names [`DropoutSites`] parses, with their short forms.
const SITE_NAMES: &str = "embeddings (emb), attention_probs (probs), attention_output (attn_out), \
                          mlp_hidden (mlp)";

impl DropoutSites {
    /// The same rate `p` at every site.
    pub fn all(p: f64) -> Self {
        DropoutSites {
            embeddings: p,
            attention_probs: p,
            attention_output: p,
            mlp_hidden: p,
        }
    }

    /// Whether any site drops anything.
    pub fn is_active(&self) -> bool {
        self.rates().iter().any(|&(_, p)| p > 0.0)
    }

    fn rates(&self) -> [(&'static str, f64); 4] {
        [
            ("embeddings", self.embeddings),
            ("attention_probs", self.attention_probs),
            ("attention_output", self.attention_output),
            ("mlp_hidden", self.mlp_hidden),
        ]
    }

    /// Checks every rate is a probability below 1.
    pub fn validate(&self) -> Result<Self, VisionError> {
        match self
            .rates()
            .into_iter()
            .find(|&(_, p)| !(0.0..1.0).contains(&p))
        {
            Some((site, p)) => Err(VisionError::Dropout(format!(
                "{site} = {p}: a dropout rate must be at least 0 and below 1"
            ))),
            None => Ok(*self),
        }
    }
}

impl fmt::Display for DropoutSites {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self
            .rates()
            .iter()
            .map(|(site, p)| format!("{site}={p}"))
            .collect();
        f.write_str(&items.join(","))
    }
}

impl FromStr for DropoutSites {
    type Err = VisionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rate = |text: &str| {
            text.trim().parse::<f64>().map_err(|_| {
                VisionError::Dropout(format!("`{}` is not a dropout rate", text.trim()))
            })
        };
        if !s.contains('=') {
            return DropoutSites::all(rate(s)?).validate();
        }
        let mut sites = DropoutSites::default();
        for item in s.split(',') {
            let (name, value) = item.split_once('=').ok_or_else(|| {
                VisionError::Dropout(format!("`{}` is not of the form site=rate", item.trim()))
            })?;
            let slot = match name.trim() {
                "embeddings" | "emb" => &mut sites.embeddings,
                "attention_probs" | "probs" => &mut sites.attention_probs,
                "attention_output" | "attn_out" => &mut sites.attention_output,
                "mlp_hidden" | "mlp" => &mut sites.mlp_hidden,
                other => {
                    return Err(VisionError::Dropout(format!(
                        "unknown dropout site `{other}`: expected {SITE_NAMES}"
                    )));
                }
            };
            *slot = rate(value)?;
        }
        sites.validate()
    }
}

/// One batch row of a stochastic forward: which image (its id in the dataset, say) and which
/// Monte-Carlo pass of it. A batch may hold several passes of one image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sample {
    /// The image's id.
    pub item: u64,
    /// Which stochastic pass (Monte-Carlo sample) of the image this row is.
    pub pass: u64,
}

/// The randomness of one stochastic forward over a batch: the masks of output row `r` are drawn
/// from the stream keyed by `(seed, rows[r].item, rows[r].pass)`, so they depend on which image
/// and pass the row is, never on the batch it came in or its place there.
///
/// A draw has one sample per image of the batch, or `s` per image: rows `i·s .. (i+1)·s` are
/// samples of image `i`, and the tower embeds each image once and repeats it `s` times before
/// the first dropout site (Monte-Carlo passes without uploading or embedding an image again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    /// The experiment's (or trial's) seed.
    pub seed: u64,
    /// One sample per batch row.
    pub rows: Vec<Sample>,
}

impl Draw {
    /// Pass `pass` of each of `items`, one per batch row.
    pub fn pass(seed: u64, pass: u64, items: impl IntoIterator<Item = u64>) -> Self {
        Draw {
            seed,
            rows: items
                .into_iter()
                .map(|item| Sample { item, pass })
                .collect(),
        }
    }

    fn stream(&self, row: Sample) -> ChaCha8Rng {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&self.seed.to_le_bytes());
        key[8..16].copy_from_slice(&row.item.to_le_bytes());
        let mut rng = ChaCha8Rng::from_seed(key);
        rng.set_stream(row.pass);
        rng
    }

    fn streams(&self) -> Vec<ChaCha8Rng> {
        self.rows.iter().map(|&row| self.stream(row)).collect()
    }
}

/// Which dropout site a mask is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Site {
    Embeddings,
    AttentionProbs,
    AttentionOutput,
    MlpHidden,
}

/// How a tower runs: its precision policy (set when its weights are loaded) and its Monte-Carlo
/// dropout sites (used by the `forward_sampled` methods; none by default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TowerSettings {
    /// Parameter, compute and output dtypes.
    pub policy: Policy,
    /// Dropout rates per site.
    pub dropout: DropoutSites,
}

impl Default for TowerSettings {
    /// f32 throughout, no dropout.
    fn default() -> Self {
        TowerSettings {
            policy: Policy::full(),
            dropout: DropoutSites::default(),
        }
    }
}

/// One forward pass: the settings and, for a stochastic pass, each batch row's random stream.
pub(crate) struct Pass {
    policy: Policy,
    dropout: DropoutSites,
    /// Rows the pass computes: the draw's samples, or the batch without a draw.
    samples: Option<usize>,
    streams: Option<RefCell<Vec<ChaCha8Rng>>>,
    prepared: PreparedWeights,
}

impl Pass {
    /// A pass with the settings' dropout when `draw` is given, deterministic otherwise, reading
    /// the host weights the tower keeps in `prepared`.
    pub fn new(settings: &TowerSettings, prepared: &PreparedWeights, draw: Option<&Draw>) -> Self {
        let streams = draw
            .filter(|_| settings.dropout.is_active())
            .map(|draw| RefCell::new(draw.streams()));
        Pass {
            policy: settings.policy,
            dropout: settings.dropout,
            samples: draw.map(|d| d.rows.len()),
            streams,
            prepared: prepared.clone(),
        }
    }

    /// The same pass without dropout (for blocks outside the Monte-Carlo sites).
    pub fn deterministic(&self) -> Pass {
        Pass {
            policy: self.policy,
            dropout: self.dropout,
            samples: self.samples,
            streams: None,
            prepared: self.prepared.clone(),
        }
    }

    /// The tower's host weights, prepared once per weight.
    pub fn prepared(&self) -> &PreparedWeights {
        &self.prepared
    }

    /// The embedded tokens `[images, tokens, hidden]` as the encoder takes them: each image
    /// repeated for its samples when the draw has several per image (everything before here is
    /// deterministic, so it ran once per image), then the embeddings dropout.
    pub fn embeddings<B: Backend>(&self, tokens: Tensor<B, 3>) -> Tensor<B, 3> {
        let [images, count, hidden] = tokens.dims();
        let tokens = match self.samples {
            Some(samples) if samples > images => tokens
                .unsqueeze_dim::<4>(1)
                .repeat_dim(1, samples / images)
                .reshape([samples, count, hidden]),
            _ => tokens,
        };
        self.drop(Site::Embeddings, tokens)
    }

    /// The pixels in the compute dtype.
    pub fn input<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.policy.cast_input(x)
    }

    /// A result in the output dtype.
    pub fn output<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.policy.cast_output(x)
    }

    /// `norm(x)` with its statistics in f32 whatever the compute dtype.
    pub fn norm<B: Backend, const D: usize>(
        &self,
        norm: &LayerNorm<B>,
        x: Tensor<B, D>,
    ) -> Tensor<B, D> {
        if self.policy.compute.is_half() {
            let wide = cast_module(norm.clone(), Precision::F32);
            self.policy.keep_f32(x, |x| wide.forward(x))
        } else {
            norm.forward(x)
        }
    }

    /// Dropout at `site` on `x` (`[batch, ..]`), or `x` unchanged when the pass is deterministic
    /// or the site's rate is 0.
    pub fn drop<B: Backend, const D: usize>(&self, site: Site, x: Tensor<B, D>) -> Tensor<B, D> {
        match self.mask(site, x.dims()) {
            Some(mask) => {
                let mask = Tensor::<B, D>::from_data(mask, &x.device());
                x.clone()
                    * cast(
                        mask,
                        Precision::from_dtype(x.dtype()).unwrap_or(Precision::F32),
                    )
            }
            None => x,
        }
    }

    /// The next dropout mask of `site` for a `[batch, ..]` tensor of `dims`, or `None` when the
    /// pass is deterministic or the site's rate is 0.
    fn mask<const D: usize>(&self, site: Site, dims: [usize; D]) -> Option<TensorData> {
        let p = self.rate(site);
        let streams = self.streams.as_ref().filter(|_| p > 0.0)?;
        Some(dropout_mask(&mut streams.borrow_mut(), dims, p))
    }

    /// Whether this pass drops activations at `site`.
    pub fn drops(&self, site: Site) -> bool {
        self.streams.is_some() && self.rate(site) > 0.0
    }

    /// The dropout rate of `site`.
    fn rate(&self, site: Site) -> f64 {
        match site {
            Site::Embeddings => self.dropout.embeddings,
            Site::AttentionProbs => self.dropout.attention_probs,
            Site::AttentionOutput => self.dropout.attention_output,
            Site::MlpHidden => self.dropout.mlp_hidden,
        }
    }

    /// Multi-head attention over `[batch, tokens, heads · head_dim]` projections: `query` of
    /// `q_tokens`, `key` and `value` of `kv_tokens`; returns `[batch, q_tokens, heads · head_dim]`.
    ///
    /// On host backends in f32, kiln's attention kernel ([`host::attention`]), with the
    /// probabilities' dropout mask when there is one; in training on Flex the same kernel with
    /// its backward, as one autodiff operation ([`host::AttentionOp`]). On the GPU backends, burn's fused kernel
    /// (flash attention) unless dropout acts on the probabilities, which then are formed
    /// explicitly with the softmax in f32.
    pub fn attention<B: Backend>(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        value: Tensor<B, 3>,
        heads: usize,
    ) -> Tensor<B, 3> {
        let [batch, tokens, width] = query.dims();
        let scale = ((width / heads) as f64).powf(-0.5);
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
                batch,
                heads,
                head_dim: width / heads,
                q_tokens: tokens,
                kv_tokens,
                scale: scale as f32,
                mask: mask.map(|m| m.to_vec::<f32>().expect("dropout masks are f32").into()),
            };
            return host_op(op, [&query, &key, &value], [batch, tokens, width])
                .expect("host operations serve these tensors");
        }
        let split = |x: Tensor<B, 3>| {
            let [batch, tokens, width] = x.dims();
            x.reshape([batch, tokens, heads, width / heads])
                .swap_dims(1, 2)
        };
        let dropped = self.drops(Site::AttentionProbs);
        let (query, key, value) = (split(query), split(key), split(value));
        let attended = if dropped {
            let scores = query.matmul(key.swap_dims(2, 3)) * scale;
            let probs = self.policy.keep_f32(scores, |s| softmax(s, 3));
            self.drop(Site::AttentionProbs, probs).matmul(value)
        } else {
            attention(query, key, value, None, None, Default::default())
        };
        attended.swap_dims(1, 2).reshape([batch, tokens, width])
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
        let mask = self.mask(
            Site::AttentionProbs,
            [batch, heads, query.tokens, key.tokens],
        );
        let mask = mask
            .as_ref()
            .map(|m| m.as_slice::<f32>().expect("dropout masks are f32"));
        let scale = (head_dim as f64).powf(-0.5) as f32;
        let out = host::attention(query, key, value, batch, heads, head_dim, scale, mask);
        Tensor::from_data(TensorData::new(out, [batch, query.tokens, width]), device)
    }
}

/// The mask of one dropout site: 0 where dropped, `1 / (1 − p)` where kept, each batch row's
/// elements drawn from its own stream (rows in parallel).
fn dropout_mask<const D: usize>(
    streams: &mut [ChaCha8Rng],
    dims: [usize; D],
    p: f64,
) -> TensorData {
    let per_row: usize = dims[1..].iter().product();
    // Keep where a uniform 32-bit draw is at or above p · 2³².
    let threshold = (p * 4_294_967_296.0).round() as u64;
    let kept = (1.0 / (1.0 - p)) as f32;
    let mut mask = vec![0f32; per_row * dims[0]];
    mask.par_chunks_mut(per_row.max(1))
        .zip(streams.par_iter_mut())
        .for_each(|(row, rng)| {
            for value in row {
                *value = if u64::from(rng.next_u32()) >= threshold {
                    kept
                } else {
                    0.0
                };
            }
        });
    TensorData::new(mask, dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates_and_explains_mistakes() {
        let all: DropoutSites = "0.2".parse().unwrap();
        assert_eq!(all, DropoutSites::all(0.2));
        let some: DropoutSites = "probs=0.1, attn_out=0.3".parse().unwrap();
        assert_eq!((some.attention_probs, some.attention_output), (0.1, 0.3));
        assert_eq!(some.to_string().parse::<DropoutSites>().unwrap(), some);
        let err = |s: &str| s.parse::<DropoutSites>().unwrap_err().to_string();
        assert!(err("1.0").contains("below 1"), "{}", err("1.0"));
        assert!(
            err("mlp=-0.1").contains("mlp_hidden"),
            "{}",
            err("mlp=-0.1")
        );
        assert!(err("head=0.1").contains("attention_probs (probs)"));
        assert!(err("mlp=lots").contains("lots"));
        assert!(!DropoutSites::default().is_active());
    }

    #[test]
    fn masks_keep_the_expected_share_and_scale() {
        let mut streams = Draw::pass(7, 3, [10, 11]).streams();
        let p = 0.25;
        let mask = dropout_mask(&mut streams, [2, 100_000], p)
            .to_vec::<f32>()
            .unwrap();
        let kept = mask.iter().filter(|&&m| m != 0.0).count() as f64 / mask.len() as f64;
        // Binomial standard deviation √(p(1−p)/n) ≈ 0.001: 5σ.
        assert!((kept - (1.0 - p)).abs() < 0.005, "kept {kept}");
        assert!(mask.iter().all(|&m| m == 0.0 || m == (1.0 / 0.75) as f32));
        // Mean 1: dropout keeps the expectation.
        let mean = mask.iter().map(|&m| m as f64).sum::<f64>() / mask.len() as f64;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
    }

    #[test]
    fn a_row_depends_on_its_sample_not_its_batch() {
        let sample = |item, pass| Sample { item, pass };
        let mask = |rows: &[Sample]| {
            let draw = Draw {
                seed: 1,
                rows: rows.to_vec(),
            };
            dropout_mask(&mut draw.streams(), [rows.len(), 64], 0.5)
                .to_vec::<f32>()
                .unwrap()
        };
        let pair = mask(&[sample(4, 0), sample(9, 0)]);
        let alone = mask(&[sample(9, 0)]);
        assert_eq!(pair[64..], alone[..]);
        assert_ne!(pair[..64], pair[64..]);
        // Two passes of one image in one batch get different masks, each its own.
        let passes = mask(&[sample(9, 1), sample(9, 0)]);
        assert_ne!(passes[..64], passes[64..]);
        assert_eq!(passes[64..], alone[..]);
        assert_eq!(passes[..64], mask(&[sample(9, 1)])[..]);
    }
}
