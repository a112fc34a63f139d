//! The foveated model's own settings (`config.json` beside its connector weights).

use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::FoveatedError;

/// Which of fVLM's two designs the model follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// fVLM as released (`fVLM/model.py`, `encoder.py`): the LM reads `[z_1 … z_T, text]` (the
    /// chat-templated conversation after the visual tokens, no mode tokens); the coarse pass
    /// runs the LM over the visual tokens alone, so the queries never see text; the text loss
    /// scores text positions only (the text's first token is not predicted from the visual
    /// tokens); padding frames are not encoded and read as zero.
    Release,
    /// kiln's first reading, after fVLM's research code (`research/old_src`): the LM reads
    /// `[prompt, mode token, z_1 … z_T, target]` in both passes (a learned `coarse_token` /
    /// `fine_token`), so the queries depend on the prompt; the loss scores the target, its first
    /// token predicted from the last visual token.
    Research,
}

impl FromStr for Variant {
    type Err = FoveatedError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "release" => Ok(Variant::Release),
            "research" => Ok(Variant::Research),
            other => Err(FoveatedError::Config(format!(
                "no variant named '{other}': the variants are 'release' and 'research'"
            ))),
        }
    }
}

/// How a query reads a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Readout {
    /// One attention over the final patch features. In the [`Variant::Release`] model it is
    /// fVLM's `shallow_query_attend`: the projected query attends, with DINOv2's heads, to the
    /// last layer's key and value projections of its `norm1` of the features, then DINOv2's
    /// final LayerNorm. In the [`Variant::Research`] model it is the research-era
    /// `softmax((W q)·Pᵀ/√d)·P`: no key or value projections, no LayerNorm,
    /// [`FoveatedConfig::shallow_heads`] heads.
    Shallow,
    /// fVLM's released readout (both variants): the query goes through every DINOv2 layer,
    /// attending at each to the patches' cached keys and values.
    Deep,
}

impl FromStr for Readout {
    type Err = FoveatedError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "shallow" => Ok(Readout::Shallow),
            "deep" => Ok(Readout::Deep),
            other => Err(FoveatedError::Config(format!(
                "no readout named '{other}': the readouts are 'shallow' and 'deep'"
            ))),
        }
    }
}

/// What the model predicts per frame, from the LM's hidden state at the frame's visual token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameHead {
    /// No per-frame prediction (captions or answers only).
    None,
    /// One of `n` classes (cross-entropy).
    Classes(usize),
}

/// The foveated model's settings; the backbones bring their own `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FoveatedConfig {
    /// fVLM's released design or kiln's research-era one.
    pub variant: Variant,
    /// Width of the queries (`q_static`, `q_init`, `llm_to_query`'s output).
    pub query_dim: usize,
    /// How queries read frames.
    pub readout: Readout,
    /// Heads of the research variant's shallow readout (the release variant's uses DINOv2's).
    pub shallow_heads: usize,
    /// Whether DINOv2's CLS token stays among the tokens a query reads (fVLM keeps it).
    pub keep_cls: bool,
    /// Scale of the visual tokens after `dino_to_llm`, to sit among the LM's embeddings.
    pub visual_scale: f64,
    /// Weight of the coarse pass's loss: `loss = fine + λ·coarse`.
    pub lambda_coarse: f64,
    /// The per-frame head.
    pub frame_head: FrameHead,
}

impl Default for FoveatedConfig {
    fn default() -> Self {
        FoveatedConfig::release()
    }
}

impl FoveatedConfig {
    /// The preset of `variant`: [`FoveatedConfig::release`] or [`FoveatedConfig::research`].
    pub fn of(variant: Variant) -> Self {
        match variant {
            Variant::Release => FoveatedConfig::release(),
            Variant::Research => FoveatedConfig::research(),
        }
    }

    /// fVLM's released model and every released config (`fVLM/configs/*.yaml`): 384-wide
    /// queries, deep readout with the CLS token, visual scale 0.14, λ_coarse = 0 (the coarse
    /// pass only makes the queries), no per-frame head.
    pub fn release() -> Self {
        FoveatedConfig {
            variant: Variant::Release,
            query_dim: 384,
            readout: Readout::Deep,
            shallow_heads: 1,
            keep_cls: true,
            visual_scale: 0.14,
            lambda_coarse: 0.0,
            frame_head: FrameHead::None,
        }
    }

    /// kiln's research-era model ([`Variant::Research`]) with [`FoveatedConfig::release`]'s
    /// sizes and both passes trained (λ_coarse = 1).
    pub fn research() -> Self {
        FoveatedConfig {
            variant: Variant::Research,
            lambda_coarse: 1.0,
            ..FoveatedConfig::release()
        }
    }

    /// The settings in `config.json` at `path` (a directory holding one, or the file); fields
    /// it leaves out take [`FoveatedConfig::release`]'s values.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, FoveatedError> {
        let (file, config): (_, FoveatedConfig) = kiln_core::read_config(path.as_ref())?;
        config.validate().map_err(|e| match e {
            FoveatedError::Config(e) => FoveatedError::Config(format!("{}: {e}", file.display())),
            other => other,
        })
    }

    /// Refuses settings the model cannot run with.
    pub fn validate(self) -> Result<Self, FoveatedError> {
        let fail = |what: String| Err(FoveatedError::Config(what));
        if self.query_dim == 0 {
            return fail("query_dim must be at least 1".into());
        }
        kiln_core::check_limits(&[
            ("query_dim", self.query_dim, kiln_core::MAX_WIDTH),
            ("shallow_heads", self.shallow_heads, kiln_core::MAX_WIDTH),
        ])
        .map_err(|e| FoveatedError::Config(e.to_string()))?;
        if self.shallow_heads == 0 {
            return fail("shallow_heads must be at least 1".into());
        }
        if matches!(self.frame_head, FrameHead::Classes(n) if n < 2) {
            return fail("a per-frame classifier needs at least 2 classes".into());
        }
        if !(self.lambda_coarse >= 0.0 && self.lambda_coarse.is_finite()) {
            return fail(format!(
                "lambda_coarse {} is not a finite weight ≥ 0",
                self.lambda_coarse
            ));
        }
        Ok(self)
    }
}
