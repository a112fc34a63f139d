//! # kiln-foveated
//!
//! fVLM's two-pass foveated video-language model (github.com/spsanps/nanoSmol, `fVLM/`) on
//! kiln's DINOv2 ([`kiln_vision::Dinov2Model`]) and Llama-family LMs ([`kiln_text::CausalLm`]).
//!
//! Every frame of a clip goes through DINOv2 once ([`kiln_vision::Dinov2Model::encode_patches`],
//! all clips' real frames in one batch); a query then reads one visual token out of each frame
//! ([`Readout`]: shallow, or deep through every DINOv2 layer). The **coarse pass** reads every
//! frame with the same learned query `q_static`; the **fine pass** reads frame t with a query
//! that `llm_to_query` makes from the coarse pass's hidden state at frame t − 1 (`q_init` for the
//! first frame) — it decides where to look from what it saw before. The loss is
//! `fine + λ·coarse`.
//!
//! Two designs ([`Variant`]): **release** is fVLM as released (`FoveatedConfig::release`, the
//! default): the LM reads `[z_1 … z_T, chat-templated text]`, the coarse pass runs it over the
//! visual tokens alone, λ = 0, and fVLM's checkpoints load
//! ([`FoveatedModel::with_fvlm_weights`]) and save ([`FoveatedModel::save_fvlm`]); its parity
//! tests run against fVLM's own code. **research** is kiln's first reading, after fVLM's
//! research code: `[prompt, mode token, z_1 … z_T, target]` in both passes, λ = 1
//! (`FoveatedConfig::research`); docs/FOVEATED.md's proof that the fine pass looks was made
//! with it.
//!
//! Training support (`TrainStep` / `EvalStep`, [`research_recipe`], [`ReleaseRecipe`], the captioned-clip loader and
//! the cue-then-read task in [`synthetic`]) is behind the `train` feature, on in the facade.
//!
//! ```no_run
//! use burn::backend::Flex;
//! use kiln_foveated::{ClipBatch, FoveatedConfig, FoveatedModel, Mode};
//! use kiln_core::Policy;
//! # fn run(pixels: burn::tensor::Tensor<Flex, 5>) -> Result<(), kiln_foveated::FoveatedError> {
//! let device = Default::default();
//! let model = FoveatedModel::<Flex>::from_dirs(
//!     "dinov2-small", "SmolLM2-135M-Instruct", FoveatedConfig::release(), &device, &Policy::full(),
//! )?
//! // fVLM's released weights (`scripts/fvlm_checkpoint.py` converts its `.pt`).
//! .with_fvlm_weights("fvlm-135m")?;
//! // The chat-templated conversation after the visual tokens; stage 2 scores the answer only.
//! let text = vec![vec![1, 2, 3, 4, 5]];
//! let answer = vec![vec![false, false, false, true, true]];
//! let batch = ClipBatch::new(pixels).with_target(text).with_loss_mask(answer);
//! let output = model.forward(&batch, Mode::CoarseFine)?;
//! let loss = model.loss(&output, &batch)?;
//! # Ok(()) }
//! ```

#[cfg(feature = "train")]
mod batches;
#[cfg(feature = "train")]
mod captioning;
#[cfg(feature = "train")]
mod captions;
mod config;
mod connectors;
mod diagnostics;
#[cfg(feature = "train")]
mod dpo;
mod fvlm;
mod model;
#[cfg(feature = "train")]
mod questions;
mod saved;
#[cfg(feature = "train")]
mod stages;
#[cfg(feature = "train")]
pub mod synthetic;
#[cfg(feature = "train")]
mod train;

#[cfg(feature = "train")]
pub use batches::CaptionedClips;
#[cfg(feature = "train")]
pub use captioning::{Captioner, CheckpointKind, CheckpointSource, clip_pixels};
#[cfg(feature = "train")]
pub use captions::{
    Caption, CaptionTokenizer, CaptionedClipReader, Conversation, FVLM_CAPTION_PROMPT,
    FVLM_SYSTEM_PROMPT, FrameFit, TextSample, dinov2_frames, fvlm_source_prompt, match_captions,
    read_captions, read_text_samples,
};
pub use config::{FoveatedConfig, FrameHead, Readout, Variant};
pub use connectors::Connectors;
#[cfg(feature = "train")]
pub use dpo::{
    PreferenceBatch, PreferencePair, PreferencePairs, PreferenceTraining, read_preference_pairs,
};
pub use model::{
    ClipBatch, DPO_BETA, FoveatedModel, FoveatedOutput, Glimpse, Losses, Mode, PassOutput,
    PreferenceLogps, dpo_loss,
};
#[cfg(feature = "train")]
pub use questions::{Question, answer_letter, mcq_options, read_questions};
#[cfg(feature = "train")]
pub use stages::ReleaseStage;
#[cfg(feature = "train")]
pub use train::{ReleaseRecipe, research_recipe};

/// Why the foveated model could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum FoveatedError {
    /// Settings that cannot be used.
    #[error("{0}")]
    Config(String),
    /// A checkpoint that cannot be found, read, loaded or saved (which tensors, which file).
    #[error(transparent)]
    Checkpoint(#[from] kiln_core::CheckpointError),
    /// Inputs the model cannot take; the message names the clip, frame or token (1-based).
    #[error("{0}")]
    Input(String),
    /// A dataset that cannot be used: a captions file that does not match the clips, a line
    /// that is not a caption (1-based line numbers).
    #[error("{0}")]
    Data(String),
    /// From the vision tower.
    #[error(transparent)]
    Vision(#[from] kiln_vision::VisionError),
    /// From the language model.
    #[error(transparent)]
    Text(#[from] kiln_text::TextError),
    /// From the clip cache: a clip that cannot be decoded or cached, a processor file that
    /// cannot be read.
    #[cfg(feature = "train")]
    #[error(transparent)]
    Cache(#[from] kiln_cache::CacheError),
}
