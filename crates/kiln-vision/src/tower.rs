//! What every vision tower shares: where its checkpoint keys go, and how it runs (precision
//! policy, Monte-Carlo dropout sites).

use std::borrow::Cow;

use burn::module::Module;
use burn::tensor::backend::Backend;
use kiln_precision::cast_module;

use crate::VisionError;
use crate::pass::{Draw, DropoutSites, TowerSettings};

/// A vision tower that loads from Hugging Face checkpoints and runs under [`TowerSettings`].
pub trait Tower<B: Backend>: Module<B> {
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

/// `tower` as a pass computes with it: itself, or where the policy stores parameters in another
/// dtype than it computes in, a copy cast to the compute dtype (autocast's per-op weight casts,
/// done once per forward). The copy shares the tower's derived caches, which are keyed by dtype.
pub(crate) fn in_compute_dtype<B: Backend, T: Tower<B>>(tower: &T) -> Cow<'_, T> {
    let policy = tower.settings().policy;
    if policy.param == policy.compute {
        return Cow::Borrowed(tower);
    }
    let mut copy = cast_module(tower.clone(), policy.compute);
    copy.settings_mut().policy.param = policy.compute;
    Cow::Owned(copy)
}

/// Checks that a draw names one item per batch row.
pub(crate) fn check_draw(draw: &Draw<'_>, batch: usize) -> Result<(), VisionError> {
    if draw.items.len() == batch {
        Ok(())
    } else {
        Err(VisionError::Dropout(format!(
            "the draw names {} item(s) for a batch of {batch}",
            draw.items.len()
        )))
    }
}
