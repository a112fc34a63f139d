//! Turning images into tokens, as every ViT here does it.

use burn::nn::conv::Conv2d;
use burn::nn::{Embedding, PaddingConfig2d};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_kernels::{HostOp, host_op};
use rayon::prelude::*;

use crate::VisionError;
use kiln_kernels::host;
use kiln_transformer::Pass;
use kiln_transformer::projection::product_then;

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

/// Refuses pixels `[batch, channels, height, width]` that the patch convolution `conv` and,
/// when the tower has a fixed position table, its `positions` patch positions cannot take: no
/// images, another channel count, an image smaller than a patch, or a patch grid the table does
/// not cover. The messages name the `config.json` settings behind the model's numbers.
pub(crate) fn check_pixels<B: Backend>(
    conv: &Conv2d<B>,
    positions: Option<usize>,
    [batch, channels, height, width]: [usize; 4],
) -> Result<(), VisionError> {
    let [_, want_channels, ph, pw] = conv.weight.dims();
    let problem = if batch == 0 {
        Some("no images".to_string())
    } else if channels != want_channels {
        Some(format!(
            "{channels} channel(s); the model takes {want_channels} (config.json num_channels)"
        ))
    } else if height < ph || width < pw {
        Some(format!(
            "{height} × {width} pixels, smaller than one {ph} × {pw} patch (config.json \
             patch_size)"
        ))
    } else {
        positions
            .filter(|&n| (height / ph) * (width / pw) != n)
            .map(|n| {
                let side = (n as f64).sqrt().round() as usize;
                format!(
                    "{height} × {width} pixels; the model takes {} × {} (config.json image_size, \
                     patch_size {ph}: its position table covers {n} patches)",
                    side * ph,
                    side * pw
                )
            })
    };
    match problem {
        Some(problem) => Err(VisionError::Pixels(format!(
            "pixels [{batch}, {channels}, {height}, {width}]: {problem}"
        ))),
        None => Ok(()),
    }
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
    let unfolded = Unfold {
        pixels: [batch, channels, height, width],
        patch: [ph, pw],
    }
    .forward([host::f32s(&pixels)]);
    let kernel = pass.prepared().unfolded_kernel(conv);
    let unfolded = TensorData::new(unfolded, [batch * rows * cols, depth]);
    let tokens = product_then(unfolded, &kernel, |v| v);
    let tokens = TensorData::new(tokens, [batch, rows * cols, hidden]);
    (Tensor::from_data(tokens, &device), (rows, cols))
}

/// The same product as tensor operations, so that gradients flow (training): the patches are a
/// reshape and permutation of the pixels (on Flex one [`Unfold`] operation, where burn-flex
/// copied the permuted view one element at a time), then one matrix product, where burn-flex's
/// convolution and its backward pass were slower (docs/PERFORMANCE.md).
fn unfolded_tensor_product<B: Backend>(
    conv: &Conv2d<B>,
    pixels: Tensor<B, 4>,
) -> (Tensor<B, 3>, (usize, usize)) {
    let [batch, channels, height, width] = pixels.dims();
    let [hidden, _, ph, pw] = conv.weight.dims();
    let (rows, cols) = (height / ph, width / pw);
    let depth = channels * ph * pw;
    // The convolution ignores the rows and columns past the last whole patch.
    let unfold = Unfold {
        pixels: [batch, channels, height, width],
        patch: [ph, pw],
    };
    let patches = host_op(unfold, [&pixels], [batch * rows * cols, depth]).unwrap_or_else(|| {
        pixels
            .slice([0..batch, 0..channels, 0..rows * ph, 0..cols * pw])
            .reshape([batch, channels, rows, ph, cols, pw])
            .permute([0, 2, 4, 1, 3, 5])
            .reshape([batch * rows * cols, depth])
    });
    let kernel = conv.weight.val().reshape([hidden, depth]).transpose();
    let mut tokens = patches.matmul(kernel);
    if let Some(bias) = &conv.bias {
        tokens = tokens + bias.val().unsqueeze();
    }
    (tokens.reshape([batch, rows * cols, hidden]), (rows, cols))
}

/// Images `[batch, channels, height, width]` cut into patches `[ph, pw]`: row `(image, patch)`
/// holds the patch's pixels in `(channel, y, x)` order (a convolution kernel's); rows and
/// columns past the last whole patch are left out.
#[derive(Debug, Clone)]
struct Unfold {
    pixels: [usize; 4],
    patch: [usize; 2],
}

impl Unfold {
    /// Runs of `pw` pixels in one image's patches, and pixels in one image.
    fn per_image(&self) -> (usize, usize) {
        let [_, channels, height, width] = self.pixels;
        let [ph, pw] = self.patch;
        (
            (height / ph) * (width / pw) * channels * ph,
            channels * height * width,
        )
    }

    /// Where each run of `pw` pixels of one image lies: `(in its unfolded rows, in its pixels)`.
    fn runs(&self) -> impl Iterator<Item = (usize, usize)> {
        let [_, channels, height, width] = self.pixels;
        let [ph, pw] = self.patch;
        let cols = width / pw;
        (0..(height / ph) * cols * channels * ph).map(move |run| {
            let (patch, line) = (run / (channels * ph), run % (channels * ph));
            let (row, col) = (patch / cols, patch % cols);
            let (channel, y) = (line / ph, row * ph + line % ph);
            (run * pw, (channel * height + y) * width + col * pw)
        })
    }
}

impl HostOp<1> for Unfold {
    fn forward(&self, [pixels]: [&[f32]; 1]) -> Vec<f32> {
        let ([batch, ..], [_, pw]) = (self.pixels, self.patch);
        let (runs, image) = self.per_image();
        let mut unfolded = vec![0f32; batch * runs * pw];
        unfolded
            .par_chunks_mut((runs * pw).max(1))
            .zip(pixels.par_chunks(image.max(1)))
            .for_each(|(out, pixels)| {
                for (at, from) in self.runs() {
                    out[at..at + pw].copy_from_slice(&pixels[from..from + pw]);
                }
            });
        unfolded
    }

    /// Each pixel lies in at most one patch: its gradient moves back into place (0 for pixels
    /// past the last whole patch).
    fn backward(&self, grad: &[f32], _: [&[f32]; 1]) -> [Vec<f32>; 1] {
        let ([batch, ..], [_, pw]) = (self.pixels, self.patch);
        let (runs, image) = self.per_image();
        let mut pixels = vec![0f32; batch * image];
        pixels
            .par_chunks_mut(image.max(1))
            .zip(grad.par_chunks((runs * pw).max(1)))
            .for_each(|(pixels, grad)| {
                for (at, to) in self.runs() {
                    pixels[to..to + pw].copy_from_slice(&grad[at..at + pw]);
                }
            });
        [pixels]
    }
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

    use crate::TowerSettings;
    use kiln_transformer::PreparedWeights;

    /// In training the patches are differentiable (on Flex through [`Unfold`]): the
    /// convolution's tokens, and the convolution's gradients for its weight, its bias and the
    /// pixels (0 past the last whole patch).
    #[test]
    fn tensor_unfolding_matches_the_convolution_and_its_gradients() {
        type Ad = burn::backend::Autodiff<Flex>;
        let device = Default::default();
        let pixels =
            Tensor::<Ad, 4>::random([2, 3, 37, 45], Distribution::Normal(0.0, 1.0), &device)
                .require_grad();
        let conv = Conv2dConfig::new([3, 20], [8, 8])
            .with_stride([8, 8])
            .init::<Ad>(&device);
        let weights = Tensor::<Ad, 3>::random([2, 20, 20], Distribution::Default, &device);
        let (got, grid) = unfolded_tensor_product(&conv, pixels.clone());
        assert_eq!(grid, (4, 5));
        let want = conv
            .forward(pixels.clone())
            .reshape([2, 20, 20])
            .swap_dims(1, 2);
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
        let pixel = |g| pixels.grad(g).expect("a pixel gradient");
        close(pixel(&ours), pixel(&theirs), "pixel gradient");
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
