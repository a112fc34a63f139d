//! What every frame model computes with, and the frame checks they share.

use std::collections::BTreeMap;
use std::path::Path;

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln_core::{CheckpointError, Policy, Precision, cast_module, read_tensor, tensor_shapes};
use kiln_kernels::host;
use kiln_transformer::{Pass, PreparedWeights, Products, Settings, host_autocast};

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
    fn new(policy: Policy) -> Self {
        FrameRuntime {
            settings: Settings {
                policy,
                ..Settings::default()
            },
            prepared: PreparedWeights::default().for_products(Products::under(&policy)),
        }
    }

    /// `model` under `policy`, and its runtime: the parameters converted once to the compute
    /// dtype (the system's `model.to(dtype=...)`: no per-call casts), except for a bf16 policy
    /// on a host backend, where they stay f32 and the host layers run as PyTorch's CPU autocast
    /// does ([`host_autocast`]): every product reads its operands rounded to bf16 (the
    /// weights' values are those of the bf16 copy), the layers between in f32.
    pub(crate) fn with_policy<B: Backend, M: Module<B>>(model: M, policy: Policy) -> (M, Self) {
        let as_mixed = Policy {
            param: Precision::F32,
            ..policy
        };
        let on_host = (model.devices().first()).is_some_and(|d| host_autocast::<B>(&as_mixed, d));
        if on_host {
            (model, FrameRuntime::new(as_mixed))
        } else {
            (
                cast_module(model, policy.compute),
                FrameRuntime::new(policy),
            )
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
    /// autodiff ([`host::serves`]) into a model whose parameters are f32 (f32 compute, or host
    /// autocast; a half policy's parameters elsewhere go through burn's operations, in their
    /// dtype, whatever the input's).
    pub(crate) fn on_host<B: Backend, const D: usize>(&self, x: &Tensor<B, D>) -> bool {
        let policy = self.policy();
        let f32_parameters =
            policy.compute == Precision::F32 || host_autocast::<B>(&policy, &x.device());
        f32_parameters && host::serves(x)
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

/// The tensors a checkpoint directory holds, by stored name, read from the headers alone, to
/// size a model before it is built.
pub(crate) struct CheckpointShapes {
    files: Vec<std::path::PathBuf>,
    shapes: BTreeMap<String, Vec<usize>>,
}

impl CheckpointShapes {
    /// The shapes of every tensor of the checkpoint in `dir` (`model.safetensors` or its shards).
    pub(crate) fn read(dir: &Path) -> Result<Self, CheckpointError> {
        let files = kiln_core::weight_files(dir)?;
        let mut shapes = BTreeMap::new();
        for file in &files {
            shapes.extend(tensor_shapes(file)?);
        }
        Ok(CheckpointShapes { files, shapes })
    }

    /// The dimensions of `name`, which must have `D` of them, each positive; else an error
    /// saying what `model`'s checkpoint holds there.
    pub(crate) fn dims<const D: usize>(
        &self,
        name: &str,
        model: &str,
    ) -> Result<[usize; D], CheckpointError> {
        let shape = self.shapes.get(name);
        match shape.map(|shape| <[usize; D]>::try_from(shape.as_slice())) {
            Some(Ok(dims)) if dims.iter().all(|&d| d > 0) => Ok(dims),
            _ => Err(CheckpointError::Unreadable {
                file: self.files[0].clone(),
                reason: format!(
                    "not {model}'s state dict: `{name}` is {}, where {model} holds {D} positive \
                     dimensions",
                    shape.map_or("missing".into(), |shape| format!("{shape:?}"))
                ),
            }),
        }
    }

    /// The values of `name` (`None` where no file of the checkpoint holds it).
    pub(crate) fn values(&self, name: &str) -> Result<Option<TensorData>, CheckpointError> {
        if !self.shapes.contains_key(name) {
            return Ok(None);
        }
        for file in &self.files {
            if let Some(data) = read_tensor(file, name)? {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}
