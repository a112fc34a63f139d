"""The main job: how many Monte-Carlo dropout passes are enough.

>>> from kiln.mc import run
>>> stats = run("dinov2-small/", "photos/", passes=[4, 8, 16], trials=4, dropout=0.1)
>>> stats["passes"], stats["rank_stability"]

For each pass count T, ``trials`` trials of T stochastic passes of the tower over every image
(decoded once into kiln's image cache), then between the trials: ``mean_variance`` (how much the
T-pass mean embedding still moves), ``uncertainty`` and ``uncertainty_spread`` (the per-image
variance and how much it moves) and ``rank_stability`` (mean pairwise Spearman correlation of the
per-image uncertainty). As ``examples/exp0_mc`` reports them.
"""

import os
import warnings

from kiln import _kiln
from kiln._paths import existing_dir

__all__ = ["run"]


def run(
    model_dir,
    images,
    passes=(4, 8, 16),
    trials=4,
    dropout=0.1,
    seed=0,
    batch=None,
    device="cpu",
    policy="full",
    cache_dir=None,
):
    """Runs the experiment; returns a dict of numpy arrays.

    - ``passes`` (int64 ``[P]``) and per pass count ``mean_variance``, ``uncertainty``,
      ``uncertainty_spread``, ``rank_stability`` (float64 ``[P]``);
    - ``mean``, ``variance`` (float64 ``[N, D]``): each image's embedding mean and variance over
      every pass of every trial of the largest pass count;
    - ``names``: the images in the order of those rows; ``seconds``: the trials' wall time.

    ``dropout``: a rate at every site (``0.1``) or kiln's site list
    (``"attention_probs=0.1,mlp_hidden=0.1"``). ``cache_dir``: where decoded images are kept
    (default ``$KILN_CACHE_DIR`` or ``~/.cache/kiln``).
    """
    stats = _kiln.run(
        existing_dir(model_dir, "model_dir"),
        existing_dir(images, "images"),
        [int(t) for t in passes],
        int(trials),
        str(dropout),
        int(seed),
        None if batch is None else int(batch),
        device,
        policy,
        None if cache_dir is None else os.fspath(cache_dir),
    )
    _warn_of_undefined_ranks(stats)
    return stats


def _warn_of_undefined_ranks(stats):
    """``rank_stability`` is NaN where no ranking exists: one image, or every image's
    uncertainty equal in a trial (no dropout). Say so rather than return NaN silently."""
    undefined = [int(t) for t, r in zip(stats["passes"], stats["rank_stability"]) if r != r]
    if not undefined:
        return
    images = len(stats["names"])
    why = (
        "one image has no ranking"
        if images < 2
        else "a trial gave every image the same uncertainty (no dropout, or a rate of 0?)"
    )
    warnings.warn(
        f"rank_stability is NaN at {undefined} passes: {why}; it needs at least two images "
        "whose uncertainties differ",
        RuntimeWarning,
        stacklevel=3,
    )
