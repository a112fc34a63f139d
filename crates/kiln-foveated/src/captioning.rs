//! Captions as fVLM's `generate_captions.py` makes them: a trained model found from its
//! directory ([`CheckpointSource`]), clips read as fVLM's inference reads them, and
//! [`Captioner::caption`] on [`FoveatedModel::generate`]. The `foveated_caption` example and
//! Python's `kiln.foveated.caption` are this module over a folder of clips.

use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_cache::{CachedImages, ClipSpec};
use kiln_core::{Policy, Precision};
use kiln_text::{GenerationConfig, Sampling};

use crate::{
    CaptionTokenizer, ClipBatch, FoveatedError, FoveatedModel, FrameFit, Variant, dinov2_frames,
};

/// What a model directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointKind {
    /// A model kiln saved ([`FoveatedModel::save`]: `config.json` and `model.safetensors`).
    Kiln,
    /// fVLM's state dict (`model.safetensors` in fVLM's names), over the backbones it was
    /// trained from.
    Fvlm,
}

impl std::str::FromStr for CheckpointKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "kiln" => Ok(CheckpointKind::Kiln),
            "fvlm" => Ok(CheckpointKind::Fvlm),
            other => Err(format!(
                "`{other}`: `kiln` (a model foveated_train saved) or `fvlm` (fVLM's checkpoint)"
            )),
        }
    }
}

/// Where a trained model and its tokenizer are: a model foveated_train saved (its tokenizer
/// beside it, else in `lm`), or fVLM's checkpoint over the Hugging Face directories `dino`
/// and `lm` it was trained from.
#[derive(Debug, Clone)]
pub struct CheckpointSource {
    /// The model's directory.
    pub dir: PathBuf,
    /// The DINOv2 directory an fVLM checkpoint was trained from.
    pub dino: Option<PathBuf>,
    /// The LM directory an fVLM checkpoint was trained from, or the tokenizer of a kiln model
    /// saved without one.
    pub lm: Option<PathBuf>,
    /// What `dir` holds; `None`: kiln's when it has a `config.json`, else fVLM's.
    pub kind: Option<CheckpointKind>,
}

impl CheckpointSource {
    /// A directory found from its files, with no backbone directories.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CheckpointSource {
            dir: dir.into(),
            dino: None,
            lm: None,
            kind: None,
        }
    }

    /// What the directory holds.
    pub fn kind(&self) -> CheckpointKind {
        self.kind
            .unwrap_or(match self.dir.join("config.json").is_file() {
                true => CheckpointKind::Kiln,
                false => CheckpointKind::Fvlm,
            })
    }

    /// The model, its backbones under `policy`, and the directory holding its tokenizer.
    ///
    /// # Errors
    /// A model that cannot be loaded; fVLM's checkpoint without `dino` and `lm`; a kiln model
    /// without a tokenizer beside it or `lm`.
    pub fn load<B: Backend>(
        &self,
        device: &B::Device,
        policy: &Policy,
    ) -> Result<(FoveatedModel<B>, PathBuf), FoveatedError> {
        let dir = &self.dir;
        match self.kind() {
            CheckpointKind::Kiln => {
                let model = FoveatedModel::<B>::load(dir, device, policy)?;
                let tokenizer = match (&self.lm, dir.join("tokenizer.json").is_file()) {
                    (Some(lm), _) => lm.clone(),
                    (None, true) => dir.clone(),
                    (None, false) => {
                        return Err(FoveatedError::Config(format!(
                            "{}: no tokenizer.json beside the model (saved before foveated_train \
                             kept the LM's tokenizer): give the LM directory it was trained from \
                             (--lm; from Python, lm=)",
                            dir.display()
                        )));
                    }
                };
                Ok((model, tokenizer))
            }
            CheckpointKind::Fvlm => {
                let (Some(dino), Some(lm)) = (&self.dino, &self.lm) else {
                    return Err(FoveatedError::Config(format!(
                        "{}: fVLM's checkpoint (no config.json) holds no backbone shapes: give \
                         the DINOv2 and LM directories it was trained from (--dino and --lm; \
                         from Python, dino= and lm=)",
                        dir.display()
                    )));
                };
                let model =
                    FoveatedModel::<B>::from_fvlm_checkpoint(dir, dino, lm, device, policy)?;
                Ok((model, lm.clone()))
            }
        }
    }

    /// Where DINOv2's processor settings are looked for (a research model's frames).
    fn dino_dir(&self) -> &Path {
        self.dino.as_deref().unwrap_or(&self.dir)
    }
}

/// Clip `index` of `clips` as `[1, T, 3, H, W]` in `precision`; a one-frame clip (a still
/// image) repeated `still_frames` times, as fVLM's evaluation does.
pub fn clip_pixels<B: Backend>(
    clips: &CachedImages,
    index: usize,
    still_frames: usize,
    device: &B::Device,
    precision: Precision,
) -> Result<Tensor<B, 5>, FoveatedError> {
    let frames = clips.upload::<B>(index..index + 1, device, precision)?;
    let [count, channels, height, width] = frames.dims();
    let clip = frames.reshape([1, count, channels, height, width]);
    Ok(match count {
        1 => clip.repeat_dim(1, still_frames.max(1)),
        _ => clip,
    })
}

/// A model that captions clips as fVLM's `generate_captions.py` does: the question (fVLM's
/// system prompt and the user's turn, the assistant's turn opened) after the visual tokens, or
/// for a research model its prompt before them.
pub struct Captioner<B: Backend> {
    /// The model.
    pub model: FoveatedModel<B>,
    tokens: CaptionTokenizer,
    question: Vec<u32>,
    prompt: Vec<u32>,
}

impl<B: Backend> Captioner<B> {
    /// `model` asking `prompt` (the user's turn; a research model's text before the frames),
    /// with the tokenizer in `tokenizer_dir`.
    ///
    /// # Errors
    /// A tokenizer that cannot be read, or (release) has no chat template.
    pub fn new(
        model: FoveatedModel<B>,
        tokenizer_dir: &Path,
        prompt: &str,
    ) -> Result<Self, FoveatedError> {
        let (tokens, question, prompt) = match model.config().variant {
            Variant::Release => {
                let tokens = CaptionTokenizer::chat_from_lm_dir(tokenizer_dir, prompt)?;
                let question = tokens.question(prompt)?;
                (tokens, question, Vec::new())
            }
            Variant::Research => {
                let tokens = CaptionTokenizer::from_lm_dir(tokenizer_dir, prompt)?;
                let prompt = tokens.prompt().to_vec();
                (tokens, Vec::new(), prompt)
            }
        };
        Ok(Captioner {
            model,
            tokens,
            question,
            prompt,
        })
    }

    /// How clips are read for this model, as its variant was trained to see them: release, one
    /// frame a second up to `frames`, fitted as `fit` (fVLM's evaluation squashes); research,
    /// `frames` sampled uniformly as `source`'s DINOv2 processor says.
    pub fn clip_spec(
        &self,
        frames: u32,
        fit: FrameFit,
        source: &CheckpointSource,
    ) -> Result<ClipSpec, FoveatedError> {
        let image_size = self.model.dino.config().image_size;
        Ok(match self.model.config().variant {
            Variant::Release => ClipSpec::per_second(frames, fit.preprocess(image_size)),
            Variant::Research => {
                ClipSpec::new(frames, dinov2_frames(source.dino_dir(), image_size)?)
            }
        })
    }

    /// The caption of the clip `pixels` (`[1, T, 3, H, W]`) and its token count: up to
    /// `max_new_tokens` (or the LM's positions) chosen by `sampling`, stopping at the
    /// tokenizer's end token, which is not counted.
    pub fn caption(
        &self,
        pixels: Tensor<B, 5>,
        max_new_tokens: usize,
        sampling: Sampling,
    ) -> Result<(String, usize), FoveatedError> {
        let end = self.tokens.end();
        let generation = GenerationConfig {
            sampling,
            stop_tokens: vec![end],
            pad_token: end,
            ..GenerationConfig::greedy(max_new_tokens)
        };
        let mut batch = ClipBatch::new(pixels).with_target(vec![self.question.clone()]);
        if !self.prompt.is_empty() {
            batch = batch.with_prompt(vec![self.prompt.clone()]);
        }
        let mut ids = self.model.generate(&batch, &generation, |_| {})?.remove(0);
        if ids.last() == Some(&end) {
            ids.pop();
        }
        Ok((self.tokens.decode(&ids)?, ids.len()))
    }
}
