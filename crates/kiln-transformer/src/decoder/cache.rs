//! The key/value cache of incremental decoding: each layer's rotated keys and values of every
//! token so far, with the padding mask and the next position of each sequence.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Tensor, TensorData};

use kiln_kernels::host::Rows;

/// New tokens a decoder cannot take after what its cache holds; the message says which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokensError {
    /// No sequence, or sequences of no token.
    #[error("the input has no tokens (an empty prompt?)")]
    Empty,
    /// Another batch size than the cache's.
    #[error("a batch of {batch} after a cache of {cached} sequences")]
    BatchChanged {
        /// Sequences in the new tokens.
        batch: usize,
        /// Sequences the cache holds.
        cached: usize,
    },
    /// A per-token table (`attention_mask`, `position_ids`) of another shape than the tokens'.
    #[error("{table} must be [{batch}][{tokens}], one entry per new token")]
    Shape {
        /// The table's name.
        table: &'static str,
        /// Sequences in the new tokens.
        batch: usize,
        /// New tokens per sequence.
        tokens: usize,
    },
    /// A sequence with no real token, cached or new (1-based).
    #[error("sequence {sequence} is all padding (an empty prompt?)")]
    AllPadding {
        /// The sequence, 1-based.
        sequence: usize,
    },
    /// A position the model has no embedding for.
    #[error(
        "sequence {sequence}: position {position} is beyond the model's max_position_embeddings \
         = {max_positions} (the prompt, with what was generated, is too long)"
    )]
    BeyondPositions {
        /// The sequence, 1-based.
        sequence: usize,
        /// The first position at or beyond `max_positions`.
        position: usize,
        /// The model's `max_position_embeddings`.
        max_positions: usize,
    },
    /// A second forward through a cache that keeps no keys and values.
    #[error(
        "this cache keeps no keys and values, so it serves one forward: give the next tokens a \
         cache that keeps them (KvCache::new)"
    )]
    Spent,
    /// A prefix to share that is not one sequence of real tokens.
    #[error(
        "a shared prefix is one sequence of real tokens; this cache holds {sequences} sequences, \
         with {padding} padding tokens"
    )]
    NotShareable {
        /// Sequences held.
        sequences: usize,
        /// Padding tokens among them.
        padding: usize,
    },
}

/// A forward's new tokens as the cache sees them: `batch` sequences of `tokens` each, with their
/// padding mask and positions when the caller gives them (`None`: all real, and positions
/// following on from the cache's).
#[derive(Debug, Clone, Copy)]
pub struct NewTokens<'a> {
    /// Sequences.
    pub batch: usize,
    /// New tokens per sequence.
    pub tokens: usize,
    /// `[batch][tokens]`, `false` for padding.
    pub attention_mask: Option<&'a [Vec<bool>]>,
    /// `[batch][tokens]` rotary positions.
    pub position_ids: Option<&'a [Vec<usize>]>,
}

/// Keys and values of the tokens a decoder has seen, per layer. A new cache is empty; each
/// forward appends its tokens.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    /// Whether keys and values are kept (not for a single forward over whole sequences).
    keeps: bool,
    /// A cache that keeps nothing has served its forward.
    spent: bool,
    /// `[batch][tokens so far]`: `false` for padding.
    mask: Vec<Vec<bool>>,
    /// Each sequence's count of real tokens so far (its next position).
    next_position: Vec<usize>,
}

/// One layer's keys and values, rotated, for every token so far.
#[derive(Debug, Clone)]
pub struct LayerCache<B: Backend>(Held<B>);

#[derive(Debug, Clone)]
enum Held<B: Backend> {
    /// Nothing yet.
    Empty,
    /// Nothing, ever: the cache of a forward pass that keeps no keys and values.
    Discarded,
    /// Tensors `[batch, kv_heads, tokens so far, head_dim]` (burn's operations).
    Tensors(Tensor<B, 4>, Tensor<B, 4>),
    /// Row-major host keys and values `[batch, capacity, kv_heads · head_dim]`, each sequence's
    /// tokens so far first (the host kernels). The capacity at least doubles when it grows, so
    /// a decoding step copies its own tokens, not the whole cache.
    Host {
        keys: Vec<f32>,
        values: Vec<f32>,
        capacity: usize,
    },
    /// Layer `layer` of a prefix every sequence shares, laid out by the first forward as its
    /// execution reads it; kept after it as the others are, or not.
    Shared {
        prefix: SharedPrefix,
        layer: usize,
        keeps: bool,
    },
}

/// The keys and values of a prefix that every sequence of a batch starts with (a chat template's
/// system turn), computed once ([`KvCache::share`]) and read by each forward after it
/// ([`KvCache::after`]): per layer, its tokens' keys (rotated) and values `[tokens, kv_heads ·
/// head_dim]`, f32 on the host, for any backend and batch size.
#[derive(Clone)]
pub struct SharedPrefix {
    layers: Arc<[(Vec<f32>, Vec<f32>)]>,
    tokens: usize,
}

impl std::fmt::Debug for SharedPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPrefix")
            .field("layers", &self.layers.len())
            .field("tokens", &self.tokens)
            .finish()
    }
}

impl SharedPrefix {
    /// Tokens in the prefix.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Decoder layers it holds keys and values of.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }

    /// Key (and value) columns per token, `kv_heads · head_dim`.
    pub fn kv_width(&self) -> usize {
        self.layers
            .first()
            .map_or(0, |(keys, _)| keys.len() / self.tokens.max(1))
    }

    /// Layer `layer`'s keys and values repeated for `batch` sequences, `[batch, tokens, kv_width]`
    /// row-major.
    fn repeated(&self, layer: usize, batch: usize) -> [TensorData; 2] {
        let (keys, values) = &self.layers[layer];
        let shape = [batch, self.tokens, self.kv_width()];
        [keys, values].map(|held| TensorData::new(held.repeat(batch), shape))
    }
}

impl<B: Backend> LayerCache<B> {
    /// The keys and values so far with `key` and `value` appended along the tokens.
    pub(crate) fn append(
        &mut self,
        key: Tensor<B, 4>,
        value: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let joined = match std::mem::replace(&mut self.0, Held::Empty) {
            Held::Discarded => {
                self.0 = Held::Discarded;
                return (key, value);
            }
            Held::Tensors(keys, values) => (
                Tensor::cat(vec![keys, key], 2),
                Tensor::cat(vec![values, value], 2),
            ),
            Held::Shared {
                prefix,
                layer,
                keeps,
            } => {
                let [batch, kv_heads, _, head_dim] = key.dims();
                let (device, dtype) = (key.device(), FloatDType::from(key.dtype()));
                let [keys, values] = prefix.repeated(layer, batch).map(|data| {
                    Tensor::<B, 3>::from_data(data, &device)
                        .reshape([batch, prefix.tokens, kv_heads, head_dim])
                        .swap_dims(1, 2)
                        .cast(dtype)
                });
                let joined = (
                    Tensor::cat(vec![keys, key], 2),
                    Tensor::cat(vec![values, value], 2),
                );
                if !keeps {
                    self.0 = Held::Discarded;
                    return joined;
                }
                joined
            }
            _ => (key, value),
        };
        self.0 = Held::Tensors(joined.0.clone(), joined.1.clone());
        joined
    }

    /// The shared prefix's keys and values `[batch, prefix tokens, kv_heads · head_dim]` (f32),
    /// for an execution that joins them to the new tokens' itself; `None` without a prefix.
    pub(crate) fn shared_rows(
        &self,
        batch: usize,
        device: &B::Device,
    ) -> Option<(Tensor<B, 3>, Tensor<B, 3>)> {
        let Held::Shared { prefix, layer, .. } = &self.0 else {
            return None;
        };
        let [keys, values] = prefix
            .repeated(*layer, batch)
            .map(|data| Tensor::from_data(data, device));
        Some((keys, values))
    }

    /// Appends the new tokens' keys and values, each `width` columns of the `[batch · tokens,
    /// row_stride]` rows `new` from columns `key_column` and `value_column`, after the `past`
    /// tokens held; returns the keys and values so far (`past + tokens` per sequence), or `None`
    /// for a discarded cache (the new tokens' are all there are, in `new`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn append_host(
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
        match &self.0 {
            Held::Discarded => return None,
            Held::Host { .. } => {}
            Held::Shared { prefix, layer, .. } => {
                // Each sequence's rows: the prefix's, then room for the new tokens.
                let laid_out = |shared: &[f32]| {
                    let mut rows = vec![0f32; batch * total * width];
                    for sequence in rows.chunks_exact_mut(total * width) {
                        sequence[..shared.len()].copy_from_slice(shared);
                    }
                    rows
                };
                let (keys, values) = &prefix.layers[*layer];
                self.0 = Held::Host {
                    keys: laid_out(keys),
                    values: laid_out(values),
                    capacity: total,
                };
            }
            _ => {
                self.0 = Held::Host {
                    keys: Vec::new(),
                    values: Vec::new(),
                    capacity: 0,
                }
            }
        }
        let Held::Host {
            keys,
            values,
            capacity,
        } = &mut self.0
        else {
            unreachable!("just made a host cache")
        };
        if total > *capacity {
            let grown = total.max(2 * *capacity);
            for held in [&mut *keys, &mut *values] {
                let mut larger = vec![0f32; batch * grown * width];
                for (sequence, to) in larger.chunks_exact_mut(grown * width).enumerate() {
                    to[..past * width]
                        .copy_from_slice(&held[sequence * *capacity * width..][..past * width]);
                }
                *held = larger;
            }
            *capacity = grown;
        }
        let stride = *capacity * width;
        for (sequence, rows) in new.chunks_exact(tokens * row_stride).enumerate() {
            for (t, row) in rows.chunks_exact(row_stride).enumerate() {
                let at = sequence * stride + (past + t) * width;
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
#[derive(Debug, Clone)]
pub struct Positions {
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
            spent: false,
            mask: Vec::new(),
            next_position: Vec::new(),
        }
    }

    /// A cache for `batch` sequences that all start with `prefix` (its keys and values already
    /// computed, [`Self::share`]); keeps the keys and values of the forwards after it.
    pub fn after(prefix: &SharedPrefix, batch: usize) -> Self {
        Self::after_prefix(prefix, batch, true)
    }

    /// [`Self::after`] for one forward over whole sequences, which keeps nothing of its own
    /// (scoring and training after a shared prefix).
    pub fn discarding_after(prefix: &SharedPrefix, batch: usize) -> Self {
        Self::after_prefix(prefix, batch, false)
    }

    fn after_prefix(prefix: &SharedPrefix, batch: usize, keeps: bool) -> Self {
        let layers = (0..prefix.layers())
            .map(|layer| {
                LayerCache(Held::Shared {
                    prefix: prefix.clone(),
                    layer,
                    keeps,
                })
            })
            .collect();
        KvCache {
            layers,
            keeps,
            spent: false,
            mask: vec![vec![true; prefix.tokens]; batch],
            next_position: vec![prefix.tokens; batch],
        }
    }

    /// The keys and values this cache holds, of one sequence of real tokens, to start other
    /// sequences with ([`Self::after`]).
    pub fn share(&self) -> Result<SharedPrefix, TokensError> {
        let padding = self.mask.iter().flatten().filter(|&&real| !real).count();
        if self.mask.len() != 1 || padding > 0 || !self.keeps {
            return Err(TokensError::NotShareable {
                sequences: self.mask.len(),
                padding,
            });
        }
        let tokens = self.len();
        let layers = self.layers.iter().map(|layer| match &layer.0 {
            Held::Host {
                keys,
                values,
                capacity,
            } => {
                let width = keys.len() / (*capacity).max(1);
                (
                    keys[..tokens * width].to_vec(),
                    values[..tokens * width].to_vec(),
                )
            }
            Held::Tensors(keys, values) => {
                let rows = |x: &Tensor<B, 4>| {
                    let [_, heads, _, head_dim] = x.dims();
                    let rows = x
                        .clone()
                        .swap_dims(1, 2)
                        .reshape([tokens, heads * head_dim]);
                    let data = rows.into_data().convert::<f32>();
                    data.into_vec::<f32>().expect("converted to f32")
                };
                (rows(keys), rows(values))
            }
            Held::Shared { prefix, layer, .. } => prefix.layers[*layer].clone(),
            Held::Empty | Held::Discarded => (Vec::new(), Vec::new()),
        });
        Ok(SharedPrefix {
            layers: layers.collect(),
            tokens,
        })
    }

    /// Whether a decoder of `layers` layers with key/value rows `kv_width` wide can read this
    /// cache (an empty one, or one from such a decoder).
    pub fn fits(&self, layers: usize, kv_width: usize) -> bool {
        self.layers.is_empty()
            || (self.layers.len() == layers
                && self.layers.iter().all(|layer| match &layer.0 {
                    Held::Shared { prefix, .. } => prefix.kv_width() == kv_width,
                    _ => true,
                }))
    }

    /// A cache for one forward pass over whole sequences, which keeps no keys and values (their
    /// copies were 2–3% of a batch's prefill).
    pub fn discarding() -> Self {
        KvCache {
            keeps: false,
            ..Self::new()
        }
    }

    /// Whether the cache keeps the keys and values of its forwards.
    pub fn keeps(&self) -> bool {
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

    /// The caches of a decoder's `count` layers, made on first use.
    pub fn layers(&mut self, count: usize) -> std::slice::IterMut<'_, LayerCache<B>> {
        if self.layers.is_empty() {
            let held = if self.keeps {
                Held::Empty
            } else {
                Held::Discarded
            };
            self.layers = (0..count).map(|_| LayerCache(held.clone())).collect();
        }
        self.layers.iter_mut()
    }

    /// Checks `new` against what the cache holds and records its tokens: their positions and
    /// the mask of everything so far. Refuses an empty input, another batch size than the
    /// cache's, tables of another shape than the tokens', a sequence with no real token, and
    /// positions at or beyond `max_positions`.
    pub fn extend(
        &mut self,
        new: NewTokens<'_>,
        max_positions: usize,
    ) -> Result<Positions, TokensError> {
        let NewTokens { batch, tokens, .. } = new;
        if batch == 0 || tokens == 0 {
            return Err(TokensError::Empty);
        }
        if self.spent {
            return Err(TokensError::Spent);
        }
        let past = self.len();
        if past > 0 && self.mask.len() != batch {
            return Err(TokensError::BatchChanged {
                batch,
                cached: self.mask.len(),
            });
        }
        let mask = match new.attention_mask {
            Some(mask) => {
                check_shape(mask, batch, tokens, "attention_mask")?;
                mask.to_vec()
            }
            None => vec![vec![true; tokens]; batch],
        };
        let (mut so_far, mut next_position) = if past == 0 {
            (vec![Vec::new(); batch], vec![0; batch])
        } else {
            (self.mask.clone(), self.next_position.clone())
        };
        let ids = match new.position_ids {
            Some(ids) => {
                check_shape(ids, batch, tokens, "position_ids")?;
                ids.to_vec()
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
                return Err(TokensError::AllPadding { sequence: row + 1 });
            }
            if let Some(&position) = positions.iter().find(|&&p| p >= max_positions) {
                return Err(TokensError::BeyondPositions {
                    sequence: row + 1,
                    position,
                    max_positions,
                });
            }
        }
        for (row, mask) in mask.iter().enumerate() {
            next_position[row] += mask.iter().filter(|&&real| real).count();
            so_far[row].extend(mask);
        }
        self.mask = so_far;
        self.next_position = next_position;
        self.spent = !self.keeps;
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
    name: &'static str,
) -> Result<(), TokensError> {
    if table.len() != batch || table.iter().any(|row| row.len() != tokens) {
        return Err(TokensError::Shape {
            table: name,
            batch,
            tokens,
        });
    }
    Ok(())
}
