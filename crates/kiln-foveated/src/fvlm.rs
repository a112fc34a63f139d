//! fVLM's own checkpoints: its `FoveatedVLM.state_dict()` in a safetensors file, under fVLM's
//! names (`scripts/fvlm_checkpoint.py` converts the `.pt` files fVLM's `train.py` writes, and
//! back).

use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_core::{Policy, load_checkpoint, save_weights, tensor_shapes};
use kiln_vision::Tower;

use crate::{FoveatedConfig, FoveatedError, FoveatedModel, FrameHead, Variant};

/// fVLM's names → kiln's parameter paths (applied in order).
const FROM_FVLM: &[(&str, &str)] = &[
    (r"^encoder\.dino\.", "dino."),
    (
        r"^encoder\.(query_input_proj|output_proj)\.",
        "connectors.${1}.",
    ),
    (r"^(q_static|q_init)$", "connectors.${1}"),
    (r"^(dino_to_llm|llm_to_query)\.", "connectors.${1}."),
    (r"^llm\.", "lm."),
];

/// [`FvlmStateDict`]'s paths → fVLM's names (applied in order).
const TO_FVLM: &[(&str, &str)] = &[
    (r"^model\.dino\.", "encoder.dino."),
    (r"^model\.lm\.", "llm."),
    (
        r"^model\.connectors\.(query_input_proj|output_proj)\.",
        "encoder.${1}.",
    ),
    (r"^model\.connectors\.", ""),
    (r"^mask_token$", "encoder.dino.embeddings.mask_token"),
    (r"^lm_head$", "llm.lm_head.weight"),
];

/// fVLM's tensors that kiln's model has no use for: DINOv2's token for masked-image training,
/// and the LM head when it is the token embeddings (tied).
const UNUSED_ON_PURPOSE: &[&str] = &["encoder.dino.embeddings.mask_token", "llm.lm_head."];

/// The file of an fVLM checkpoint directory.
const FILE: &str = "model.safetensors";

/// Everything fVLM's `state_dict()` holds, for saving: the model, and the two tensors its
/// strict `load_state_dict` wants that kiln's modules do not keep.
#[derive(Module, Debug)]
struct FvlmStateDict<B: Backend> {
    model: FoveatedModel<B>,
    /// DINOv2's mask token `[1, hidden]`: unused by every forward; zeros, as transformers
    /// initialises it.
    mask_token: Param<Tensor<B, 2>>,
    /// `llm.lm_head.weight` when the LM ties it to the token embeddings (PyTorch lists a tied
    /// weight under both names).
    lm_head: Option<Param<Tensor<B, 2>>>,
}

impl<B: Backend> FoveatedModel<B> {
    /// fVLM's checkpoint in `dir` (`model.safetensors` in fVLM's names) over the backbones it
    /// was trained from, the Hugging Face directories `dino` and `lm` (which give the shapes and
    /// the tokenizer; their weights are replaced): the release variant, its query width read
    /// from the checkpoint's `q_init` (fVLM's released models: 384).
    pub fn from_fvlm_checkpoint(
        dir: impl AsRef<Path>,
        dino: impl AsRef<Path>,
        lm: impl AsRef<Path>,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<Self, FoveatedError> {
        let file = dir.as_ref().join(FILE);
        let shapes = tensor_shapes(&file)?;
        let query_dim = match shapes.get("q_init").map(Vec::as_slice) {
            Some(&[1, width]) if width > 0 => width,
            other => {
                return Err(FoveatedError::Config(format!(
                    "{}: not fVLM's checkpoint (its `q_init` is {other:?}, fVLM's is [1, \
                     query_dim])",
                    file.display()
                )));
            }
        };
        let config = FoveatedConfig {
            query_dim,
            ..FoveatedConfig::release()
        };
        Self::from_dirs(dino, lm, config, device, policy)?.with_fvlm_weights(dir)
    }

    /// Every weight from the fVLM checkpoint in `dir` (`model.safetensors`: fVLM's
    /// `FoveatedVLM.state_dict()`, its names and shapes, as `scripts/fvlm_checkpoint.py` writes
    /// it from a `.pt`), DINOv2, the LM and the connectors, cast to the policies the backbones
    /// run under. The model must be the release variant of the checkpoint's sizes (fVLM's
    /// checkpoints hold no `config.json`: build it with [`FoveatedModel::from_dirs`] on the
    /// backbones fVLM started from); a tensor missing or of another shape is an error naming
    /// each.
    pub fn with_fvlm_weights(self, dir: impl AsRef<Path>) -> Result<Self, FoveatedError> {
        self.check_fvlm_form()?;
        let (dino_policy, lm_policy) = (self.dino.settings().policy, *self.lm.policy());
        let mut model = load_checkpoint(self, dir.as_ref(), FROM_FVLM, UNUSED_ON_PURPOSE)?;
        model.dino = model.dino.with_policy(&dino_policy);
        model.lm = model.lm.with_policy(&lm_policy);
        Ok(model)
    }

    /// Writes `dir/model.safetensors` (creating `dir`, replacing the file whole or not at all)
    /// in fVLM's names and shapes, f32: a state dict fVLM's `FoveatedVLM.load_state_dict`
    /// takes (`scripts/fvlm_checkpoint.py` makes the `.pt` its `train.py` resumes from).
    /// DINOv2's mask token, which no forward uses and kiln does not keep, is written as zeros.
    pub fn save_fvlm(&self, dir: impl AsRef<Path>) -> Result<(), FoveatedError> {
        self.check_fvlm_form()?;
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir)
            .map_err(|e| kiln_core::CheckpointError::from(kiln_io::FileError::io(dir, e)))?;
        let device = self.connectors.q_init.val().device();
        let hidden = self.dino.hidden_size();
        let state = FvlmStateDict {
            model: self.clone(),
            mask_token: Param::from_tensor(Tensor::zeros([1, hidden], &device)),
            lm_head: self
                .lm
                .config()
                .tie_word_embeddings
                .then(|| Param::from_tensor(self.lm.output_embeddings())),
        };
        Ok(save_weights(&state, &dir.join(FILE), TO_FVLM)?)
    }

    /// Refuses a model fVLM's checkpoints cannot describe.
    fn check_fvlm_form(&self) -> Result<(), FoveatedError> {
        let config = self.config();
        if config.variant != Variant::Release || config.frame_head != FrameHead::None {
            return Err(FoveatedError::Config(
                "fVLM's checkpoints hold the release variant without a per-frame head: build \
                 the model with FoveatedConfig::release()"
                    .into(),
            ));
        }
        Ok(())
    }
}
