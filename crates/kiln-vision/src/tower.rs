//! What every vision tower shares: where its checkpoint keys go, and how it runs (precision
//! policy, Monte-Carlo dropout sites).

use std::borrow::Cow;

use burn::module::Module;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use kiln_core::Policy;

use crate::TowerSettings;
use crate::VisionError;
use kiln_transformer::{Draw, DropoutError, DropoutSites};

/// A vision tower that loads from Hugging Face checkpoints and runs under [`TowerSettings`]:
/// `forward` (deterministic embeddings), `forward_sampled` (with Monte-Carlo dropout) and
/// `forward_all` (every output) for every tower.
pub trait Tower<B: Backend>: Module<B> {
    /// Everything a forward pass gives, in the policy's output dtype.
    type Output;

    /// The tower's family as its paper names it (`CLIP`, `SigLIP`, `DINOv2`).
    fn family(&self) -> &'static str;

    /// One forward pass of normalised `pixels` `[batch, 3, H, W]`: every output, the hidden
    /// states only with `keep_hidden_states`, dropout only with a `draw` (whose length the
    /// provided methods check).
    fn run(
        &self,
        pixels: Tensor<B, 4>,
        keep_hidden_states: bool,
        draw: Option<&Draw>,
    ) -> Self::Output;

    /// The embeddings among the outputs, `[batch, D]`.
    fn embeddings_of(output: Self::Output) -> Tensor<B, 2>;

    /// `D`, the width of an embedding.
    fn embedding_width(&self) -> usize;

    /// Refuses pixels `[batch, channels, H, W]` the tower cannot take (no images, another
    /// channel count, a size its position table does not cover), naming the `config.json`
    /// settings involved. [`Tower::forward_sampled`] checks; call it before [`Tower::forward`]
    /// on pixels from outside.
    fn check_pixels(&self, dims: [usize; 4]) -> Result<(), VisionError>;

    /// The embeddings of normalised `pixels` `[batch, 3, H, W]`, deterministic.
    fn forward(&self, pixels: Tensor<B, 4>) -> Tensor<B, 2> {
        Self::embeddings_of(self.run(pixels, false, None))
    }

    /// The embeddings with Monte-Carlo dropout at the tower's sites, masks from `draw`: one row
    /// per sample, with one sample per image or the same number `s` per image (rows
    /// `i·s .. (i+1)·s` are samples of image `i`).
    fn forward_sampled(
        &self,
        pixels: Tensor<B, 4>,
        draw: &Draw,
    ) -> Result<Tensor<B, 2>, VisionError> {
        self.check_pixels(pixels.dims())?;
        let batch = pixels.dims()[0];
        let samples = draw.rows.len();
        if samples < batch || !samples.is_multiple_of(batch) {
            return Err(DropoutError::DrawSize { samples, batch }.into());
        }
        Ok(Self::embeddings_of(self.run(pixels, false, Some(draw))))
    }

    /// Every output; `hidden_states` only with `keep_hidden_states`.
    fn forward_all(&self, pixels: Tensor<B, 4>, keep_hidden_states: bool) -> Self::Output {
        self.run(pixels, keep_hidden_states, None)
    }

    /// Regular-expression rewrites from checkpoint keys to this module's parameter paths, for
    /// checkpoints that name them otherwise (none by default: the fields mirror the keys).
    fn key_remapping() -> &'static [(&'static str, &'static str)] {
        &[]
    }

    /// The tower's policy and dropout sites.
    fn settings(&self) -> &TowerSettings;

    /// The same, to change.
    fn settings_mut(&mut self) -> &mut TowerSettings;

    /// Drops whatever the tower derived from its weights (called after they are loaded or cast).
    fn weights_changed(&mut self) {}

    /// The tower under `policy`: parameters cast to its parameter dtype once, forward passes in
    /// its compute dtype, results in its output dtype.
    fn with_policy(self, policy: &Policy) -> Self
    where
        Self: Sized,
    {
        let mut tower = policy.cast_params(self);
        tower.settings_mut().policy = *policy;
        tower.weights_changed();
        tower
    }

    /// The tower with Monte-Carlo dropout at `sites`, for its `forward_sampled` passes (its
    /// `forward` stays deterministic).
    fn with_dropout(mut self, sites: DropoutSites) -> Result<Self, VisionError>
    where
        Self: Sized,
    {
        self.settings_mut().dropout = sites.validate()?;
        Ok(self)
    }
}

/// What turns normalised pixels into embeddings, with or without Monte-Carlo dropout: what
/// kiln-mc's trial runner takes. [`crate::VisionModel`] is one (any [`Tower`] behind it:
/// `VisionModel::new(tower)`); a model kiln does not build can implement it too.
pub trait Embedder<B: Backend>: Sync {
    /// The embeddings `[batch, D]` of normalised `pixels` `[batch, 3, H, W]`, deterministic.
    fn embed(&self, pixels: Tensor<B, 4>) -> Tensor<B, 2>;

    /// The embeddings with Monte-Carlo dropout, masks from `draw` (one or the same number of
    /// samples per image, as [`Tower::forward_sampled`]).
    fn embed_sampled(&self, pixels: Tensor<B, 4>, draw: &Draw)
    -> Result<Tensor<B, 2>, VisionError>;

    /// Refuses pixels `[batch, channels, H, W]` the model cannot take.
    fn accepts(&self, dims: [usize; 4]) -> Result<(), VisionError>;
}

/// `tower` as a pass computes with it ([`kiln_transformer::in_compute_dtype`] under its own
/// policy), a copy's policy saying that its parameters are in the compute dtype now.
pub(crate) fn in_compute_dtype<B: Backend, T: Tower<B>>(tower: &T) -> Cow<'_, T> {
    let policy = tower.settings().policy;
    match kiln_transformer::in_compute_dtype(tower, &policy) {
        Cow::Owned(mut copy) => {
            copy.settings_mut().policy.param = policy.compute;
            Cow::Owned(copy)
        }
        borrowed => borrowed,
    }
}
