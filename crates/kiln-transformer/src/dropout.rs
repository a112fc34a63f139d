//! Monte-Carlo dropout's settings and randomness: the rates per site ([`DropoutSites`]), the
//! sites ([`Site`]), and each batch row's image and pass ([`Draw`], [`Sample`]), from which
//! kiln-kernels' counter-based hash makes the masks ([`HashedMask`]); and applying a mask on
//! each kind of backend.

use std::fmt;
use std::str::FromStr;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_core::{Precision, cast};
use kiln_kernels::host;
use kiln_kernels::{HashedMask, device_mask, dropout_mask, for_each_factor, row_key};

/// Dropout rates, or a draw, that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DropoutError {
    /// A rate outside `[0, 1)`.
    #[error("{site} = {rate}: a dropout rate must be at least 0 and below 1")]
    Rate {
        /// The site's name.
        site: &'static str,
        /// The rate given.
        rate: f64,
    },
    /// Text that is not a number.
    #[error("`{text}` is not a dropout rate")]
    NotARate {
        /// The text given.
        text: String,
    },
    /// A list item without `=`.
    #[error("`{item}` is not of the form site=rate")]
    NotSiteRate {
        /// The item given.
        item: String,
    },
    /// A site name kiln does not know.
    #[error("unknown dropout site `{name}`: expected {SITE_NAMES}")]
    UnknownSite {
        /// The name given.
        name: String,
    },
    /// A draw with neither one sample per image nor the same number per image.
    #[error(
        "the draw names {samples} sample(s) for a batch of {batch}: give one per image or the \
         same number per image"
    )]
    DrawSize {
        /// Samples the draw names.
        samples: usize,
        /// Images in the batch.
        batch: usize,
    },
}

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
            Some((site, rate)) => Err(DropoutError::Rate { site, rate }),
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
                .map_err(|_| DropoutError::NotARate {
                    text: text.trim().to_string(),
                })
        };
        if !s.contains('=') {
            return DropoutSites::all(rate(s)?).validate();
        }
        let mut sites = DropoutSites::default();
        for item in s.split(',') {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| DropoutError::NotSiteRate {
                    item: item.trim().to_string(),
                })?;
            let slot = match name.trim() {
                "embeddings" | "emb" => &mut sites.embeddings,
                "attention_probs" | "probs" => &mut sites.attention_probs,
                "attention_output" | "attn_out" => &mut sites.attention_output,
                "mlp_hidden" | "mlp" => &mut sites.mlp_hidden,
                other => {
                    return Err(DropoutError::UnknownSite {
                        name: other.to_string(),
                    });
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
    pub(crate) fn row_keys(&self) -> Vec<u64> {
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

/// `x` (`[batch, ..]`) with `hashed`'s dropout: on host backends in f32 the values scaled in
/// place, each element's factor hashed as it is read (no mask in memory); on burn's CUDA and
/// wgpu backends times a mask one kernel makes on the device in `x`'s dtype; elsewhere times a
/// mask made on the host, then uploaded.
pub(crate) fn apply_mask<B: Backend, const D: usize>(
    hashed: &HashedMask,
    x: Tensor<B, D>,
) -> Tensor<B, D> {
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
}
