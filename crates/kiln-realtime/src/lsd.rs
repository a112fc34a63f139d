//! mirage-hello's lightweight live-stream diffusion model: `LiveStreamDiffusionModel`
//! (examples/basic/simplified_lsd.py at 04a704d). Field names mirror its state dict; the
//! numbered `nn.Sequential` entries get names ([`STATE_DICT_NAMES`]).
//!
//! Each frame, with the previous output `p` (the frame itself for a stream's first):
//! 1. the diffusion block: `h = enc([frame, p])` (conv 3×3 → GroupNorm(8) → SiLU → stride-2 conv
//!    → GroupNorm → SiLU), plus an MLP of the timestep's sinusoidal embedding, then `g = dec(h)`
//!    (transposed conv 4×4 / 2 → GroupNorm → SiLU → conv 3×3);
//! 2. the memory bank: `g` is written into the next of its `M` slots (a ring), the slots are
//!    weighted by the softmax of their pooled features against `g`'s pooled query, and the
//!    weighted frame's features are decoded into a correction: `c = g + 0.1 · correction`;
//! 3. the blend (from the second frame): `w = σ(net([c, p]))` `[1 channel]`,
//!    `out = w · c + (1 − w) · p`.
//!
//! The bank starts as the state dict holds it, the next write at its `memory_ptr`: the system's
//! demo warms up in training mode, which writes the warm-up frame into slot 0 and moves
//! `memory_ptr` to 1, then streams in eval mode, where the bank no longer changes.
//!
//! What differs from the system's code, on purpose:
//! - its bank records frames only in training mode (`if self.training`); kiln records every
//!   frame (the diffusion block's output `g`, before the correction, as the system's training
//!   mode writes it), as the system's design describes (the fixtures run the reference in
//!   training mode, which changes nothing else: no dropout, and GroupNorm keeps no running
//!   statistics);
//! - its bank is one buffer shared by the batch and its query works for a batch of one; kiln
//!   keeps one bank per stream ([`Stream`]), so `B` independent streams run as one batch;
//! - each slot's pooled features are kept with the slot instead of recomputed for all `M`
//!   slots every frame (the same numbers: a slot's features depend on its frame alone);
//! - the timestep is the caller's (the block draws a random one from 0 … 19 when given none).

use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig, ConvTranspose2d, ConvTranspose2dConfig};
use burn::nn::{GroupNorm, GroupNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::{relu, sigmoid, silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::module::{adaptive_avg_pool2d, interpolate};
use burn::tensor::ops::{InterpolateMode, InterpolateOptions};
use burn::tensor::{DType, Tensor, TensorData};
use kiln_core::{CheckpointError, Policy, Precision, cast, cast_module, on_host_pool};
use kiln_kernels::host;
use kiln_kernels::host::conv::{nchw_to_nhwc, nhwc_to_nchw};
use kiln_transformer::PreparedWeights;
use kiln_transformer::image::HostImage;
use rayon::prelude::*;

use crate::FrameError;
use crate::runtime::{CheckpointShapes, FrameRuntime, check_frames};

/// `LiveStreamDiffusionModel(input_channels, hidden_dim, context_length, height, width)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LsdConfig {
    /// Frame channels.
    pub input_channels: usize,
    /// Channels of the block's features (its first convolution has half) and of the time
    /// embedding.
    pub hidden_dim: usize,
    /// Frames the memory bank holds.
    pub context_length: usize,
    /// Frame height (the bank's and the correction's).
    pub height: usize,
    /// Frame width.
    pub width: usize,
}

/// Groups of every GroupNorm (`nn.GroupNorm(8, ·)`).
const GROUPS: usize = 8;
/// Channels of the memory bank's features.
const MEMORY_FEATURES: usize = 32;
/// The side the memory features are pooled to (`nn.AdaptiveAvgPool2d(8)`).
const MEMORY_GRID: usize = 8;
/// Weight of the memory correction (`generated + 0.1 * memory_correction`).
const MEMORY_WEIGHT: f32 = 0.1;

impl LsdConfig {
    /// The model at the given sizes.
    pub fn new(
        input_channels: usize,
        hidden_dim: usize,
        context_length: usize,
        height: usize,
        width: usize,
    ) -> Self {
        LsdConfig {
            input_channels,
            hidden_dim,
            context_length,
            height,
            width,
        }
    }

    /// The system's demonstration model: 3 channels, width 128, an 8-frame bank, 64 × 64.
    pub fn mirage() -> Self {
        LsdConfig::new(3, 128, 8, 64, 64)
    }

    /// The model whose state dict the checkpoint directory `dir` holds, its sizes read from
    /// the tensors' shapes (the bank `context_memory.frame_memory` `[M, channels, height,
    /// width]`, the time embedding's `[hidden, hidden]`), before any weight is read.
    pub fn from_checkpoint(dir: &Path) -> Result<Self, CheckpointError> {
        let shapes = CheckpointShapes::read(dir)?;
        let model = "LiveStreamDiffusionModel";
        let [context_length, input_channels, height, width] =
            shapes.dims::<4>("context_memory.frame_memory", model)?;
        let [hidden_dim, _] = shapes.dims::<2>("diffusion_block.time_embed.0.weight", model)?;
        Ok(LsdConfig::new(
            input_channels,
            hidden_dim,
            context_length,
            height,
            width,
        ))
    }

    /// Refuses sizes the model cannot be built or run with, naming the first: a frame side
    /// that is odd (the diffusion block halves the frame with a stride-2 convolution and
    /// doubles it back, which an odd side does not survive) or 0, no channels, no bank, or
    /// block widths the GroupNorms of 8 groups cannot split (`hidden_dim` a multiple of 16).
    ///
    /// ```
    /// use kiln_realtime::LsdConfig;
    /// assert!(LsdConfig::mirage().validate().is_ok());
    /// let err = LsdConfig { height: 65, ..LsdConfig::mirage() }.validate().unwrap_err();
    /// assert_eq!(err.to_string(), "the live-stream model: height = 65: a positive even number");
    /// ```
    pub fn validate(&self) -> Result<(), FrameError> {
        let even = |side: usize| side > 0 && side.is_multiple_of(2);
        let checks = [
            (
                "height",
                self.height,
                even(self.height),
                "a positive even number",
            ),
            (
                "width",
                self.width,
                even(self.width),
                "a positive even number",
            ),
            (
                "input_channels",
                self.input_channels,
                self.input_channels > 0,
                "at least 1",
            ),
            (
                "context_length",
                self.context_length,
                self.context_length > 0,
                "at least 1",
            ),
            (
                "hidden_dim",
                self.hidden_dim,
                self.hidden_dim > 0 && self.hidden_dim.is_multiple_of(2 * GROUPS),
                "a positive multiple of 16",
            ),
        ];
        match checks.into_iter().find(|check| !check.2) {
            Some((setting, value, _, needs)) => Err(FrameError::Config {
                model: "live-stream model",
                setting,
                value,
                needs,
            }),
            None => Ok(()),
        }
    }

    /// A model with burn's initialisers at these sizes, its bank empty, to load a state dict
    /// into or to time ([`LsdConfig::validate`] first: sizes it refuses fail later).
    pub fn init<B: Backend>(&self, device: &B::Device) -> LiveStreamDiffusion<B> {
        let (c, hidden) = (self.input_channels, self.hidden_dim);
        let conv = |from: usize, to: usize, kernel: usize, stride: usize| {
            let pad = kernel / 2;
            Conv2dConfig::new([from, to], [kernel, kernel])
                .with_stride([stride, stride])
                .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
                .init(device)
        };
        let norm = |channels: usize| GroupNormConfig::new(GROUPS, channels).init(device);
        let diffusion_block = DiffusionBlock {
            conv_in: conv(2 * c, hidden / 2, 3, 1),
            norm_in: norm(hidden / 2),
            down: conv(hidden / 2, hidden, 3, 2),
            norm_down: norm(hidden),
            up: ConvTranspose2dConfig::new([hidden, hidden / 2], [4, 4])
                .with_stride([2, 2])
                .with_padding([1, 1])
                .init(device),
            norm_up: norm(hidden / 2),
            conv_out: conv(hidden / 2, c, 3, 1),
            time_in: LinearConfig::new(hidden, hidden).init(device),
            time_out: LinearConfig::new(hidden, hidden).init(device),
        };
        let bank = [self.context_length, c, self.height, self.width];
        let context_memory = ContextMemoryBank {
            frame_memory: Param::from_tensor(Tensor::zeros(bank, device)).set_require_grad(false),
            feature_in: conv(c, MEMORY_FEATURES, 3, 1),
            feature_down: conv(MEMORY_FEATURES, 2 * MEMORY_FEATURES, 3, 2),
            feature_out: conv(2 * MEMORY_FEATURES, MEMORY_FEATURES, 3, 1),
            memory_query: conv(c, MEMORY_FEATURES, 1, 1),
            out_conv: conv(MEMORY_FEATURES, MEMORY_FEATURES / 2, 3, 1),
            out_proj: conv(MEMORY_FEATURES / 2, c, 1, 1),
        };
        let consistency_net = ConsistencyNet {
            input: conv(2 * c, 32, 3, 1),
            hidden: conv(32, 16, 3, 1),
            output: conv(16, 1, 3, 1),
        };
        LiveStreamDiffusion {
            diffusion_block,
            context_memory,
            consistency_net,
            first_slot: 0,
            runtime: FrameRuntime::default(),
        }
    }
}

/// The system's `SimplifiedDiffusionBlock`: the frame and the previous output in, a frame out.
#[derive(Module, Debug)]
pub struct DiffusionBlock<B: Backend> {
    /// `encoder.0`: `[frame, previous]` → hidden / 2.
    pub conv_in: Conv2d<B>,
    /// `encoder.1`.
    pub norm_in: GroupNorm<B>,
    /// `encoder.3`: hidden / 2 → hidden, stride 2.
    pub down: Conv2d<B>,
    /// `encoder.4`.
    pub norm_down: GroupNorm<B>,
    /// `decoder.0`: hidden → hidden / 2, ×2 resolution.
    pub up: ConvTranspose2d<B>,
    /// `decoder.1`.
    pub norm_up: GroupNorm<B>,
    /// `decoder.3`: hidden / 2 → frame channels.
    pub conv_out: Conv2d<B>,
    /// `time_embed.0`.
    pub time_in: Linear<B>,
    /// `time_embed.2`.
    pub time_out: Linear<B>,
}

/// The system's `ContextMemoryBank`: its stored frames (a stream's starting bank) and the
/// networks that weigh and decode them.
#[derive(Module, Debug)]
pub struct ContextMemoryBank<B: Backend> {
    /// The bank the state dict holds `[M, channels, height, width]`: every stream starts from it.
    pub frame_memory: Param<Tensor<B, 4>>,
    /// `feature_net.0`.
    pub feature_in: Conv2d<B>,
    /// `feature_net.2` (stride 2).
    pub feature_down: Conv2d<B>,
    /// `feature_net.5` (after the pooling to 8 × 8).
    pub feature_out: Conv2d<B>,
    /// The frame's query features (1 × 1).
    pub memory_query: Conv2d<B>,
    /// `memory_out.0`.
    pub out_conv: Conv2d<B>,
    /// `memory_out.3` (1 × 1, after the bilinear upsampling to the frame size).
    pub out_proj: Conv2d<B>,
}

/// The system's `consistency_net`: the blend weight of the corrected frame against the previous
/// output.
#[derive(Module, Debug)]
pub struct ConsistencyNet<B: Backend> {
    /// `consistency_net.0`.
    pub input: Conv2d<B>,
    /// `consistency_net.2`.
    pub hidden: Conv2d<B>,
    /// `consistency_net.4`.
    pub output: Conv2d<B>,
}

/// mirage-hello's `LiveStreamDiffusionModel`.
#[derive(Module, Debug)]
pub struct LiveStreamDiffusion<B: Backend> {
    /// The conditioned denoiser.
    pub diffusion_block: DiffusionBlock<B>,
    /// The memory bank.
    pub context_memory: ContextMemoryBank<B>,
    /// The temporal blend.
    pub consistency_net: ConsistencyNet<B>,
    /// The bank's slot a new stream writes first (the state dict's `memory_ptr`).
    #[module(skip)]
    first_slot: usize,
    #[module(skip)]
    runtime: FrameRuntime,
}

/// The system's numbered `nn.Sequential` entries → this module's names.
pub const STATE_DICT_NAMES: &[(&str, &str)] = &[
    (
        r"^diffusion_block\.encoder\.0\.",
        "diffusion_block.conv_in.",
    ),
    (
        r"^diffusion_block\.encoder\.1\.",
        "diffusion_block.norm_in.",
    ),
    (r"^diffusion_block\.encoder\.3\.", "diffusion_block.down."),
    (
        r"^diffusion_block\.encoder\.4\.",
        "diffusion_block.norm_down.",
    ),
    (r"^diffusion_block\.decoder\.0\.", "diffusion_block.up."),
    (
        r"^diffusion_block\.decoder\.1\.",
        "diffusion_block.norm_up.",
    ),
    (
        r"^diffusion_block\.decoder\.3\.",
        "diffusion_block.conv_out.",
    ),
    (
        r"^diffusion_block\.time_embed\.0\.",
        "diffusion_block.time_in.",
    ),
    (
        r"^diffusion_block\.time_embed\.2\.",
        "diffusion_block.time_out.",
    ),
    (
        r"^context_memory\.feature_net\.0\.",
        "context_memory.feature_in.",
    ),
    (
        r"^context_memory\.feature_net\.2\.",
        "context_memory.feature_down.",
    ),
    (
        r"^context_memory\.feature_net\.5\.",
        "context_memory.feature_out.",
    ),
    (
        r"^context_memory\.memory_out\.0\.",
        "context_memory.out_conv.",
    ),
    (
        r"^context_memory\.memory_out\.3\.",
        "context_memory.out_proj.",
    ),
    (r"^consistency_net\.0\.", "consistency_net.input."),
    (r"^consistency_net\.2\.", "consistency_net.hidden."),
    (r"^consistency_net\.4\.", "consistency_net.output."),
];

/// The state-dict entry of the bank's next write position (a one-element `int64`), read apart
/// from the parameters ([`LiveStreamDiffusion::with_weights`]).
const MEMORY_POSITION: &str = "context_memory.memory_ptr";

/// State-dict entries the parameters do not take: the block's noise schedule (its forward does
/// not use it) and the bank's write position (read on its own).
const UNUSED: &[&str] = &[
    "diffusion_block.betas",
    "diffusion_block.alphas",
    "diffusion_block.alphas_cumprod",
    MEMORY_POSITION,
];

/// One or more independent streams' state: each stream's memory bank, its slots' pooled
/// features, where the next frame is written, and its previous output.
#[derive(Debug, Clone)]
pub struct Stream<B: Backend> {
    memory: Memory<B>,
    next_slot: usize,
    previous: Option<Tensor<B, 4>>,
}

/// The streams' banks and their slots' pooled features, held where the path that last read them
/// reads them.
#[derive(Debug, Clone)]
enum Memory<B: Backend> {
    /// As tensors: the bank `[streams, M, channels, height, width]`, the features `[streams, M,
    /// 32]`.
    Tensors {
        bank: Tensor<B, 5>,
        keys: Tensor<B, 3>,
    },
    /// On the host: each slot's frame NHWC, `[streams, M, height, width, channels]` row-major,
    /// and the features `[streams, M, 32]`, for tensors on `device`.
    Host {
        bank: Vec<f32>,
        keys: Vec<f32>,
        shape: [usize; 5],
        device: B::Device,
    },
}

impl<B: Backend> Memory<B> {
    /// `[streams, M, channels, height, width]`.
    fn dims(&self) -> [usize; 5] {
        match self {
            Memory::Tensors { bank, .. } => bank.dims(),
            Memory::Host { shape, .. } => {
                let [streams, slots, height, width, channels] = *shape;
                [streams, slots, channels, height, width]
            }
        }
    }

    /// The bank and the features as tensors of `dtype` (converted, once, from the host's or
    /// from another dtype's: a stream may pass between models of different policies).
    fn tensors(&mut self, dtype: DType) -> (&mut Tensor<B, 5>, &mut Tensor<B, 3>) {
        if let Memory::Host {
            bank,
            keys,
            shape,
            device,
        } = self
        {
            let [streams, slots, height, width, channels] = *shape;
            let frames = [streams * slots, height, width, channels];
            let bank = TensorData::new(
                nhwc_to_nchw(bank, frames),
                [streams, slots, channels, height, width],
            );
            let keys = TensorData::new(std::mem::take(keys), [streams, slots, MEMORY_FEATURES]);
            *self = Memory::Tensors {
                bank: Tensor::from_data(bank, &*device),
                keys: Tensor::from_data(keys, &*device),
            };
        }
        match self {
            Memory::Tensors { bank, keys } => {
                if bank.dtype() != dtype {
                    *bank = bank.clone().cast(dtype);
                    *keys = keys.clone().cast(dtype);
                }
                (bank, keys)
            }
            Memory::Host { .. } => unreachable!("converted above"),
        }
    }

    /// The bank and the features on the host, with the bank's `[streams, M, height, width,
    /// channels]` (converted, once, from the tensors, in f32 whatever their dtype).
    fn host(&mut self) -> Option<(&mut [f32], &mut [f32], [usize; 5])> {
        if let Memory::Tensors { bank, keys } = self {
            let [streams, slots, channels, height, width] = bank.dims();
            let device = bank.device();
            let frames = [streams * slots, channels, height, width];
            let f32s = |data: TensorData| data.to_vec::<f32>().ok();
            let bank = nchw_to_nhwc(&f32s(bank.clone().cast(DType::F32).into_data())?, frames);
            let keys = f32s(keys.clone().cast(DType::F32).into_data())?;
            *self = Memory::Host {
                bank,
                keys,
                shape: [streams, slots, height, width, channels],
                device,
            };
        }
        match self {
            Memory::Host {
                bank, keys, shape, ..
            } => Some((bank, keys, *shape)),
            Memory::Tensors { .. } => unreachable!("converted above"),
        }
    }
}

impl<B: Backend> Stream<B> {
    /// The number of streams.
    pub fn streams(&self) -> usize {
        self.memory.dims()[0]
    }

    /// Each stream's last output `[streams, channels, height, width]` (none before the first
    /// frame).
    pub fn previous(&self) -> Option<&Tensor<B, 4>> {
        self.previous.as_ref()
    }
}

impl<B: Backend> LiveStreamDiffusion<B> {
    /// The model with the weights of the checkpoint directory `dir` (`model.safetensors`
    /// holding the system's `LiveStreamDiffusionModel.state_dict()`); a tensor missing or of
    /// another shape (another frame size or bank length among them) is an error naming each.
    /// The bank's frames and its write position `memory_ptr` come with them: a stream starts
    /// from the bank as the system saved it and writes next where the system would have.
    pub fn with_weights(self, dir: &Path) -> Result<Self, CheckpointError> {
        let runtime = self.runtime.clone();
        let slots = self.context_memory.frame_memory.dims()[0];
        let mut loaded = kiln_core::load_checkpoint(self, dir, STATE_DICT_NAMES, UNUSED)?;
        loaded.runtime = runtime;
        loaded.first_slot = memory_position(dir, slots)?;
        Ok(loaded)
    }

    /// The model's parameters converted once to `policy`'s compute dtype (the system's
    /// `model.to(dtype=torch.float16)`: no per-call casts), the group norms' kept in f32, where
    /// they normalise; a bf16 policy on a host backend keeps them f32 for bf16 products
    /// ([`FrameRuntime::with_policy`]).
    pub fn with_policy(self, policy: Policy) -> Self {
        let (mut model, runtime) = FrameRuntime::with_policy(self, policy);
        let block = &mut model.diffusion_block;
        for norm in [&mut block.norm_in, &mut block.norm_down, &mut block.norm_up] {
            *norm = cast_module(norm.clone(), Precision::F32);
        }
        model.runtime = runtime;
        model
    }

    /// `[channels, height, width]` of the frames this model reads.
    pub fn frame_shape(&self) -> [usize; 3] {
        let [_, channels, height, width] = self.context_memory.frame_memory.dims();
        [channels, height, width]
    }

    /// `streams` independent streams, each starting from the state dict's bank and writing
    /// first into its slot `memory_ptr` (0 for a model not loaded from a state dict).
    pub fn stream(&self, streams: usize) -> Stream<B> {
        let memory = self.context_memory.frame_memory.val();
        let keys = self.context_memory.keys(memory.clone(), &self.runtime);
        Stream {
            memory: Memory::Tensors {
                bank: memory.unsqueeze_dim::<5>(0).repeat_dim(0, streams),
                keys: keys.unsqueeze_dim::<3>(0).repeat_dim(0, streams),
            },
            next_slot: self.first_slot,
            previous: None,
        }
    }

    /// The next output of every stream of `stream` for its input `frames` `[streams, channels,
    /// height, width]`: the diffusion block once per timestep of `timesteps` (the system runs
    /// one, which it draws at random), each step conditioned on the previous step's frame (the
    /// first on the stream's previous output), then the memory correction and the blend.
    pub fn next_frame(
        &self,
        stream: &mut Stream<B>,
        frames: Tensor<B, 4>,
        timesteps: &[f32],
    ) -> Result<Tensor<B, 4>, FrameError> {
        let [channels, height, width] = self.frame_shape();
        check_frames(
            "live-stream diffusion model",
            &frames,
            channels,
            Some([height, width]),
        )?;
        if timesteps.is_empty() {
            return Err(FrameError::NoSteps);
        }
        let batch = frames.dims()[0];
        if batch != stream.streams() {
            return Err(FrameError::Streams {
                streams: stream.streams(),
                batch,
            });
        }
        if self.runtime.on_host(&frames)
            && let Some(out) = on_host_pool::<B, _>(&frames.device(), || {
                self.next_frame_on_host(stream, frames.clone(), timesteps)
            })
        {
            return Ok(out);
        }
        let pass = self.runtime.pass();
        let policy = pass.policy_on::<B>(&frames.device());
        let frames = pass.input(frames);
        // The stream's last output in this model's dtype (another model may have written it).
        let previous = stream.previous.clone().map(|p| pass.input(p));
        let mut generated = previous.clone().unwrap_or_else(|| frames.clone());
        for &timestep in timesteps {
            let t = Tensor::<B, 1>::full([batch], timestep, &frames.device()).cast(frames.dtype());
            generated = self
                .diffusion_block
                .forward(frames.clone(), generated, t, &policy);
        }
        let correction = self
            .context_memory
            .correction(stream, generated.clone(), &self.runtime);
        let corrected = generated + correction.mul_scalar(MEMORY_WEIGHT);
        let out = match previous {
            Some(previous) => self.consistency_net.blend(corrected, previous),
            None => corrected,
        };
        stream.previous = Some(out.clone());
        Ok(pass.output(out))
    }
}

impl<B: Backend> LiveStreamDiffusion<B> {
    /// [`Self::next_frame`] on the host: NHWC images between the layers, each convolution one
    /// product with its activation fused, the norms in place; the bank's write and weighting
    /// through burn's operations (a few thousand values). `None` where a layer is not served.
    fn next_frame_on_host(
        &self,
        stream: &mut Stream<B>,
        frames: Tensor<B, 4>,
        timesteps: &[f32],
    ) -> Option<Tensor<B, 4>> {
        let device = frames.device();
        let prepared = self.runtime.prepared();
        let input = HostImage::from_nchw(frames);
        let previous = (stream.previous.clone()).map(|p| HostImage::from_nchw(p.cast(DType::F32)));
        let mut generated = previous.clone().unwrap_or_else(|| input.clone());
        for &timestep in timesteps {
            generated =
                (self.diffusion_block).forward_on_host(&input, &generated, timestep, prepared)?;
        }
        let correction = (self.context_memory).correction_on_host(stream, &generated, prepared)?;
        generated.combine(&correction, |g, c| g + MEMORY_WEIGHT * c);
        let out = match previous {
            Some(previous) => self
                .consistency_net
                .blend_on_host(generated, &previous, prepared)?,
            None => generated,
        };
        let out = out.into_nchw::<B>(&device);
        stream.previous = Some(out.clone());
        Some(out)
    }
}

impl<B: Backend> DiffusionBlock<B> {
    /// The frame after one step at `timesteps` `[batch]`, conditioned on `previous`, its norms
    /// in f32 and the rest in `policy`'s compute dtype.
    pub fn forward(
        &self,
        frames: Tensor<B, 4>,
        previous: Tensor<B, 4>,
        timesteps: Tensor<B, 1>,
        policy: &Policy,
    ) -> Tensor<B, 4> {
        let x = Tensor::cat(vec![frames, previous], 1);
        let h = silu(norm_in_f32(&self.norm_in, self.conv_in.forward(x), policy));
        let h = silu(norm_in_f32(&self.norm_down, self.down.forward(h), policy));
        let time = self.time_embedding(timesteps);
        let [batch, hidden] = time.dims();
        let h = h + time.reshape([batch, hidden, 1, 1]);
        let h = silu(norm_in_f32(&self.norm_up, self.up.forward(h), policy));
        self.conv_out.forward(h)
    }

    /// [`Self::forward`] on the host at one `timestep` for every image.
    fn forward_on_host(
        &self,
        frames: &HostImage,
        previous: &HostImage,
        timestep: f32,
        prepared: &PreparedWeights,
    ) -> Option<HostImage> {
        let batch = frames.shape[0];
        let mut h = frames
            .concat_channels(previous)
            .conv(&self.conv_in, prepared, same)?;
        h.group_norm(&self.norm_in, host::silu)?;
        let mut h = h.conv(&self.down, prepared, same)?;
        h.group_norm(&self.norm_down, host::silu)?;
        let device = self.time_in.weight.device();
        let time = self.time_embedding(Tensor::full([batch], timestep, &device));
        h.add_per_image(&time.into_data().to_vec::<f32>().ok()?);
        let mut h = h.conv_transposed(&self.up, prepared, same)?;
        h.group_norm(&self.norm_up, host::silu)?;
        h.conv(&self.conv_out, prepared, same)
    }

    /// The MLP of the sinusoidal embedding of `timesteps` `[batch]` → `[batch, hidden]`: the
    /// first half sines, the second cosines, of `t · exp(−i · ln(10⁴) / (hidden/2 − 1))`.
    fn time_embedding(&self, timesteps: Tensor<B, 1>) -> Tensor<B, 2> {
        let hidden = self.time_in.weight.dims()[0];
        let half = hidden / 2;
        let device = timesteps.device();
        let step = (10_000f64).ln() / (half as f64 - 1.0);
        let frequencies: Vec<f32> = (0..half)
            .map(|i| (-(i as f64) * step).exp() as f32)
            .collect();
        let frequencies =
            Tensor::<B, 1>::from_floats(frequencies.as_slice(), &device).cast(timesteps.dtype());
        let angles = timesteps.unsqueeze_dim::<2>(1) * frequencies.unsqueeze_dim(0);
        let embedded = Tensor::cat(vec![angles.clone().sin(), angles.cos()], 1);
        self.time_out.forward(silu(self.time_in.forward(embedded)))
    }
}

impl<B: Backend> ContextMemoryBank<B> {
    /// The bank's features of `frames` `[n, channels, H, W]`: `[n, 32, 8, 8]`.
    fn features(&self, frames: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = relu(self.feature_in.forward(frames));
        let x = relu(self.feature_down.forward(x));
        let x = adaptive_avg_pool2d(x, [MEMORY_GRID, MEMORY_GRID]);
        self.feature_out.forward(x)
    }

    /// The pooled features of `frames` `[n, channels, H, W]`: `[n, 32]`, what a slot is
    /// weighed by.
    fn keys(&self, frames: Tensor<B, 4>, runtime: &FrameRuntime) -> Tensor<B, 2> {
        let pass = runtime.pass();
        let features = self.features(pass.input(frames));
        let [n, channels, _, _] = features.dims();
        features.mean_dim(3).mean_dim(2).reshape([n, channels])
    }

    /// [`Self::features`] on the host.
    fn features_on_host(
        &self,
        frames: &HostImage,
        prepared: &PreparedWeights,
    ) -> Option<HostImage> {
        let x = frames.conv(&self.feature_in, prepared, relu_host)?;
        let x = x.conv(&self.feature_down, prepared, relu_host)?;
        let x = x.adaptive_avg_pool([MEMORY_GRID, MEMORY_GRID]);
        x.conv(&self.feature_out, prepared, same)
    }

    /// [`Self::correction`] on the host: the convolutions, pooling and resizing over NHWC
    /// images, the bank NHWC on the host too (its slot written in place, the softmax-weighted
    /// frames summed straight into the blend).
    fn correction_on_host(
        &self,
        stream: &mut Stream<B>,
        generated: &HostImage,
        prepared: &PreparedWeights,
    ) -> Option<HostImage> {
        let key = self.features_on_host(generated, prepared)?.mean_pixels();
        let [streams, height, width, channels] = generated.shape;
        // The query's 1 × 1 convolution is affine: the mean of its outputs over the pixels is
        // its output at the mean pixel (one row per stream, not 64 × 64).
        let mean = HostImage {
            values: generated.mean_pixels(),
            shape: [streams, 1, 1, channels],
        };
        let query = mean.conv(&self.memory_query, prepared, same)?.values;
        let slot = stream.next_slot;
        let (bank, keys, [_, slots, ..]) = stream.memory.host()?;
        stream.next_slot = (slot + 1) % slots;
        let frame = height * width * channels;
        let mut blend = HostImage {
            values: vec![0f32; streams * frame],
            shape: generated.shape,
        };
        let streams = (bank
            .par_chunks_mut(slots * frame)
            .zip(keys.par_chunks_mut(slots * MEMORY_FEATURES)))
        .zip(blend.values.par_chunks_mut(frame))
        .enumerate();
        streams.for_each(|(s, ((bank, keys), blend))| {
            bank[slot * frame..][..frame].copy_from_slice(&generated.values[s * frame..][..frame]);
            keys[slot * MEMORY_FEATURES..][..MEMORY_FEATURES]
                .copy_from_slice(&key[s * MEMORY_FEATURES..][..MEMORY_FEATURES]);
            let query = &query[s * MEMORY_FEATURES..][..MEMORY_FEATURES];
            let mut weights: Vec<f32> = (keys.chunks_exact(MEMORY_FEATURES))
                .map(|key| key.iter().zip(query).map(|(k, q)| k * q).sum())
                .collect();
            let max = weights.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            weights.iter_mut().for_each(|w| *w = (*w - max).exp());
            let total: f32 = weights.iter().sum();
            weights.iter_mut().for_each(|w| *w /= total);
            for (frame, &w) in bank.chunks_exact(frame).zip(&weights) {
                blend.iter_mut().zip(frame).for_each(|(b, &v)| *b += w * v);
            }
        });
        let x = self.features_on_host(&blend, prepared)?;
        let x = x.conv(&self.out_conv, prepared, relu_host)?;
        x.resize_bilinear([height, width])
            .conv(&self.out_proj, prepared, same)
    }

    /// Writes `generated` `[streams, C, H, W]` into each stream's next slot, then returns the
    /// correction decoded from the bank's frames weighted by their match with `generated`.
    fn correction(
        &self,
        stream: &mut Stream<B>,
        generated: Tensor<B, 4>,
        runtime: &FrameRuntime,
    ) -> Tensor<B, 4> {
        let [streams, slots, channels, height, width] = stream.memory.dims();
        let slot = stream.next_slot;
        let new_keys = self.keys(generated.clone(), runtime).unsqueeze_dim(1);
        let (bank, keys) = stream.memory.tensors(generated.dtype());
        *bank = bank.clone().slice_assign(
            [0..streams, slot..slot + 1, 0..channels, 0..height, 0..width],
            generated.clone().unsqueeze_dim(1),
        );
        *keys = keys
            .clone()
            .slice_assign([0..streams, slot..slot + 1, 0..MEMORY_FEATURES], new_keys);
        stream.next_slot = (slot + 1) % slots;

        let query = self.memory_query.forward(generated);
        let query = query
            .mean_dim(3)
            .mean_dim(2)
            .reshape([streams, MEMORY_FEATURES, 1]);
        let similarities = keys.clone().matmul(query).reshape([streams, slots]);
        let weights = softmax(similarities, 1).reshape([streams, slots, 1, 1, 1]);
        let blend = (bank.clone() * weights).sum_dim(1);
        let blend = blend.reshape([streams, channels, height, width]);
        let x = relu(self.out_conv.forward(self.features(blend)));
        let options = InterpolateOptions::new(InterpolateMode::Bilinear).with_align_corners(false);
        self.out_proj
            .forward(interpolate(x, [height, width], options))
    }
}

impl<B: Backend> ConsistencyNet<B> {
    /// `w · corrected + (1 − w) · previous`, `w = σ(net([corrected, previous]))` per pixel.
    fn blend(&self, corrected: Tensor<B, 4>, previous: Tensor<B, 4>) -> Tensor<B, 4> {
        let x = Tensor::cat(vec![corrected.clone(), previous.clone()], 1);
        let x = relu(self.hidden.forward(relu(self.input.forward(x))));
        let weight = sigmoid(self.output.forward(x));
        corrected * weight.clone() + previous * weight.neg().add_scalar(1.0)
    }
}

impl<B: Backend> ConsistencyNet<B> {
    /// [`Self::blend`] on the host.
    fn blend_on_host(
        &self,
        corrected: HostImage,
        previous: &HostImage,
        prepared: &PreparedWeights,
    ) -> Option<HostImage> {
        let x = corrected.concat_channels(previous);
        let x = x.conv(&self.input, prepared, relu_host)?;
        let x = x.conv(&self.hidden, prepared, relu_host)?;
        let weight = x.conv(&self.output, prepared, |v| 1.0 / (1.0 + host::exp(-v)))?;
        let channels = corrected.shape[3];
        let mut out = corrected;
        let pixels = out.values.chunks_exact_mut(channels);
        for ((pixel, before), &w) in pixels
            .zip(previous.values.chunks_exact(channels))
            .zip(&weight.values)
        {
            pixel
                .iter_mut()
                .zip(before)
                .for_each(|(c, &p)| *c = w * *c + (1.0 - w) * p);
        }
        Some(out)
    }
}

/// The bank's next write position the checkpoint in `dir` holds (`memory_ptr`; 0 where it
/// holds none), which must be one of its `slots` slots.
fn memory_position(dir: &Path, slots: usize) -> Result<usize, CheckpointError> {
    let shapes = CheckpointShapes::read(dir)?;
    let Some(data) = shapes.values(MEMORY_POSITION)? else {
        return Ok(0);
    };
    let values: Vec<i64> = data.iter::<i64>().collect();
    match values.as_slice() {
        &[position] if (0..slots as i64).contains(&position) => Ok(position as usize),
        _ => Err(CheckpointError::Unreadable {
            file: kiln_core::weight_files(dir)?.remove(0),
            reason: format!(
                "`{MEMORY_POSITION}` is {values:?}: the bank's next slot, one of its {slots}"
            ),
        }),
    }
}

/// The identity, for a product with nothing after it.
fn same(v: f32) -> f32 {
    v
}

/// `max(v, 0)`.
fn relu_host(v: f32) -> f32 {
    v.max(0.0)
}

/// `norm(x)` in f32 whatever the compute dtype (the norms keep f32 weights under every policy).
fn norm_in_f32<B: Backend>(norm: &GroupNorm<B>, x: Tensor<B, 4>, policy: &Policy) -> Tensor<B, 4> {
    if x.dtype() == DType::F32 {
        return norm.forward(x);
    }
    cast(norm.forward(x.cast(DType::F32)), policy.compute)
}
