//! The benchmarked U-Net of mirage-hello: `SimpleOptimizedUNet` (examples/advanced/day2_fixed.py
//! at 04a704d), the model behind its FPS figures. Field names mirror its state dict.
//!
//! `x` `[batch, 4, H, W]` (RGB and a plane holding the timestep ÷ 100) → conv 3×3 → SiLU
//! (`skip₁`) → stride-2 conv → SiLU (`skip₂`) → stride-2 conv → SiLU → conv 3×3 to 8 × base
//! channels → SiLU → self-attention over the `H/4 · W/4` positions (heads of 64) → transposed
//! conv 4×4 / 2 → SiLU, `+ skip₂` → transposed conv → SiLU, `+ skip₁` → conv 3×3 → tanh:
//! `[batch, 3, H, W]`. The bottleneck has no residual around its attention, as in the system.

use std::path::Path;

use burn::module::Module;
use burn::nn::PaddingConfig2d;
use burn::nn::conv::{Conv2d, Conv2dConfig, ConvTranspose2d, ConvTranspose2dConfig};
use burn::tensor::Tensor;
use burn::tensor::activation::{silu, tanh};
use burn::tensor::backend::Backend;
use kiln_core::{CheckpointError, Policy, on_host_pool};
use kiln_kernels::host;
use kiln_kernels::host::silu as silu_host;
use kiln_transformer::image::HostImage;
use kiln_transformer::{PACKED_ATTENTION_KEYS, PackedAttention, Pass};

use crate::FrameError;
use crate::runtime::{CheckpointShapes, FrameRuntime, check_frames};

/// `SimpleOptimizedUNet(in_channels, out_channels, base_channels)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UNetConfig {
    /// Input channels: RGB and the timestep plane.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Channels after the first convolution (a multiple of 8; the bottleneck has 8×).
    pub base_channels: usize,
}

/// The width of each attention head in the bottleneck (`attn_channels // 64` heads).
const HEAD_WIDTH: usize = 64;

impl UNetConfig {
    /// The U-Net with `base_channels` rounded up to a multiple of 8, as the system's constructor
    /// does (`((base + 7) // 8) * 8`).
    pub fn new(in_channels: usize, out_channels: usize, base_channels: usize) -> Self {
        UNetConfig {
            in_channels,
            out_channels,
            base_channels: base_channels.div_ceil(8) * 8,
        }
    }

    /// The model behind the system's FPS figures: `Day2Model(base_channels=96)` on RGB and a
    /// timestep plane (8.5 M parameters; the system's text calls it "30M params").
    pub fn mirage() -> Self {
        UNetConfig::new(4, 3, 96)
    }

    /// The U-Net whose state dict the checkpoint directory `dir` holds, its sizes read from
    /// the tensors' shapes (`conv_in.weight` `[base, in, 3, 3]`, `conv_out.weight` `[out, base,
    /// 3, 3]`), before any weight is read: the system's model at another width loads as it is.
    pub fn from_checkpoint(dir: &Path) -> Result<Self, CheckpointError> {
        let shapes = CheckpointShapes::read(dir)?;
        let model = "SimpleOptimizedUNet";
        let [base_channels, in_channels, _, _] = shapes.dims::<4>("conv_in.weight", model)?;
        let [out_channels, _, _, _] = shapes.dims::<4>("conv_out.weight", model)?;
        Ok(UNetConfig {
            in_channels,
            out_channels,
            base_channels,
        })
    }

    /// Attention heads in the bottleneck.
    pub fn heads(&self) -> usize {
        (self.base_channels * 8 / HEAD_WIDTH).max(1)
    }

    /// A U-Net with PyTorch's default initialisation shapes (burn's initialisers), to load a
    /// state dict into or to time.
    pub fn init<B: Backend>(&self, device: &B::Device) -> UNet<B> {
        let base = self.base_channels;
        let conv = |from: usize, to: usize, stride: usize| {
            Conv2dConfig::new([from, to], [3, 3])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device)
        };
        let up = |from: usize, to: usize| {
            ConvTranspose2dConfig::new([from, to], [4, 4])
                .with_stride([2, 2])
                .with_padding([1, 1])
                .init(device)
        };
        UNet {
            conv_in: conv(self.in_channels, base, 1),
            enc1: conv(base, 2 * base, 2),
            enc2: conv(2 * base, 4 * base, 2),
            bottleneck_conv: conv(4 * base, 8 * base, 1),
            attention: PackedAttention::init(8 * base, self.heads(), device),
            dec2: up(8 * base, 2 * base),
            dec1: up(2 * base, base),
            conv_out: conv(base, self.out_channels, 1),
            runtime: FrameRuntime::default(),
        }
    }
}

/// mirage-hello's `SimpleOptimizedUNet`.
#[derive(Module, Debug)]
pub struct UNet<B: Backend> {
    /// Input → base channels.
    pub conv_in: Conv2d<B>,
    /// Base → 2 × base, stride 2.
    pub enc1: Conv2d<B>,
    /// 2 × base → 4 × base, stride 2.
    pub enc2: Conv2d<B>,
    /// 4 × base → 8 × base at the bottleneck's resolution.
    pub bottleneck_conv: Conv2d<B>,
    /// Self-attention over the bottleneck's positions (`nn.MultiheadAttention`).
    pub attention: PackedAttention<B>,
    /// 8 × base → 2 × base, ×2 resolution.
    pub dec2: ConvTranspose2d<B>,
    /// 2 × base → base, ×2 resolution.
    pub dec1: ConvTranspose2d<B>,
    /// Base → output channels.
    pub conv_out: Conv2d<B>,
    #[module(skip)]
    runtime: FrameRuntime,
}

impl<B: Backend> UNet<B> {
    /// The U-Net with the weights of the checkpoint directory `dir` (`model.safetensors` holding
    /// the system's `SimpleOptimizedUNet.state_dict()`); a tensor missing or of another shape is
    /// an error naming each.
    pub fn with_weights(self, dir: &Path) -> Result<Self, CheckpointError> {
        let runtime = self.runtime.clone();
        let mut loaded = kiln_core::load_checkpoint(self, dir, &[PACKED_ATTENTION_KEYS], &[])?;
        loaded.runtime = runtime;
        Ok(loaded)
    }

    /// The U-Net under `policy`: its parameters converted once to the compute dtype (the
    /// system's `model.to(dtype=torch.float16)`: no per-call casts of the weights); a bf16
    /// policy on a host backend keeps them f32 for bf16 products ([`FrameRuntime::with_policy`]).
    pub fn with_policy(self, policy: Policy) -> Self {
        let (mut model, runtime) = FrameRuntime::with_policy(self, policy);
        model.runtime = runtime;
        model
    }

    /// The channels this U-Net reads: RGB and the timestep plane.
    pub fn input_channels(&self) -> usize {
        self.conv_in.weight.dims()[1]
    }

    /// The U-Net's output for `x` `[batch, in_channels, H, W]` (H and W multiples of 4).
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        if self.runtime.on_host(&x)
            && let Some(out) = on_host_pool::<B, _>(&x.device(), || {
                self.forward_on_host(x.clone(), &self.runtime.pass())
            })
        {
            return out;
        }
        let pass = self.runtime.pass();
        let x = silu(self.conv_in.forward(pass.input(x)));
        let skip1 = x.clone();
        let x = silu(self.enc1.forward(x));
        let skip2 = x.clone();
        let x = silu(self.enc2.forward(x));
        let x = silu(self.bottleneck_conv.forward(x));
        let [batch, channels, height, width] = x.dims();
        let tokens = x.reshape([batch, channels, height * width]).swap_dims(1, 2);
        let attended = self.attention.forward(tokens, &pass);
        let x = attended
            .swap_dims(1, 2)
            .reshape([batch, channels, height, width]);
        let x = silu(self.dec2.forward(x)) + skip2;
        let x = silu(self.dec1.forward(x)) + skip1;
        pass.output(tanh(self.conv_out.forward(x)))
    }

    /// [`Self::forward`] on the host: NHWC between the layers, every convolution one product
    /// with its activation fused, the skips summed as the decoder's products are stored; `None`
    /// where a layer is not served.
    fn forward_on_host(&self, x: Tensor<B, 4>, pass: &Pass) -> Option<Tensor<B, 4>> {
        let device = x.device();
        let prepared = self.runtime.prepared();
        let x = HostImage::from_nchw(x).conv(&self.conv_in, prepared, silu_host)?;
        let skip2 = x.conv(&self.enc1, prepared, silu_host)?;
        let bottom = skip2.conv(&self.enc2, prepared, silu_host)?;
        let bottom = bottom.conv(&self.bottleneck_conv, prepared, silu_host)?;
        let [_, height, width, _] = bottom.shape;
        let attended = self.attention.forward(bottom.into_tokens(&device), pass);
        let bottom = HostImage::from_tokens(attended, [height, width]);
        let up = bottom.conv_transposed_onto(&self.dec2, prepared, silu_host, skip2)?;
        let up = up.conv_transposed_onto(&self.dec1, prepared, silu_host, x)?;
        let out = up.conv(&self.conv_out, prepared, host::tanh)?;
        Some(out.into_nchw(&device))
    }

    /// One denoising step of `frames` `[batch, in_channels − 1, H, W]` (H and W multiples of 4)
    /// at `timestep`, as the system's `Day2Model.forward` makes it: the frames with a plane of
    /// `timestep / 100` appended.
    pub fn denoise(&self, frames: Tensor<B, 4>, timestep: f32) -> Result<Tensor<B, 4>, FrameError> {
        check_frames("U-Net", &frames, self.input_channels() - 1, None)?;
        let [batch, _, height, width] = frames.dims();
        // In the frames' dtype: a half policy's output frames come back as the next input.
        let plane = Tensor::<B, 4>::full(
            [batch, 1, height, width],
            timestep / 100.0,
            &frames.device(),
        )
        .cast(frames.dtype());
        Ok(self.forward(Tensor::cat(vec![frames, plane], 1)))
    }

    /// One output frame of `frames` from a denoising forward at each of `timesteps`, in order,
    /// the forwards reading what `frame_loop` says. [`FrameLoop::Mirage`] is the system's
    /// benchmark: every forward reads the incoming frames, so the output is the last forward's.
    pub fn frame(
        &self,
        frames: Tensor<B, 4>,
        timesteps: &[f32],
        frame_loop: FrameLoop,
    ) -> Result<Tensor<B, 4>, FrameError> {
        let mut out = None;
        for &timestep in timesteps {
            let read = match (frame_loop, out) {
                (FrameLoop::Chain, Some(previous)) => previous,
                _ => frames.clone(),
            };
            out = Some(self.denoise(read, timestep)?);
        }
        out.ok_or(FrameError::NoSteps)
    }
}

/// What each of a frame's denoising forwards reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrameLoop {
    /// The incoming frame, every time (mirage-hello's `comprehensive_day2_benchmark`:
    /// `Day2Model.forward` ignores the previous output it is given): the frame's output is the
    /// last forward's, at the last timestep, on the raw input.
    #[default]
    Mirage,
    /// The previous forward's output (the first reads the incoming frame): kiln's chained
    /// variant, the same cost, other frames.
    Chain,
}

impl FrameLoop {
    /// `mirage` or `chain`.
    pub fn name(self) -> &'static str {
        match self {
            FrameLoop::Mirage => "mirage",
            FrameLoop::Chain => "chain",
        }
    }
}
