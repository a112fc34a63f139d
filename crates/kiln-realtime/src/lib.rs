//! # kiln-realtime
//!
//! Convolutional frame models for real-time frame-to-frame diffusion: the two models of
//! [mirage-hello](https://github.com/toddllm/mirage-hello) (04a704d), a live-stream diffusion
//! project, each in the loop the project runs it in: every incoming frame goes through a small
//! network within a frame budget.
//!
//! - [`unet`]: its benchmarked U-Net (`SimpleOptimizedUNet`): stride-2 convolutions, 12-head
//!   self-attention at the bottleneck, transposed convolutions with additive skips; a frame is
//!   its benchmark's six forwards ([`UNet::frame`]);
//! - [`lsd`]: its lightweight live-stream diffusion model (`LiveStreamDiffusionModel`): a
//!   conditioned conv block with a sinusoidal time embedding, an 8-frame memory bank and a
//!   sigmoid blend with the previous output; a frame is one call, as its demo streams them
//!   ([`LiveStreamDiffusion::next_frame`]).
//!
//! The project's own streaming demo (`demo/demo.py`) runs a third network, which is not here
//! (docs/REALTIME.md says what each of its scripts measures).
//!
//! Both load the system's PyTorch state dicts under their own names and run on every backend
//! (burn's convolutions, group norms and interpolation; kiln-transformer's attention), under a
//! precision policy applied once to the weights ([`unet::UNet::with_policy`]).
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::Tensor;
//! use kiln_realtime::unet::UNetConfig;
//!
//! let device = Default::default();
//! let unet = UNetConfig::new(4, 3, 16).init::<Flex>(&device);
//! let frames = Tensor::<Flex, 4>::zeros([2, 3, 16, 16], &device);
//! let denoised = unet.denoise(frames, 50.0).unwrap();
//! assert_eq!(denoised.dims(), [2, 3, 16, 16]);
//! ```

pub mod lsd;
mod runtime;
pub mod unet;

pub use lsd::{LiveStreamDiffusion, LsdConfig, Stream};
pub use unet::{FrameLoop, UNet, UNetConfig};

/// Frames a model cannot read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Frames of another shape than the model reads.
    #[error(
        "the {model} reads frames of {expected}; these are {got:?} (batch, channels, height, width)"
    )]
    Shape {
        /// The model.
        model: &'static str,
        /// What it reads.
        expected: String,
        /// The frames' dimensions.
        got: [usize; 4],
    },
    /// A frame asked for with no denoising step.
    #[error("a frame needs at least one denoising step")]
    NoSteps,
    /// A model's setting it cannot be built with, named as the config names it.
    #[error("the {model}: {setting} = {value}: {needs}")]
    Config {
        /// The model.
        model: &'static str,
        /// The setting.
        setting: &'static str,
        /// Its value.
        value: usize,
        /// What the model needs of it.
        needs: &'static str,
    },
    /// A stream's state used with frames of another batch.
    #[error("the stream holds {streams} streams; these frames are a batch of {batch}")]
    Streams {
        /// Streams the state holds.
        streams: usize,
        /// The frames' batch.
        batch: usize,
    },
}
