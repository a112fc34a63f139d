//! How one forward pass runs: the precision policy's casts and keep-in-f32 ops, and
//! Monte-Carlo dropout that stays active at inference on every backend.
//!
//! burn's `Dropout` only acts under autodiff, and its masks come from the backend's global
//! random state, which any other thread's `Tensor::random` advances. Monte-Carlo inference needs
//! masks that are reproducible and independent of how images are batched, so kiln makes them
//! itself with a counter-based hash: an element's keep/drop bit is a function of `(seed, item
//! id, pass, site, element index)` alone (kiln-kernels' [`HashedMask`]), where the site is the mask's place in
//! the forward order (each layer's sites count apart). An image gets the same masks whatever
//! batch it is in, and any element can be computed on its own (no stream to consume in order).

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::str::FromStr;

use burn::module::Module;
use burn::nn::{LayerNorm, RmsNorm};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::{Tensor, TensorData};
use kiln_core::{Policy, Precision, cast, cast_module};
use kiln_kernels::{
    HashedMask, HostValues, dropout_mask, for_each_factor, host_op, host_ops_serve, row_key,
};

use crate::prepared::PreparedWeights;
use kiln_kernels::host::{self, Rows};
use kiln_kernels::{device_attention, device_mask};

/// Dropout rates, or a draw, that cannot be used; the message says why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct DropoutError(pub String);

/// Monte-Carlo dropout rates per site (0 turns a site off). Each is a probability in `[0, 1)`;
/// kept activations are scaled by `1 / (1 − p)`, as PyTorch's dropout does.
///
/// Parses from `"0.1"` (every site) or a list such as `"attention_probs=0.1,mlp_hidden=0.05"`:
///
/// ```
/// let sites: kiln_transformer::DropoutSites = "attention_probs=0.1,mlp=0.05".parse()?;
/// assert_eq!((sites.attention_probs, sites.mlp_hidden, sites.embeddings), (0.1, 0.05, 0.0));
/// # Ok::<(), kiln_transformer::DropoutError>(())
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
    pub fn validate(&self) -> Result<Self, DropoutError> {
        match self
            .rates()
            .into_iter()
            .find(|&(_, p)| !(0.0..1.0).contains(&p))
        {
            Some((site, p)) => Err(DropoutError(format!(
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
    type Err = DropoutError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rate = |text: &str| {
            text.trim()
                .parse::<f64>()
                .map_err(|_| DropoutError(format!("`{}` is not a dropout rate", text.trim())))
        };
        if !s.contains('=') {
            return DropoutSites::all(rate(s)?).validate();
        }
        let mut sites = DropoutSites::default();
        for item in s.split(',') {
            let (name, value) = item.split_once('=').ok_or_else(|| {
                DropoutError(format!("`{}` is not of the form site=rate", item.trim()))
            })?;
            let slot = match name.trim() {
                "embeddings" | "emb" => &mut sites.embeddings,
                "attention_probs" | "probs" => &mut sites.attention_probs,
                "attention_output" | "attn_out" => &mut sites.attention_output,
                "mlp_hidden" | "mlp" => &mut sites.mlp_hidden,
                other => {
                    return Err(DropoutError(format!(
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

/// The randomness of one stochastic forward over a batch: the masks of output row `r` are a
/// hash of `(seed, rows[r].item, rows[r].pass)` (and of the site and element), so they depend on
/// which image and pass the row is, never on the batch it came in or its place there.
///
/// A draw has one sample per image of the batch, or `s` per image: rows `i·s .. (i+1)·s` are
/// samples of image `i`, and the model embeds each image once and repeats it `s` times before
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

    /// Each row's key: `(seed, item, pass)` mixed into 64 bits.
    fn row_keys(&self) -> Vec<u64> {
        self.rows
            .iter()
            .map(|row| row_key(self.seed, row.item, row.pass))
            .collect()
    }
}

/// Which dropout site a mask is for.
#[derive(Debug, Clone, Copy)]
pub enum Site {
    /// The embedded tokens, before the first layer.
    Embeddings,
    /// The attention probabilities, after the softmax.
    AttentionProbs,
    /// The attention block's output projection, before the residual add.
    AttentionOutput,
    /// The MLP's hidden activations.
    MlpHidden,
}

/// How a model runs: its precision policy (set when its weights are loaded) and its Monte-Carlo
/// dropout sites (used by stochastic forwards, those given a [`Draw`]; none by default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Parameter, compute and output dtypes.
    pub policy: Policy,
    /// Dropout rates per site.
    pub dropout: DropoutSites,
}

impl Default for Settings {
    /// f32 throughout, no dropout.
    fn default() -> Self {
        Settings {
            policy: Policy::full(),
            dropout: DropoutSites::default(),
        }
    }
}

/// `model` as a forward pass computes with it: itself, or where `policy` stores parameters in
/// another dtype than it computes in, a copy cast to the compute dtype (autocast's per-op weight
/// casts, done once per forward). A copy shares the model's prepared weights, which are keyed by
/// dtype.
pub fn in_compute_dtype<'a, B: Backend, M: Module<B> + Clone>(
    model: &'a M,
    policy: &Policy,
) -> Cow<'a, M> {
    if policy.param == policy.compute {
        Cow::Borrowed(model)
    } else {
        Cow::Owned(cast_module(model.clone(), policy.compute))
    }
}

/// One forward pass: the settings and, for a stochastic pass, each batch row's key and the
/// number of masks made so far (the next mask's site number).
pub struct Pass {
    policy: Policy,
    dropout: DropoutSites,
    /// Rows the pass computes: the draw's samples, or the batch without a draw.
    samples: Option<usize>,
    keys: Option<Vec<u64>>,
    sites: Cell<u32>,
    prepared: PreparedWeights,
}

impl Pass {
    /// A pass with the settings' dropout when `draw` is given, deterministic otherwise, reading
    /// the host weights the model keeps in `prepared`.
    pub fn new(settings: &Settings, prepared: &PreparedWeights, draw: Option<&Draw>) -> Self {
        let keys = draw
            .filter(|_| settings.dropout.is_active())
            .map(Draw::row_keys);
        Pass {
            policy: settings.policy,
            dropout: settings.dropout,
            samples: draw.map(|d| d.rows.len()),
            keys,
            sites: Cell::new(0),
            prepared: prepared.clone(),
        }
    }

    /// The same pass without dropout (for blocks outside the Monte-Carlo sites).
    pub fn deterministic(&self) -> Pass {
        Pass {
            policy: self.policy,
            dropout: self.dropout,
            samples: self.samples,
            keys: None,
            sites: Cell::new(0),
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

    /// The precision policy the pass runs under.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// `norm(x)` (RMSNorm) in f32 whatever the compute dtype, as transformers' `LlamaRMSNorm`
    /// normalises.
    pub fn rms_norm<B: Backend, const D: usize>(
        &self,
        norm: &RmsNorm<B>,
        x: Tensor<B, D>,
    ) -> Tensor<B, D> {
        if host::serves(&x) {
            // Read in place: `x` is usually the residual stream, still held for the sum after
            // the block, so taking its data would copy it.
            let values = HostValues::of(&x);
            let weight = HostValues::of(&norm.gamma.val());
            let out = host::rms_norm(values.values(), weight.values(), norm.epsilon as f32);
            return Tensor::from_data(TensorData::new(out, x.dims()), &x.device());
        }
        if self.policy.compute.is_half() {
            let wide = cast_module(norm.clone(), Precision::F32);
            self.policy.keep_f32(x, |x| wide.forward(x))
        } else {
            norm.forward(x)
        }
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
    ///
    /// On host backends in f32 the values are scaled in place, each element's factor hashed as
    /// it is read (no mask in memory); on burn's CUDA and wgpu backends the mask is made on the
    /// device by one kernel; elsewhere on the host, then uploaded.
    pub fn drop<B: Backend, const D: usize>(&self, site: Site, x: Tensor<B, D>) -> Tensor<B, D> {
        match self.hashed_mask(site) {
            Some(hashed) => apply_mask(&hashed, x),
            None => x,
        }
    }

    /// The next dropout mask of `site` for a `[batch, ..]` tensor of `dims`, or `None` when the
    /// pass is deterministic or the site's rate is 0.
    fn mask<const D: usize>(&self, site: Site, dims: [usize; D]) -> Option<TensorData> {
        Some(dropout_mask(&self.hashed_mask(site)?, dims))
    }

    /// The next dropout mask of `site` as hash words, or `None` when the pass is deterministic
    /// or the site's rate is 0.
    fn hashed_mask(&self, site: Site) -> Option<HashedMask> {
        let p = self.rate(site);
        let keys = self.keys.as_ref().filter(|_| p > 0.0)?;
        let number = self.sites.get();
        self.sites.set(number + 1);
        Some(HashedMask::new(keys, number, p))
    }

    /// Whether this pass drops activations at `site`.
    pub fn drops(&self, site: Site) -> bool {
        self.keys.is_some() && self.rate(site) > 0.0
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
    /// its backward, as one autodiff operation ([`host::AttentionOp`]). On burn's CUDA and wgpu
    /// backends, burn's fused kernel (flash attention) without dropout on the probabilities, and
    /// kiln's fused kernel with it (f32, bf16 or f16; `device_attention.rs`); elsewhere the probabilities are
    /// formed explicitly with the softmax in f32, then dropped.
    pub fn attention<B: Backend>(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        value: Tensor<B, 3>,
        heads: usize,
    ) -> Tensor<B, 3> {
        let [batch, tokens, width] = query.dims();
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
                mask: mask.map(|m| m.to_vec::<f32>().expect("dropout masks are f32").into()),
                ..host::AttentionOp::new(batch, heads, width / heads, tokens, kv_tokens)
            };
            return host_op(op, [&query, &key, &value], [batch, tokens, width])
                .expect("host operations serve these tensors");
        }
        let attended = if let Some(hashed) = self.hashed_mask(Site::AttentionProbs) {
            if let Some(out) = device_attention::attention(&query, &key, &value, heads, &hashed) {
                return out;
            }
            let probs = self.attention_weights(query, key, heads);
            apply_mask(&hashed, probs).matmul(split_heads(value, heads))
        } else {
            let [query, key, value] = [query, key, value].map(|x| split_heads(x, heads));
            attention(query, key, value, None, None, Default::default())
        };
        attended.swap_dims(1, 2).reshape([batch, tokens, width])
    }

    /// The probabilities `softmax(q kᵀ / √head_dim)` of `heads` heads, `[batch, heads,
    /// q_tokens, kv_tokens]`, formed explicitly (softmax in f32 under the policy), without
    /// dropout: where the queries look.
    pub fn attention_weights<B: Backend>(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        heads: usize,
    ) -> Tensor<B, 4> {
        let scale = ((query.dims()[2] / heads) as f64).powf(-0.5);
        let scores = split_heads(query, heads).matmul(split_heads(key, heads).swap_dims(2, 3));
        self.policy.keep_f32(scores * scale, |s| softmax(s, 3))
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
        // The kernel forms each probability's multiplier as it normalises the row.
        let mask = self.hashed_mask(Site::AttentionProbs);
        let mask = mask.as_ref().map(host::ProbsDropout::Hashed);
        let scale = (head_dim as f64).powf(-0.5) as f32;
        let shape = host::Heads::all(heads, head_dim);
        let out = host::attention(query, key, value, batch, shape, scale, mask);
        Tensor::from_data(TensorData::new(out, [batch, query.tokens, width]), device)
    }
}

/// `[batch, tokens, heads · head_dim]` → `[batch, heads, tokens, head_dim]`.
fn split_heads<B: Backend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [batch, tokens, width] = x.dims();
    x.reshape([batch, tokens, heads, width / heads])
        .swap_dims(1, 2)
}

/// `x` (`[batch, ..]`) with `hashed`'s dropout: on host backends in f32 the values scaled in
/// place, each element's factor hashed as it is read (no mask in memory); on burn's CUDA and
/// wgpu backends times a mask one kernel makes on the device in `x`'s dtype; elsewhere times a
/// mask made on the host, then uploaded.
fn apply_mask<B: Backend, const D: usize>(hashed: &HashedMask, x: Tensor<B, D>) -> Tensor<B, D> {
    let device = x.device();
    if host::serves(&x) {
        let per_row = x.dims()[1..].iter().product();
        let mut data = x.into_data();
        let values = data
            .as_mut_slice::<f32>()
            .expect("host tensors served are f32");
        for_each_factor(values, per_row, hashed, |value, factor| *value *= factor);
        return Tensor::from_data(data, &device);
    }
    let mask =
        device_mask::on_device::<B, D>(hashed, x.dims(), x.dtype(), &device).unwrap_or_else(|| {
            device_mask::count_host_upload();
            Tensor::from_data(dropout_mask(hashed, x.dims()), &device)
        });
    let dtype = Precision::from_dtype(x.dtype()).unwrap_or(Precision::F32);
    x * cast(mask, dtype)
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

    /// Sites of one pass, and rows whose keys differ, get unrelated masks: about half of the
    /// elements agree at p = 0.5, as for independent masks (not a shifted copy).
    #[test]
    fn sites_and_rows_get_independent_masks() {
        let keys = Draw::pass(5, 0, [0, 1]).row_keys();
        let n = 100_000;
        let agreement = |a: &[f32], b: &[f32]| {
            a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / n as f64
        };
        let first = dropout_mask(&HashedMask::new(&keys, 0, 0.5), [2, n])
            .to_vec::<f32>()
            .unwrap();
        let second = dropout_mask(&HashedMask::new(&keys, 1, 0.5), [2, n])
            .to_vec::<f32>()
            .unwrap();
        // Binomial standard deviation √(0.25 / n) ≈ 0.0016: 5σ.
        for share in [
            agreement(&first[..n], &second[..n]),
            agreement(&first[..n], &first[n..]),
        ] {
            assert!((share - 0.5).abs() < 0.008, "agreement {share}");
        }
    }

    /// The attention kernel forming the probabilities' multipliers from the hash gives exactly
    /// what multiplying by the materialised mask gives (two images of two heads, tiles of 96
    /// query rows and a partial one).
    #[test]
    fn attention_with_hashed_dropout_equals_the_materialised_mask() {
        let (batch, heads, head_dim, tokens) = (2, 2, 4, 100);
        let width = heads * head_dim;
        let values: Vec<f32> = (0..batch * tokens * width)
            .map(|i| (i * 37 % 101) as f32 / 50.0 - 1.0)
            .collect();
        let rows = || Rows::new(&values, width, tokens);
        let keys = Draw::pass(3, 1, [7, 8]).row_keys();
        let hashed = HashedMask::new(&keys, 2, 0.3);
        let multipliers = dropout_mask(&hashed, [batch, heads, tokens, tokens])
            .to_vec::<f32>()
            .unwrap();
        let attend = |mask| {
            host::attention(
                rows(),
                rows(),
                rows(),
                batch,
                host::Heads::all(heads, head_dim),
                0.5,
                mask,
            )
        };
        let fused = attend(Some(host::ProbsDropout::Hashed(&hashed)));
        let materialised = attend(Some(host::ProbsDropout::Multipliers(&multipliers)));
        assert_eq!(fused, materialised);
        assert_ne!(fused, attend(None));
    }

    #[test]
    fn a_row_depends_on_its_sample_not_its_batch() {
        let sample = |item, pass| Sample { item, pass };
        let mask = |rows: &[Sample]| {
            let draw = Draw {
                seed: 1,
                rows: rows.to_vec(),
            };
            dropout_mask(&HashedMask::new(&draw.row_keys(), 0, 0.5), [rows.len(), 64])
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
