//! Turning images into tokens, as every ViT here does it.

use burn::nn::Embedding;
use burn::nn::conv::Conv2d;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// The patch tokens of `pixels` `[batch, 3, H, W]` through the patch convolution, row-major
/// `[batch, rows · cols, hidden]`, and the grid `(rows, cols)`.
pub(crate) fn patch_tokens<B: Backend>(
    projection: &Conv2d<B>,
    pixels: Tensor<B, 4>,
) -> (Tensor<B, 3>, (usize, usize)) {
    let patches = projection.forward(pixels);
    let [batch, hidden, rows, cols] = patches.dims();
    let tokens = patches
        .reshape([batch, hidden, rows * cols])
        .swap_dims(1, 2);
    (tokens, (rows, cols))
}

/// The first `count` rows of a learned position table, `[1, count, hidden]`.
pub(crate) fn learned_positions<B: Backend>(
    table: &Embedding<B>,
    count: usize,
    device: &B::Device,
) -> Tensor<B, 3> {
    let positions = Tensor::<B, 1, Int>::arange(0..count as i64, device);
    table.forward(positions.unsqueeze())
}
