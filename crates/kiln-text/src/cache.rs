//! The key/value cache of incremental decoding: each layer's rotated keys and values of every
//! token so far, with the padding mask and the next position of each sequence.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use kiln_kernels::host::Rows;

use crate::TextError;
use crate::input::TextInput;

/// Keys and values of the tokens a model has seen, per layer, for [`crate::CausalLm::forward_cached`].
/// A new cache is empty; each forward appends its tokens.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    /// Whether keys and values are kept (not for a single forward over whole sequences).
    keeps: bool,
    /// `[batch][tokens so far]`: `false` for padding.
    mask: Vec<Vec<bool>>,
    /// Each sequence's count of real tokens so far (its next position).
    next_position: Vec<usize>,
}

/// One layer's keys and values, rotated, for every token so far.
#[derive(Debug, Clone)]
pub(crate) enum LayerCache<B: Backend> {
    /// Nothing yet.
    Empty,
    /// Nothing, ever: the cache of a forward pass that keeps no keys and values.
    Discarded,
    /// Tensors `[batch, kv_heads, tokens so far, head_dim]` (burn's operations).
    Tensors(Tensor<B, 4>, Tensor<B, 4>),
    /// Row-major host keys and values `[batch, capacity, kv_heads · head_dim]`, each image's
    /// tokens so far first (the host kernels). The capacity at least doubles when it grows, so
    /// a decoding step copies its own tokens, not the whole cache.
    Host {
        keys: Vec<f32>,
        values: Vec<f32>,
        capacity: usize,
    },
}

impl<B: Backend> LayerCache<B> {
    /// The keys and values so far with `key` and `value` appended along the tokens.
    pub fn append(
        &mut self,
        key: Tensor<B, 4>,
        value: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let joined = match std::mem::replace(self, LayerCache::Empty) {
            LayerCache::Discarded => {
                *self = LayerCache::Discarded;
                return (key, value);
            }
            LayerCache::Tensors(keys, values) => (
                Tensor::cat(vec![keys, key], 2),
                Tensor::cat(vec![values, value], 2),
            ),
            _ => (key, value),
        };
        *self = LayerCache::Tensors(joined.0.clone(), joined.1.clone());
        joined
    }

    /// Appends the new tokens' keys and values, each `width` columns of the `[batch · tokens,
    /// row_stride]` rows `new` from columns `key_column` and `value_column`, after the `past`
    /// tokens held; returns the keys and values so far (`past + tokens` per image), or `None`
    /// for a discarded cache (the new tokens' are all there are, in `new`).
    #[allow(clippy::too_many_arguments)]
    pub fn append_host(
        &mut self,
        new: &[f32],
        row_stride: usize,
        key_column: usize,
        value_column: usize,
        width: usize,
        batch: usize,
        past: usize,
    ) -> Option<(Rows<'_>, Rows<'_>)> {
        let tokens = new.len() / row_stride / batch.max(1);
        let total = past + tokens;
        match self {
            LayerCache::Discarded => return None,
            LayerCache::Host { .. } => {}
            _ => {
                *self = LayerCache::Host {
                    keys: Vec::new(),
                    values: Vec::new(),
                    capacity: 0,
                }
            }
        }
        let LayerCache::Host {
            keys,
            values,
            capacity,
        } = self
        else {
            unreachable!("just made a host cache")
        };
        if total > *capacity {
            let grown = total.max(2 * *capacity);
            for held in [&mut *keys, &mut *values] {
                let mut larger = vec![0f32; batch * grown * width];
                for (image, to) in larger.chunks_exact_mut(grown * width).enumerate() {
                    to[..past * width]
                        .copy_from_slice(&held[image * *capacity * width..][..past * width]);
                }
                *held = larger;
            }
            *capacity = grown;
        }
        let stride = *capacity * width;
        for (image, rows) in new.chunks_exact(tokens * row_stride).enumerate() {
            for (t, row) in rows.chunks_exact(row_stride).enumerate() {
                let at = image * stride + (past + t) * width;
                keys[at..at + width].copy_from_slice(&row[key_column..key_column + width]);
                values[at..at + width].copy_from_slice(&row[value_column..value_column + width]);
            }
        }
        let rows = |data| Rows {
            image_stride: stride,
            ..Rows::new(data, width, total)
        };
        Some((rows(keys), rows(values)))
    }
}

impl<B: Backend> Default for KvCache<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a forward's new tokens sit: their positions and which tokens each may attend to.
pub(crate) struct Positions {
    /// `[batch][new tokens]`.
    pub ids: Vec<Vec<usize>>,
    /// `[batch][tokens so far + new]`, `false` for padding.
    pub mask: Vec<Vec<bool>>,
    /// Tokens before the new ones.
    pub past: usize,
}

impl Positions {
    /// Which keys are real, `[batch · (past + new)]` (the host attention kernel's mask), or
    /// `None` when all are (no padding: the kernel skips the masking).
    pub fn real_keys(&self) -> Option<Vec<bool>> {
        let real = self.mask.concat();
        (!real.iter().all(|&real| real)).then_some(real)
    }

    /// The additive attention mask `[batch, 1, new, past + new]`: 0 where a new token may attend
    /// (a real token at or before it), the most negative f32 elsewhere. A row with nothing to
    /// attend to (a padding query before its sequence starts) comes out uniform, not NaN.
    pub fn bias<B: Backend>(&self, device: &B::Device) -> Tensor<B, 4> {
        let batch = self.mask.len();
        let total = self.mask.first().map_or(0, Vec::len);
        let new = total - self.past;
        let mut values = Vec::with_capacity(batch * new * total);
        for mask in &self.mask {
            for query in 0..new {
                let last = self.past + query;
                values.extend(
                    mask.iter()
                        .enumerate()
                        .map(|(key, &real)| if real && key <= last { 0.0 } else { f32::MIN }),
                );
            }
        }
        Tensor::from_data(TensorData::new(values, [batch, 1, new, total]), device)
    }
}

impl<B: Backend> KvCache<B> {
    /// An empty cache.
    pub fn new() -> Self {
        KvCache {
            layers: Vec::new(),
            keeps: true,
            mask: Vec::new(),
            next_position: Vec::new(),
        }
    }

    /// A cache for one forward pass over whole sequences, which keeps no keys and values (their
    /// copies were 2–3% of a batch's prefill).
    pub(crate) fn discarding() -> Self {
        KvCache {
            keeps: false,
            ..Self::new()
        }
    }

    /// Whether the cache keeps the keys and values of its forwards.
    pub(crate) fn keeps(&self) -> bool {
        self.keeps
    }

    /// Tokens held per sequence.
    pub fn len(&self) -> usize {
        self.mask.first().map_or(0, Vec::len)
    }

    /// Whether the cache holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The layers' caches, made on first use.
    pub(crate) fn layers(&mut self, count: usize) -> std::slice::IterMut<'_, LayerCache<B>> {
        if self.layers.is_empty() {
            let empty = if self.keeps {
                LayerCache::Empty
            } else {
                LayerCache::Discarded
            };
            self.layers = (0..count).map(|_| empty.clone()).collect();
        }
        self.layers.iter_mut()
    }

    /// Checks `input` against what the cache holds and records its tokens: their positions and
    /// the mask of everything so far. Refuses an empty input, rows of different lengths, another
    /// batch size than the cache's, a sequence with no real token, and positions at or beyond
    /// `max_positions`.
    pub(crate) fn extend(
        &mut self,
        input: &TextInput<B>,
        max_positions: usize,
    ) -> Result<Positions, TextError> {
        let (batch, tokens) = input.tokens.dims();
        if batch == 0 || tokens == 0 {
            return Err(TextError::Input(
                "the input has no tokens (an empty prompt?)".into(),
            ));
        }
        if let crate::Tokens::Ids(ids) = &input.tokens
            && let Some(row) = ids.iter().position(|row| row.len() != tokens)
        {
            return Err(TextError::Input(format!(
                "sequence {} has {} tokens and sequence 1 has {tokens}: pad them to one length",
                row + 1,
                ids[row].len()
            )));
        }
        let past = self.len();
        if past > 0 && self.mask.len() != batch {
            return Err(TextError::Input(format!(
                "a batch of {batch} after a cache of {} sequences",
                self.mask.len()
            )));
        }
        let mask = input
            .attention_mask
            .clone()
            .unwrap_or_else(|| vec![vec![true; tokens]; batch]);
        check_shape(&mask, batch, tokens, "attention_mask")?;
        let (mut so_far, mut next_position) = if past == 0 {
            (vec![Vec::new(); batch], vec![0; batch])
        } else {
            (self.mask.clone(), self.next_position.clone())
        };
        let ids = match &input.position_ids {
            Some(ids) => {
                check_shape(ids, batch, tokens, "position_ids")?;
                ids.clone()
            }
            None => mask
                .iter()
                .zip(&next_position)
                .map(|(mask, &next)| {
                    let mut next = next;
                    mask.iter()
                        .map(|&real| {
                            let position = if real { next } else { 0 };
                            next += usize::from(real);
                            position
                        })
                        .collect()
                })
                .collect(),
        };
        for (row, (mask, positions)) in mask.iter().zip(&ids).enumerate() {
            if !so_far[row].iter().chain(mask).any(|&real| real) {
                return Err(TextError::Input(format!(
                    "sequence {} is all padding (an empty prompt?)",
                    row + 1
                )));
            }
            if let Some(&beyond) = positions.iter().find(|&&p| p >= max_positions) {
                return Err(TextError::Input(format!(
                    "sequence {}: position {beyond} is beyond the model's max_position_embeddings \
                     = {max_positions} (the prompt, with what was generated, is too long)",
                    row + 1
                )));
            }
        }
        for (row, mask) in mask.iter().enumerate() {
            next_position[row] += mask.iter().filter(|&&real| real).count();
            so_far[row].extend(mask);
        }
        self.mask = so_far;
        self.next_position = next_position;
        Ok(Positions {
            ids,
            mask: self.mask.clone(),
            past,
        })
    }
}

/// Refuses a per-token table that is not `[batch][tokens]`.
fn check_shape<T>(
    table: &[Vec<T>],
    batch: usize,
    tokens: usize,
    name: &str,
) -> Result<(), TextError> {
    if table.len() != batch || table.iter().any(|row| row.len() != tokens) {
        return Err(TextError::Input(format!(
            "{name} must be [{batch}][{tokens}], one entry per new token"
        )));
    }
    Ok(())
}
