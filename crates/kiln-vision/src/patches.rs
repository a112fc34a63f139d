//! Turning images into tokens, as every ViT here does it.

use burn::nn::conv::Conv2d;
use burn::nn::{Embedding, PaddingConfig2d};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use rayon::prelude::*;

use crate::host;
use crate::pass::Pass;
use crate::projection::product_then;

/// The patch tokens of `pixels` `[batch, 3, H, W]` through the patch convolution, row-major
/// `[batch, rows · cols, hidden]`, and the grid `(rows, cols)`.
///
/// On host backends in f32 a convolution that cuts the image into non-overlapping patches is one
/// product of the unfolded patches with the flattened kernel (burn-flex's convolution ran these
/// at 27–46 GFLOP/s, a third of its matrix products).
pub(crate) fn patch_tokens<B: Backend>(
    projection: &Conv2d<B>,
    pixels: Tensor<B, 4>,
    pass: &Pass,
) -> (Tensor<B, 3>, (usize, usize)) {
    if host::serves(&pixels) && tiles_the_image(projection) {
        return unfolded_product(projection, pixels, pass);
    }
    if B::ad_enabled(&pixels.device()) && tiles_the_image(projection) {
        return unfolded_tensor_product(projection, pixels);
    }
    let patches = projection.forward(pixels);
    let [batch, hidden, rows, cols] = patches.dims();
    let tokens = patches
        .reshape([batch, hidden, rows * cols])
        .swap_dims(1, 2);
    (tokens, (rows, cols))
}

/// Whether `conv` cuts its input into non-overlapping patches: stride equal to the kernel, no
/// padding, dilation or groups.
fn tiles_the_image<B: Backend>(conv: &Conv2d<B>) -> bool {
    conv.stride == conv.kernel_size
        && conv.dilation == [1, 1]
        && conv.groups == 1
        && matches!(conv.padding, PaddingConfig2d::Valid)
}

/// [`patch_tokens`] as `unfold(pixels) · W + b`: row `(image, patch)` of the unfolded matrix holds
/// the patch's pixels in the kernel's `(channel, y, x)` order.
fn unfolded_product<B: Backend>(
    conv: &Conv2d<B>,
    pixels: Tensor<B, 4>,
    pass: &Pass,
) -> (Tensor<B, 3>, (usize, usize)) {
    let device = pixels.device();
    let [batch, channels, height, width] = pixels.dims();
    let [hidden, _, ph, pw] = conv.weight.dims();
    let (rows, cols) = (height / ph, width / pw);
    let depth = channels * ph * pw;
    let pixels = pixels.into_data();
    let values = host::f32s(&pixels);
    let mut unfolded = vec![0f32; batch * rows * cols * depth];
    unfolded
        .par_chunks_mut((rows * cols * depth).max(1))
        .enumerate()
        .for_each(|(image, patches)| {
            for (patch, out) in patches.chunks_exact_mut(depth).enumerate() {
                let (row, col) = (patch / cols, patch % cols);
                for (line, out) in out.chunks_exact_mut(pw).enumerate() {
                    let (channel, y) = (line / ph, row * ph + line % ph);
                    let start = ((image * channels + channel) * height + y) * width + col * pw;
                    out.copy_from_slice(&values[start..start + pw]);
                }
            }
        });
    let kernel = pass.prepared().unfolded_kernel(conv);
    let unfolded = TensorData::new(unfolded, [batch * rows * cols, depth]);
    let tokens = product_then(unfolded, &kernel, |v| v);
    let tokens = TensorData::new(tokens, [batch, rows * cols, hidden]);
    (Tensor::from_data(tokens, &device), (rows, cols))
}

/// The first `count` rows of a learned position table, `[1, count, hidden]`.
/// The same product as tensor operations, so that gradients flow (training): the patches are a
/// reshape and permutation of the pixels, then one matrix product, where burn-flex's convolution
/// and its backward pass were slower (the training step 0.65× → 0.70× PyTorch's,
/// docs/PERFORMANCE.md).
fn unfolded_tensor_product<B: Backend>(
    conv: &Conv2d<B>,
    pixels: Tensor<B, 4>,
) -> (Tensor<B, 3>, (usize, usize)) {
    let [batch, channels, height, width] = pixels.dims();
    let [hidden, _, ph, pw] = conv.weight.dims();
    let (rows, cols) = (height / ph, width / pw);
    let depth = channels * ph * pw;
    // The convolution ignores the rows and columns past the last whole patch.
    let pixels = pixels.slice([0..batch, 0..channels, 0..rows * ph, 0..cols * pw]);
    let patches = pixels
        .reshape([batch, channels, rows, ph, cols, pw])
        .permute([0, 2, 4, 1, 3, 5])
        .reshape([batch * rows * cols, depth]);
    let kernel = conv.weight.val().reshape([hidden, depth]).transpose();
    let mut tokens = patches.matmul(kernel);
    if let Some(bias) = &conv.bias {
        tokens = tokens + bias.val().unsqueeze();
    }
    (tokens.reshape([batch, rows * cols, hidden]), (rows, cols))
}

pub(crate) fn learned_positions<B: Backend>(
    table: &Embedding<B>,
    count: usize,
    device: &B::Device,
) -> Tensor<B, 3> {
    let positions = Tensor::<B, 1, Int>::arange(0..count as i64, device);
    table.forward(positions.unsqueeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::nn::conv::Conv2dConfig;
    use burn::tensor::Distribution;

    use crate::pass::TowerSettings;
    use crate::prepared::PreparedWeights;

    /// In training the patches are tensor operations: the convolution's tokens, and the
    /// convolution's gradients for its weight and bias.
    #[test]
    fn tensor_unfolding_matches_the_convolution_and_its_gradients() {
        type Ad = burn::backend::Autodiff<Flex>;
        let device = Default::default();
        let pixels =
            Tensor::<Ad, 4>::random([2, 3, 37, 45], Distribution::Normal(0.0, 1.0), &device);
        let conv = Conv2dConfig::new([3, 20], [8, 8])
            .with_stride([8, 8])
            .init::<Ad>(&device);
        let weights = Tensor::<Ad, 3>::random([2, 20, 20], Distribution::Default, &device);
        let (got, grid) = unfolded_tensor_product(&conv, pixels.clone());
        assert_eq!(grid, (4, 5));
        let want = conv.forward(pixels).reshape([2, 20, 20]).swap_dims(1, 2);
        let close = |a: Tensor<Flex, 4>, b: Tensor<Flex, 4>, what: &str| {
            let diff = (a - b.clone()).abs().max().into_scalar();
            let size = b.abs().max().into_scalar();
            assert!(diff <= 1e-5 * size, "{what}: max |Δ| {diff} of {size}");
        };
        close(
            got.clone().inner().unsqueeze(),
            want.clone().inner().unsqueeze(),
            "tokens",
        );
        let ours = (got * weights.clone()).sum().backward();
        let theirs = (want * weights).sum().backward();
        let weight = |g| conv.weight.grad(g).expect("a weight gradient");
        close(weight(&ours), weight(&theirs), "weight gradient");
        let bias = |g| {
            conv.bias
                .as_ref()
                .unwrap()
                .grad(g)
                .expect("a bias gradient")
        };
        close(
            bias(&ours).unsqueeze(),
            bias(&theirs).unsqueeze(),
            "bias gradient",
        );
    }

    /// The unfolded product against burn's convolution, with and without a bias, on an image
    /// whose sides are not multiples of the patch (the convolution drops the remainder).
    #[test]
    fn unfolded_patches_match_the_convolution() {
        let device = Default::default();
        let pixels =
            Tensor::<Flex, 4>::random([2, 3, 37, 45], Distribution::Normal(0.0, 1.0), &device);
        let pass = Pass::new(&TowerSettings::default(), &PreparedWeights::default(), None);
        for bias in [true, false] {
            let conv = Conv2dConfig::new([3, 20], [8, 8])
                .with_stride([8, 8])
                .with_bias(bias)
                .init::<Flex>(&device);
            assert!(tiles_the_image(&conv));
            let (got, grid) = unfolded_product(&conv, pixels.clone(), &pass);
            let want = conv.forward(pixels.clone());
            assert_eq!(grid, (4, 5));
            let want = want.reshape([2, 20, 20]).swap_dims(1, 2);
            let diff = (got - want.clone()).abs().max().into_scalar();
            let size = want.abs().max().into_scalar();
            assert!(diff <= 1e-5 * size, "bias {bias}: max |Δ| {diff} of {size}");
        }
    }
}
