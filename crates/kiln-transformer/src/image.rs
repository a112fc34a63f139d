//! NHWC images on the host backends and the layers of convolutional frame models over them.
//!
//! Convolutions: images kept NHWC between layers ([`HostImage`]), each
//! convolution one product of the unfolded windows with the kernel prepared once
//! ([`PreparedWeights::conv_nhwc`]), each transposed convolution one product per output phase
//! ([`PreparedWeights::transposed_conv_phases`]), the activation applied as the product's tiles
//! are stored. Where the channels are many, stride-1 3 × 3 convolutions and the phases of
//! 4 × 4 / 2 transposed convolutions go through Winograd's minimal filtering instead
//! ([`host::winograd`]: 2.25× and 1.78× fewer multiplications). burn-flex's convolutions ran
//! mirage-hello's U-Net at half PyTorch's speed on this CPU (docs/PERFORMANCE.md).

use burn::module::Param;
use burn::nn::conv::{Conv2d, ConvTranspose2d};
use burn::nn::{GroupNorm, PaddingConfig2d};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln_kernels::gemm::Products;
use kiln_kernels::gemm::bf16::PaddedImage;
use kiln_kernels::gemm::sgemm;
use kiln_kernels::host;
use kiln_kernels::host::conv::{Nhwc, Window, Windows, nchw_to_nhwc, nhwc_to_nchw};
use kiln_kernels::host::winograd::{Correlation, F2X2, F2X3, Minimal, Phase, Placement};
use rayon::prelude::*;

use crate::PreparedWeights;
use crate::prepared::WinogradKernel;
use crate::projection::{
    product_on_this_thread, product_rows, product_windows, product_windows_into_rows,
};

/// Input and output channels from which a convolution goes through Winograd's minimal
/// filtering: with fewer, its products are too thin for the saved multiplications to pay for
/// the transforms (a frame model's first and last layers).
const WINOGRAD_CHANNELS: usize = 32;

/// Whether a stride-1 convolution of `taps` taps to `outputs` channels runs as a product of the
/// pixels with every tap at once, then sums of the taps ([`host::conv::sum_taps`]): where that
/// product's columns, in whole register tiles, are at most half of the unfolded product's
/// (`taps` rows of the kernel per column of its tiles): a frame model's last convolutions, to
/// 3 channels or 1. Also under bf16 products on AMX, where the unfolded product would read its
/// input in place but multiply a 32-column block for 3 columns (the U-Net's last convolution
/// alone: 0.22 ms the unfolded way, 0.16 ms by taps, on a Sapphire Rapids VM).
fn by_taps(taps: usize, outputs: usize) -> bool {
    taps > 1
        && 2 * (taps * outputs).next_multiple_of(sgemm::NR)
            <= taps * outputs.next_multiple_of(sgemm::NR)
}

/// An image batch on the host, its values NHWC (`[batch, height, width, channels]`): a pixel's
/// channels side by side, as a convolution's unfolded rows and attention's tokens read them.
#[derive(Debug, Clone, PartialEq)]
pub struct HostImage {
    /// The values, NHWC.
    pub values: Vec<f32>,
    /// `[batch, height, width, channels]`.
    pub shape: Nhwc,
}

impl HostImage {
    /// The NCHW f32 tensor `x` as an NHWC host image.
    pub fn from_nchw<B: Backend>(x: Tensor<B, 4>) -> Self {
        let [batch, channels, height, width] = x.dims();
        let data = x.into_data();
        HostImage {
            values: nchw_to_nhwc(host::f32s(&data), [batch, channels, height, width]),
            shape: [batch, height, width, channels],
        }
    }

    /// The image as an NCHW tensor on `device`.
    pub fn into_nchw<B: Backend>(self, device: &B::Device) -> Tensor<B, 4> {
        let [batch, height, width, channels] = self.shape;
        let values = nhwc_to_nchw(&self.values, self.shape);
        Tensor::from_data(
            TensorData::new(values, [batch, channels, height, width]),
            device,
        )
    }

    /// The image's pixels as tokens `[batch, height · width, channels]` (no copy: NHWC is that
    /// layout already).
    pub fn into_tokens<B: Backend>(self, device: &B::Device) -> Tensor<B, 3> {
        let [batch, height, width, channels] = self.shape;
        let data = TensorData::new(self.values, [batch, height * width, channels]);
        Tensor::from_data(data, device)
    }

    /// Tokens `[batch, height · width, channels]` as an image of `height × width`.
    pub fn from_tokens<B: Backend>(tokens: Tensor<B, 3>, [height, width]: [usize; 2]) -> Self {
        let [batch, _, channels] = tokens.dims();
        let data = tokens.into_data();
        HostImage {
            values: host::f32s(&data).to_vec(),
            shape: [batch, height, width, channels],
        }
    }

    /// `f(conv(self))`, or `None` where kiln's host convolution does not serve `conv` (dilation
    /// or groups, asymmetric padding).
    pub fn conv<B: Backend>(
        &self,
        conv: &Conv2d<B>,
        prepared: &PreparedWeights,
        f: impl Fn(f32) -> f32 + Sync,
    ) -> Option<HostImage> {
        let [batch, height, width, channels] = self.shape;
        let padding = match conv.padding {
            PaddingConfig2d::Valid => [0, 0],
            PaddingConfig2d::Explicit(top, left, bottom, right)
                if top == bottom && left == right =>
            {
                [top, left]
            }
            _ => return None,
        };
        if conv.dilation != [1, 1] || conv.groups != 1 {
            return None;
        }
        let window = Window {
            kernel: conv.kernel_size,
            stride: conv.stride,
            padding,
        };
        let [out_height, out_width] = window.conv_output([height, width]);
        let outputs = conv.weight.dims()[0];
        let windows = Windows::new(&self.values, self.shape, window);
        let taps = window.kernel[0] * window.kernel[1];
        if window.stride == [1, 1] && by_taps(taps, outputs) {
            let kernel = prepared.conv_taps(conv);
            let products = product_rows(&self.values, channels, &kernel.taps, |v| v);
            return Some(HostImage {
                values: host::conv::sum_taps(&products, self.shape, &window, &kernel.bias, f),
                shape: [batch, out_height, out_width, outputs],
            });
        }
        let padded = self.in_place(prepared, &[&windows]);
        if padded.is_none()
            && window.kernel == [3, 3]
            && window.stride == [1, 1]
            && self.wide_enough(outputs)
        {
            let correlation = Correlation {
                origin: padding.map(|p| -(p as isize)),
                out: [out_height, out_width],
            };
            let kernel = prepared.conv_winograd(conv);
            let jobs = [(correlation, Placement::SAME)];
            let size = [out_height, out_width];
            return Some(self.winograd(&F2X3, &jobs, std::slice::from_ref(&*kernel), size, f));
        }
        let weight = prepared.conv_nhwc(conv);
        let depth = taps * channels;
        let values = if depth == channels && window.stride == [1, 1] && padding == [0, 0] {
            product_rows(&self.values, depth, &weight, f) // a 1 × 1 convolution: rows as they are
        } else {
            product_windows(&windows, &weight, padded.as_ref(), f)
        };
        Some(HostImage {
            values,
            shape: [batch, out_height, out_width, weight.columns()],
        })
    }

    /// `f(conv(self))` for a transposed convolution, or `None` where the host path does not
    /// serve it (dilation, groups, output padding).
    pub fn conv_transposed<B: Backend>(
        &self,
        conv: &ConvTranspose2d<B>,
        prepared: &PreparedWeights,
        f: impl Fn(f32) -> f32 + Sync,
    ) -> Option<HostImage> {
        self.transposed(conv, prepared, f, None)
    }

    /// `skip + f(conv(self))` for a transposed convolution, `skip` of the output's shape (a
    /// decoder's skip connection after its activation), or `None` as [`Self::conv_transposed`]:
    /// where its products read the image in place, summed into `skip`'s values as the products
    /// are stored, with no pass of their own.
    ///
    /// Panics when `skip` is not of the output's shape.
    pub fn conv_transposed_onto<B: Backend>(
        &self,
        conv: &ConvTranspose2d<B>,
        prepared: &PreparedWeights,
        f: impl Fn(f32) -> f32 + Sync,
        skip: HostImage,
    ) -> Option<HostImage> {
        self.transposed(conv, prepared, f, Some(skip))
    }

    /// [`Self::conv_transposed`], added onto `skip` where given.
    fn transposed<B: Backend>(
        &self,
        conv: &ConvTranspose2d<B>,
        prepared: &PreparedWeights,
        f: impl Fn(f32) -> f32 + Sync,
        skip: Option<HostImage>,
    ) -> Option<HostImage> {
        if conv.dilation != [1, 1] || conv.groups != 1 || conv.padding_out != [0, 0] {
            return None;
        }
        let [batch, height, width, _] = self.shape;
        let window = Window {
            kernel: conv.kernel_size,
            stride: conv.stride,
            padding: conv.padding,
        };
        let [out_height, out_width] = window.transposed_output([height, width]);
        let windows: Vec<_> = (0..window.stride[0] * window.stride[1])
            .map(|phase| {
                let phase = (phase / window.stride[1], phase % window.stride[1]);
                Windows::transposed_phase(&self.values, self.shape, &window, phase)
            })
            .collect();
        let every: Vec<&Windows> = windows.iter().map(|(windows, _)| windows).collect();
        let padded = self.in_place(prepared, &every);
        let winograd_phases = Phase::of_transposed(&window, [height, width]);
        if let Some(phases) =
            winograd_phases.filter(|_| padded.is_none() && self.wide_enough(conv.weight.dims()[1]))
        {
            let kernels = prepared.transposed_conv_winograd(conv, &phases);
            let jobs: Vec<_> = (phases.iter())
                .map(|phase| (phase.correlation, phase.placement()))
                .collect();
            let mut out = self.winograd(&F2X2, &jobs, &kernels, [out_height, out_width], f);
            if let Some(skip) = &skip {
                out.add(skip);
            }
            return Some(out);
        }
        let phases = prepared.transposed_conv_phases(conv);
        let outputs = phases[0].columns();
        let shape = [batch, out_height, out_width, outputs];
        let add_onto = skip.is_some();
        let mut values = match skip {
            Some(skip) => {
                assert_eq!(
                    skip.shape, shape,
                    "HostImage::conv_transposed_onto: skip's shape"
                );
                skip.values
            }
            None => vec![0f32; batch * out_height * out_width * outputs],
        };
        for (weight, (windows, pixels)) in phases.iter().zip(&windows) {
            if !pixels.is_empty() {
                let read = (padded.as_ref(), add_onto);
                product_windows_into_rows(&mut values, pixels, windows, weight, read, &f);
            }
        }
        Some(HostImage { values, shape })
    }

    /// This image rounded to bf16 once with a zero border, for products in bf16 on AMX that read
    /// all of `windows` in place ([`PaddedImage::for_windows`]); `None` elsewhere. Where it
    /// serves, a convolution goes that way rather than through Winograd's minimal filtering:
    /// in bf16 on AMX, its transforms and small products cost more than the multiplications it
    /// saves (mirage's U-Net frame 65.2–67.8 ms with Winograd, 52.3–56.3 ms without, on a
    /// Sapphire Rapids VM: docs/PERFORMANCE.md).
    fn in_place(&self, prepared: &PreparedWeights, windows: &[&Windows]) -> Option<PaddedImage> {
        match prepared.products() {
            Products::Bf16 => PaddedImage::for_windows(windows),
            Products::F32 => None,
        }
    }

    /// Whether a convolution of this image to `outputs` channels has the channels for Winograd's
    /// minimal filtering to pay ([`WINOGRAD_CHANNELS`]).
    fn wide_enough(&self, outputs: usize) -> bool {
        self.shape[3] >= WINOGRAD_CHANNELS && outputs >= WINOGRAD_CHANNELS
    }

    /// `f(correlation of self + bias)` by `minimal` for each of `jobs` with its kernel, each put
    /// where its placement says in an image of `size` ([`Minimal::correlate`]), the products on
    /// one thread each.
    fn winograd(
        &self,
        minimal: &Minimal,
        jobs: &[(Correlation, Placement)],
        kernels: &[WinogradKernel],
        size: [usize; 2],
        f: impl Fn(f32) -> f32 + Sync,
    ) -> HostImage {
        let [batch, _, _, channels] = self.shape;
        let bias = &kernels[0].bias;
        let multiply = |job: usize, xi: usize, v: &[f32]| {
            product_on_this_thread(v, channels, &kernels[job].points[xi])
        };
        let values = minimal.correlate(&self.values, self.shape, jobs, size, bias, multiply, f);
        HostImage {
            values,
            shape: [batch, size[0], size[1], bias.len()],
        }
    }

    /// `f(group_norm(self))` in place, or `None` where the norm's weights are not f32 host values.
    pub fn group_norm<B: Backend>(
        &mut self,
        norm: &GroupNorm<B>,
        f: impl Fn(f32) -> f32 + Sync,
    ) -> Option<()> {
        let [batch, height, width, channels] = self.shape;
        let read = |param: Option<&Param<Tensor<B, 1>>>, default: f32| {
            param.map_or(Some(vec![default; channels]), |p| {
                p.val().into_data().to_vec::<f32>().ok()
            })
        };
        let gamma = read(norm.gamma.as_ref(), 1.0)?;
        let beta = read(norm.beta.as_ref(), 0.0)?;
        host::group_norm_nhwc(
            &mut self.values,
            [batch, height * width, channels],
            norm.num_groups,
            &gamma,
            &beta,
            norm.epsilon,
            f,
        );
        Some(())
    }

    /// The channels of `self` then of `other` (same batch and size) side by side.
    pub fn concat_channels(&self, other: &HostImage) -> HostImage {
        let [batch, height, width, a] = self.shape;
        assert_eq!(
            [batch, height, width],
            other.shape[..3],
            "concat_channels: sizes"
        );
        let b = other.shape[3];
        if a == 0 || b == 0 {
            return if a == 0 { other.clone() } else { self.clone() };
        }
        let pixels = height * width;
        let mut values = vec![0f32; batch * pixels * (a + b)];
        (values.par_chunks_mut((pixels * (a + b)).max(1)))
            .zip(self.values.par_chunks((pixels * a).max(1)))
            .zip(other.values.par_chunks((pixels * b).max(1)))
            .for_each(|((out, left), right)| {
                for ((out, left), right) in (out.chunks_exact_mut(a + b))
                    .zip(left.chunks_exact(a))
                    .zip(right.chunks_exact(b))
                {
                    out[..a].copy_from_slice(left);
                    out[a..].copy_from_slice(right);
                }
            });
        HostImage {
            values,
            shape: [batch, height, width, a + b],
        }
    }

    /// Each image's mean over its pixels, `[batch, channels]` row-major.
    pub fn mean_pixels(&self) -> Vec<f32> {
        let [batch, height, width, channels] = self.shape;
        let pixels = height * width;
        let mut means = vec![0f32; batch * channels];
        for (b, image) in self.values.chunks_exact(pixels * channels).enumerate() {
            let mut sums = vec![0f64; channels];
            for pixel in image.chunks_exact(channels) {
                sums.iter_mut()
                    .zip(pixel)
                    .for_each(|(s, &v)| *s += v as f64);
            }
            for (m, s) in means[b * channels..][..channels].iter_mut().zip(sums) {
                *m = (s / pixels as f64) as f32;
            }
        }
        means
    }

    /// PyTorch's `adaptive_avg_pool2d` to `[height, width]`: output cell `i` averages input rows
    /// `⌊i·H/h⌋ .. ⌈(i+1)·H/h⌉` (and columns likewise).
    pub fn adaptive_avg_pool(&self, [out_height, out_width]: [usize; 2]) -> HostImage {
        let [batch, height, width, channels] = self.shape;
        let span =
            |i: usize, size: usize, out: usize| (i * size / out, ((i + 1) * size).div_ceil(out));
        let mut values = vec![0f32; batch * out_height * out_width * channels];
        let line = (out_width * channels).max(1);
        (values.par_chunks_mut(line).enumerate()).for_each(|(line, values)| {
            let (b, oy) = (line / out_height, line % out_height);
            let (y0, y1) = span(oy, height, out_height);
            for (ox, out) in values.chunks_exact_mut(channels.max(1)).enumerate() {
                let (x0, x1) = span(ox, width, out_width);
                for y in y0..y1 {
                    for x in x0..x1 {
                        let from = ((b * height + y) * width + x) * channels;
                        out.iter_mut()
                            .zip(&self.values[from..from + channels])
                            .for_each(|(o, &v)| *o += v);
                    }
                }
                let count = ((y1 - y0) * (x1 - x0)) as f32;
                out.iter_mut().for_each(|o| *o /= count);
            }
        });
        HostImage {
            values,
            shape: [batch, out_height, out_width, channels],
        }
    }

    /// Bilinear resizing to `[height, width]` with PyTorch's `align_corners=False`: output pixel
    /// `o` reads the input at `(o + ½) · in/out − ½`, clamped at 0.
    pub fn resize_bilinear(&self, [out_height, out_width]: [usize; 2]) -> HostImage {
        let [batch, height, width, channels] = self.shape;
        let taps = |out: usize, size: usize| -> Vec<(usize, usize, f32)> {
            let scale = size as f32 / out as f32;
            (0..out)
                .map(|o| {
                    let source = ((o as f32 + 0.5) * scale - 0.5).max(0.0);
                    let first = (source as usize).min(size - 1);
                    let second = (first + 1).min(size - 1);
                    (first, second, source - first as f32)
                })
                .collect()
        };
        let (rows, columns) = (taps(out_height, height), taps(out_width, width));
        let mut values = vec![0f32; batch * out_height * out_width * channels];
        let at = |b: usize, y: usize, x: usize| ((b * height + y) * width + x) * channels;
        let line = (out_width * channels).max(1);
        (values.par_chunks_mut(line).enumerate()).for_each(|(line, values)| {
            let (b, (y0, y1, ly)) = (line / out_height, rows[line % out_height]);
            for (out, &(x0, x1, lx)) in values.chunks_exact_mut(channels.max(1)).zip(&columns) {
                let [a, c, d, e] = [at(b, y0, x0), at(b, y0, x1), at(b, y1, x0), at(b, y1, x1)];
                for (k, o) in out.iter_mut().enumerate() {
                    let v = &self.values;
                    let top = v[a + k] * (1.0 - lx) + v[c + k] * lx;
                    let bottom = v[d + k] * (1.0 - lx) + v[e + k] * lx;
                    *o = top * (1.0 - ly) + bottom * ly;
                }
            }
        });
        HostImage {
            values,
            shape: [batch, out_height, out_width, channels],
        }
    }

    /// `self += other`, element by element (a skip connection).
    pub fn add(&mut self, other: &HostImage) {
        self.combine(other, |a, b| a + b);
    }

    /// `self = f(self, other)`, element by element.
    pub fn combine(&mut self, other: &HostImage, f: impl Fn(f32, f32) -> f32) {
        assert_eq!(self.shape, other.shape, "HostImage::combine: shapes");
        self.values
            .iter_mut()
            .zip(&other.values)
            .for_each(|(a, &b)| *a = f(*a, b));
    }

    /// `self += v[b]` at every pixel of image `b`, for `v` `[batch, channels]` row-major (an
    /// embedding added everywhere).
    pub fn add_per_image(&mut self, v: &[f32]) {
        let [batch, height, width, channels] = self.shape;
        assert_eq!(v.len(), batch * channels, "HostImage::add_per_image: shape");
        (self
            .values
            .par_chunks_mut((height * width * channels).max(1)))
        .zip(v.par_chunks(channels.max(1)))
        .for_each(|(image, v)| {
            for pixel in image.chunks_exact_mut(channels.max(1)) {
                pixel.iter_mut().zip(v).for_each(|(a, b)| *a += b);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::nn::conv::{Conv2dConfig, ConvTranspose2dConfig};
    use burn::tensor::Distribution;
    use kiln_kernels::gemm::Bf16Isa;

    use super::*;

    /// Under bf16 products on AMX, convolutions whose windows a padded bf16 image serves (32
    /// channels, output rows of 16 pixels) read it in place rather than going through Winograd:
    /// a stride-1 and a stride-2 3 × 3 convolution and a 4 × 4 / 2 transposed one (its four
    /// phases put back in place) give what the f32 path gives, within the bf16 rounding of
    /// their operands (2⁻⁸ of the sum of the products' magnitudes, bounded here by the values').
    #[test]
    fn bf16_convolutions_read_in_place_are_the_f32_ones() {
        if Bf16Isa::chosen() != Some(Bf16Isa::Amx) {
            println!("SKIPPED (no amx_bf16)");
            return;
        }
        let device = Default::default();
        let x = Tensor::<Flex, 4>::random([2, 32, 16, 32], Distribution::Normal(0.0, 1.0), &device);
        let image = HostImage::from_nchw(x);
        let f32s = PreparedWeights::default();
        let bf16s = PreparedWeights::default().for_products(Products::Bf16);
        // The bound: 2⁻⁸ Σ|ab| ≤ 2⁻⁸ · depth · max|a| · max|b|, with an allowance for f32 sums.
        let close = |got: &HostImage, want: &HostImage, depth: usize, weight: f32, what: &str| {
            assert_eq!(got.shape, want.shape, "{what}");
            let largest = image.values.iter().fold(0f32, |m, v| m.max(v.abs()));
            let bound = 2.0 * depth as f32 * largest * weight / 256.0;
            let worst = (got.values.iter().zip(&want.values))
                .map(|(g, w)| (g - w).abs())
                .fold(0f32, f32::max);
            assert!(worst <= bound, "{what}: {worst} against {bound}");
            assert!(worst > 0.0, "{what}: bf16 products ran in f32");
        };
        let largest =
            |weight: &Tensor<Flex, 4>| -> f32 { weight.clone().abs().max().into_scalar() };
        for stride in [1, 2] {
            let conv = Conv2dConfig::new([32, 48], [3, 3])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init::<Flex>(&device);
            let windows = Windows::new(
                &image.values,
                image.shape,
                Window {
                    kernel: [3, 3],
                    stride: [stride, stride],
                    padding: [1, 1],
                },
            );
            assert!(PaddedImage::for_windows(&[&windows]).is_some());
            let got = image.conv(&conv, &bf16s, |v| v).unwrap();
            let want = image.conv(&conv, &f32s, |v| v).unwrap();
            close(&got, &want, 9 * 32, largest(&conv.weight.val()), "conv");
        }
        let up = ConvTranspose2dConfig::new([32, 40], [4, 4])
            .with_stride([2, 2])
            .with_padding([1, 1])
            .init::<Flex>(&device);
        let got = image.conv_transposed(&up, &bf16s, |v| v).unwrap();
        let want = image.conv_transposed(&up, &f32s, |v| v).unwrap();
        close(
            &got,
            &want,
            4 * 32,
            largest(&up.weight.val()),
            "transposed conv",
        );
    }

    /// A transposed convolution added onto a skip connection as it is stored is the convolution,
    /// then the sum, bit for bit: in place in bf16 where AMX runs, and through Winograd's
    /// minimal filtering in f32 (where the sum is its own pass).
    #[test]
    fn transposed_convolutions_onto_a_skip_are_the_convolution_then_the_sum() {
        let device = Default::default();
        let x = Tensor::<Flex, 4>::random([2, 32, 8, 16], Distribution::Normal(0.0, 1.0), &device);
        let image = HostImage::from_nchw(x);
        let up = ConvTranspose2dConfig::new([32, 40], [4, 4])
            .with_stride([2, 2])
            .with_padding([1, 1])
            .init::<Flex>(&device);
        let skip =
            Tensor::<Flex, 4>::random([2, 40, 16, 32], Distribution::Normal(0.0, 1.0), &device);
        let skip = HostImage::from_nchw(skip);
        let mut products = vec![Products::F32];
        match Bf16Isa::chosen() {
            Some(Bf16Isa::Amx) => products.push(Products::Bf16),
            _ => println!("SKIPPED (no amx_bf16): the bf16 products"),
        }
        for products in products {
            let prepared = PreparedWeights::default().for_products(products);
            let mut want = image.conv_transposed(&up, &prepared, f32::tanh).unwrap();
            want.add(&skip);
            let got =
                (image.conv_transposed_onto(&up, &prepared, f32::tanh, skip.clone())).unwrap();
            assert_eq!(got, want, "{products:?}");
        }
    }
}
