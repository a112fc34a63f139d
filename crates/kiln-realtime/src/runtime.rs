//! What every frame model computes with, and the frame checks they share.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_core::{Policy, Precision};
use kiln_kernels::host;
use kiln_transformer::{Pass, PreparedWeights, Settings};

use crate::FrameError;

/// A frame model's precision policy and its prepared weights (packed once, reused by every
/// forward while the parameters are unchanged).
#[derive(Debug, Clone, Default)]
pub(crate) struct FrameRuntime {
    settings: Settings,
    prepared: PreparedWeights,
}

impl FrameRuntime {
    /// A runtime computing under `policy`.
    pub(crate) fn new(policy: Policy) -> Self {
        FrameRuntime {
            settings: Settings {
                policy,
                ..Settings::default()
            },
            prepared: PreparedWeights::default(),
        }
    }

    /// One forward's pass.
    pub(crate) fn pass(&self) -> Pass {
        Pass::new(&self.settings, &self.prepared, None)
    }

    /// The kernels the host path prepared.
    pub(crate) fn prepared(&self) -> &PreparedWeights {
        &self.prepared
    }

    /// The policy the model runs under.
    pub(crate) fn policy(&self) -> Policy {
        self.settings.policy
    }

    /// Whether the host layers serve a forward of `x`: an f32 tensor of a host backend without
    /// autodiff ([`host::serves`]) into a model computing in f32 (a half policy's parameters
    /// go through burn's operations, in their dtype, whatever the input's).
    pub(crate) fn on_host<B: Backend, const D: usize>(&self, x: &Tensor<B, D>) -> bool {
        self.policy().compute == Precision::F32 && host::serves(x)
    }
}

/// Whether `frames` `[batch, channels, height, width]` fit `model`: `channels` channels, and
/// the frame size `size` where the model has one, else sides that are multiples of 4 (two
/// stride-2 levels).
pub(crate) fn check_frames<B: Backend>(
    model: &'static str,
    frames: &Tensor<B, 4>,
    channels: usize,
    size: Option<[usize; 2]>,
) -> Result<(), FrameError> {
    let [batch, got_channels, height, width] = frames.dims();
    let fits = match size {
        Some(size) => [height, width] == size,
        None => height.is_multiple_of(4) && width.is_multiple_of(4) && height > 0 && width > 0,
    };
    if batch == 0 || got_channels != channels || !fits {
        let expected = match size {
            Some([h, w]) => format!("{channels} × {h} × {w}"),
            None => format!("{channels} channels, sides multiples of 4"),
        };
        return Err(FrameError::Shape {
            model,
            expected,
            got: [batch, got_channels, height, width],
        });
    }
    Ok(())
}
