//! How queries read frames: the deep and shallow readouts, and padding frames read as zero.

use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_vision::Dinov2Patches;

use super::{FoveatedModel, Glimpse};
use crate::{FoveatedError, Readout, Variant};

impl<B: Backend> FoveatedModel<B> {
    /// Every frame of `pixels` `[clips, frames, 3, H, W]` through DINOv2 in one batch (frame
    /// `t` of clip `c` is row `c · frames + t`), keeping what the readouts read.
    pub fn encode_frames(&self, pixels: Tensor<B, 5>) -> Result<Dinov2Patches<B>, FoveatedError> {
        let [clips, frames, ..] = pixels.dims();
        self.encode_rows(pixels, &(0..clips * frames).map(Some).collect::<Vec<_>>())
    }

    /// The frames of `pixels` that `rows` names (`Some` per real frame of `[clips · frames]`)
    /// through DINOv2 in one batch; padding frames are never encoded (a text-only batch: no
    /// frame at all, as fVLM encodes none).
    pub(super) fn encode_rows(
        &self,
        pixels: Tensor<B, 5>,
        rows: &[Option<usize>],
    ) -> Result<Dinov2Patches<B>, FoveatedError> {
        let [clips, frames, channels, height, width] = pixels.dims();
        if rows.iter().all(Option::is_none) {
            return Ok(self.no_patches(height, width, &pixels.device()));
        }
        let mut flat = pixels.reshape([clips * frames, channels, height, width]);
        if rows.iter().any(Option::is_none) {
            let real: Vec<usize> = (rows.iter().enumerate())
                .filter_map(|(at, row)| row.map(|_| at))
                .collect();
            let device = flat.device();
            flat = flat.select(0, indices(&real, &device));
        }
        let patches = self.dino.encode_patches(flat)?;
        Ok(if self.config.keep_cls {
            patches
        } else {
            patches.without_cls()
        })
    }

    /// The readouts' inputs for no frame at all, `[0, tokens, hidden]` (frames of `height ×
    /// width`): what a batch of text alone reads from.
    fn no_patches(&self, height: usize, width: usize, device: &B::Device) -> Dinov2Patches<B> {
        let config = self.dino.config();
        let patches = (height / config.patch_size) * (width / config.patch_size);
        let tokens = patches + usize::from(self.config.keep_cls);
        let empty = || Tensor::zeros([0, tokens, config.hidden_size], device);
        Dinov2Patches {
            last_hidden_state: empty(),
            keys_values: (0..config.num_hidden_layers)
                .map(|_| [empty(), empty()])
                .collect(),
        }
    }

    /// What `queries` `[frames, query_dim]` read from `patches` (one query per frame).
    pub fn read(
        &self,
        patches: &Dinov2Patches<B>,
        queries: Tensor<B, 2>,
    ) -> Result<Glimpse<B>, FoveatedError> {
        let connectors = &self.connectors;
        let queries = connectors
            .query_input_proj
            .forward(queries)
            .unsqueeze_dim(1);
        let (read, attention) = match (self.config.readout, self.config.variant) {
            (Readout::Deep, _) => {
                let reading = self.dino.read_with_attention(queries, patches)?;
                (reading.output, Tensor::cat(reading.attention, 1))
            }
            (Readout::Shallow, Variant::Release) => {
                let reading = self.dino.read_shallow(queries, patches)?;
                (reading.output, Tensor::cat(reading.attention, 1))
            }
            (Readout::Shallow, Variant::Research) => shallow_read(
                queries,
                patches.last_hidden_state.clone(),
                self.config.shallow_heads,
            ),
        };
        let [frames, _, width] = read.dims();
        let tokens = connectors
            .output_proj
            .forward(read.reshape([frames, width]));
        let [_, weights, _, patch_tokens] = attention.dims();
        Ok(Glimpse {
            tokens,
            attention: attention.reshape([frames, weights, patch_tokens]),
        })
    }

    /// What `queries` `[rows, query_dim]` read, row r from the encoded frame `rows[r]`: a padding
    /// frame (`None`) is not read, its token and attention zero (fVLM's `frame_mask`).
    pub(super) fn read_rows(
        &self,
        patches: &Dinov2Patches<B>,
        queries: Tensor<B, 2>,
        rows: &[Option<usize>],
    ) -> Result<Glimpse<B>, FoveatedError> {
        let real: Vec<usize> = rows.iter().flatten().copied().collect();
        let in_order = real.iter().enumerate().all(|(at, &row)| at == row);
        if real.len() == rows.len() && in_order && real.len() == patches.frames() {
            return self.read(patches, queries);
        }
        let device = queries.device();
        let width = self.dino.hidden_size();
        let tokens = patches.last_hidden_state.dims()[1];
        let weights = match self.config.readout {
            Readout::Deep => {
                self.dino.config().num_hidden_layers * self.dino.config().num_attention_heads
            }
            Readout::Shallow => match self.config.variant {
                Variant::Release => self.dino.config().num_attention_heads,
                Variant::Research => self.config.shallow_heads,
            },
        };
        let zero_tokens = Tensor::zeros([1, width], &device);
        let zero_attention = Tensor::zeros([1, weights, tokens], &device);
        if real.is_empty() {
            let n = rows.len();
            return Ok(Glimpse {
                tokens: zero_tokens.expand([n, width]),
                attention: zero_attention.expand([n, weights, tokens]),
            });
        }
        let reading: Vec<usize> = (rows.iter().enumerate())
            .filter_map(|(at, row)| row.map(|_| at))
            .collect();
        let glimpse = self.read(
            &select_frames(patches, indices(&real, &device)),
            queries.select(0, indices(&reading, &device)),
        )?;
        // Row r takes its reading, or the zero row after the last reading.
        let mut next = 0;
        let gather: Vec<usize> = rows
            .iter()
            .map(|row| match row {
                Some(_) => {
                    next += 1;
                    next - 1
                }
                None => real.len(),
            })
            .collect();
        let gather = indices(&gather, &device);
        Ok(Glimpse {
            tokens: Tensor::cat(vec![glimpse.tokens, zero_tokens], 0).select(0, gather.clone()),
            attention: Tensor::cat(vec![glimpse.attention, zero_attention], 0).select(0, gather),
        })
    }
}

/// `values` as a 1-D index tensor.
fn indices<B: Backend>(values: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let values: Vec<i64> = values.iter().map(|&v| v as i64).collect();
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// The research variant's shallow readout (fVLM's research code), multi-head: per head, `softmax(q·Pᵀ/√d)·P` of the queries `[frames,
/// queries, width]` over the patch features `[frames, tokens, width]`, which serve as keys and
/// values both (no projections). Also gives the probabilities `[frames, heads, queries, tokens]`.
fn shallow_read<B: Backend>(
    queries: Tensor<B, 3>,
    patches: Tensor<B, 3>,
    heads: usize,
) -> (Tensor<B, 3>, Tensor<B, 4>) {
    let [frames, count, width] = queries.dims();
    let split = |x: Tensor<B, 3>| {
        let [frames, tokens, width] = x.dims();
        x.reshape([frames, tokens, heads, width / heads])
            .swap_dims(1, 2)
    };
    let (queries, patches) = (split(queries), split(patches));
    let scale = ((width / heads) as f64).powf(-0.5);
    let weights = softmax(queries.matmul(patches.clone().swap_dims(2, 3)) * scale, 3);
    let read = weights
        .clone()
        .matmul(patches)
        .swap_dims(1, 2)
        .reshape([frames, count, width]);
    (read, weights)
}

/// The rows `rows` of every tensor of `patches`.
fn select_frames<B: Backend>(
    patches: &Dinov2Patches<B>,
    rows: Tensor<B, 1, Int>,
) -> Dinov2Patches<B> {
    let select = |x: &Tensor<B, 3>| x.clone().select(0, rows.clone());
    Dinov2Patches {
        last_hidden_state: select(&patches.last_hidden_state),
        keys_values: patches
            .keys_values
            .iter()
            .map(|kv| [select(&kv[0]), select(&kv[1])])
            .collect(),
    }
}
