//! The foveated model's own settings (`config.json` beside its connector weights).

use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::FoveatedError;

/// How a query reads a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Readout {
    /// fVLM's first version: `softmax((W q)·Pᵀ/√d)·P` over the final patch features, no key or
    /// value projections (multi-head with [`FoveatedConfig::shallow_heads`]).
    Shallow,
    /// fVLM's released model: the query goes through every DINOv2 layer, attending at each to
    /// the patches' cached keys and values.
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
    /// Width of the queries (`q_static`, `q_init`, `llm_to_query`'s output).
    pub query_dim: usize,
    /// How queries read frames.
    pub readout: Readout,
    /// Heads of the shallow readout (the released shallow readout has one).
    pub shallow_heads: usize,
    /// Whether DINOv2's CLS token stays among the tokens a query reads (fVLM's released model
    /// keeps it).
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
        FoveatedConfig::fvlm()
    }
}

impl FoveatedConfig {
    /// fVLM's released model: 384-wide queries, deep readout with the CLS token, visual scale
    /// 0.14, both passes trained (λ = 1), no per-frame head.
    pub fn fvlm() -> Self {
        FoveatedConfig {
            query_dim: 384,
            readout: Readout::Deep,
            shallow_heads: 1,
            keep_cls: true,
            visual_scale: 0.14,
            lambda_coarse: 1.0,
            frame_head: FrameHead::None,
        }
    }

    /// The settings in `config.json` at `path` (a directory holding one, or the file); fields
    /// it leaves out take [`FoveatedConfig::fvlm`]'s values.
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
