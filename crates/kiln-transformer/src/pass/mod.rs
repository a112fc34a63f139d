//! How one forward pass runs: the precision policy's casts and keep-in-f32 ops, Monte-Carlo
//! dropout that stays active at inference on every backend, and (`attention.rs`) attention on
//! each kind of backend.
//!
//! burn's `Dropout` only acts under autodiff, and its masks come from the backend's global
//! random state, which any other thread's `Tensor::random` advances. Monte-Carlo inference needs
//! masks that are reproducible and independent of how images are batched, so kiln makes them
//! itself with a counter-based hash: an element's keep/drop bit is a function of `(seed, item
//! id, pass, site, element index)` alone (kiln-kernels' [`HashedMask`]), where the site is the mask's place in
//! the forward order (each layer's sites count apart). An image gets the same masks whatever
//! batch it is in, and any element can be computed on its own (no stream to consume in order).

mod attention;
mod norm;

use std::borrow::Cow;
use std::cell::Cell;

use burn::module::Module;
use burn::nn::{LayerNorm, RmsNorm};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln_core::{Policy, Precision, cast_module, is_host_backend, parameter_device};
use kiln_kernels::gemm::{Bf16Isa, Products, is_mixed_bf16};
use kiln_kernels::host;
use kiln_kernels::{HashedMask, HostValues, dropout_mask};

use crate::dropout::{Draw, DropoutSites, Site, apply_mask};
use crate::prepared::PreparedWeights;

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
/// dtype. Under [host autocast](host_autocast) the model itself: its products read bf16 copies
/// of the weights that are made once.
pub fn in_compute_dtype<'a, B: Backend, M: Module<B> + Clone>(
    model: &'a M,
    policy: &Policy,
) -> Cow<'a, M> {
    // Read without initialising a lazy parameter (a GGUF model's weights kept as stored).
    let autocast = || parameter_device(model).is_some_and(|d| host_autocast::<B>(policy, &d));
    if policy.param == policy.compute || autocast() {
        Cow::Borrowed(model)
    } else {
        Cow::Owned(cast_module(model.clone(), policy.compute))
    }
}

/// Whether `policy` runs as PyTorch's CPU autocast does on `device`: a mixed bf16 policy
/// (f32 parameters, bf16 compute) on a host backend, in inference or training. Its tensors then
/// stay f32 (norms, softmax, GELU, losses and sums in f32 by construction) and every host
/// product reads its operands rounded to bf16, with f32 sums, on AMX or AVX512-BF16 ([`bf16`],
/// as [`Bf16Isa::chosen`] picks): in training the forward product and both gradient products;
/// elsewhere the products are f32 (said once), so the policy is never slower than `full` there.
pub fn host_autocast<B: Backend>(policy: &Policy, device: &B::Device) -> bool {
    is_mixed_bf16(policy) && is_host_backend::<B>(device)
}

/// Says once per process how host autocast multiplies on this CPU.
fn announce_host_autocast() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| match Bf16Isa::chosen() {
        Some(isa) => log::info!("mixed-bf16 on the CPU: products in bf16 on {isa}"),
        None => log::warn!(
            "no bf16 products on this CPU (neither amx_bf16 nor, on AMD, avx512_bf16; or \
             KILN_BF16=off): mixed-bf16 multiplies in f32 here"
        ),
    });
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
            prepared: prepared.for_products(Products::under(&settings.policy)),
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

    /// The pixels in the compute dtype (f32 under [`host_autocast`]).
    pub fn input<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.policy_on::<B>(&x.device()).cast_input(x)
    }

    /// A result in the output dtype.
    pub fn output<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.policy.cast_output(x)
    }

    /// The precision policy the pass runs under.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The policy tensors follow on `device`: the pass's, with f32 compute under
    /// [`host_autocast`] (the products' operands are rounded inside the kernels).
    pub fn policy_on<B: Backend>(&self, device: &B::Device) -> Policy {
        if host_autocast::<B>(&self.policy, device) {
            announce_host_autocast();
            Policy {
                compute: Precision::F32,
                ..self.policy
            }
        } else {
            self.policy
        }
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
        if let Some(y) = norm::trained_rms_norm(norm, &x) {
            return y;
        }
        let policy = self.policy_on::<B>(&x.device());
        if policy.compute.is_half() {
            let wide = cast_module(norm.clone(), Precision::F32);
            policy.keep_f32(x, |x| wide.forward(x))
        } else {
            norm.forward(x)
        }
    }

    /// `norm(x)` with its statistics in f32 whatever the compute dtype (in training on
    /// `Autodiff<Flex>`, one host operation).
    pub fn norm<B: Backend, const D: usize>(
        &self,
        norm: &LayerNorm<B>,
        x: Tensor<B, D>,
    ) -> Tensor<B, D> {
        if let Some(y) = norm::trained_layer_norm(norm, &x) {
            return y;
        }
        let policy = self.policy_on::<B>(&x.device());
        if policy.compute.is_half() {
            let wide = cast_module(norm.clone(), Precision::F32);
            policy.keep_f32(x, |x| wide.forward(x))
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sample;

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
