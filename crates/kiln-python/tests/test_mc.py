"""kiln.mc.run: the main job's statistics. Without dropout every pass is the plain forward, so
the T-pass mean is kiln.vision.embed's embedding and every variance is zero; with dropout the
statistics have their shapes and the per-image variance is positive."""

import warnings

import numpy as np
import pytest
from conftest import VISION

from kiln.mc import run
from kiln.vision import embed

MODEL = VISION / "clip_vision"
IMAGES = VISION / "images"


def test_without_dropout_the_mean_is_the_embedding(tmp_path):
    with pytest.warns(RuntimeWarning, match=r"rank_stability is NaN at \[2, 3\] passes"):
        stats = run(MODEL, IMAGES, passes=[2, 3], trials=2, dropout=0, cache_dir=tmp_path)
    assert np.isnan(stats["rank_stability"]).all()
    plain = embed(MODEL, sorted(IMAGES.iterdir()))
    assert stats["names"] == ["gray.png", "photo.jpg", "wide.png"]
    assert np.abs(stats["mean"] - plain).max() <= 1e-5 * np.abs(plain).max()
    assert np.abs(stats["variance"]).max() <= 1e-10
    assert np.abs(stats["uncertainty"]).max() <= 1e-10


def test_with_dropout(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ranks exist: no warning
        stats = run(MODEL, IMAGES, passes=(2, 4), trials=3, dropout=0.2, seed=7, cache_dir=tmp_path)
    assert list(stats["passes"]) == [2, 4]
    for key in ("mean_variance", "uncertainty", "uncertainty_spread", "rank_stability"):
        assert stats[key].shape == (2,)
    assert stats["mean"].shape == stats["variance"].shape == (3, 24)
    assert (stats["uncertainty"] > 0).all()
    assert (stats["variance"] > 0).any()
    assert stats["seconds"] > 0
    again = run(MODEL, IMAGES, passes=(2, 4), trials=3, dropout=0.2, seed=7, cache_dir=tmp_path)
    assert np.array_equal(again["mean"], stats["mean"])


def test_bad_arguments_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="images"):
        run(MODEL, tmp_path / "absent", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="trials"):
        run(MODEL, IMAGES, trials=1, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="passes"):
        run(MODEL, IMAGES, passes=[0], cache_dir=tmp_path)
    with pytest.raises(ValueError, match="dropout"):
        run(MODEL, IMAGES, dropout="lots", cache_dir=tmp_path)


def test_bad_models_are_errors_as_in_embed(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        run(empty, IMAGES, cache_dir=tmp_path)
    (empty / "config.json").write_bytes((MODEL / "config.json").read_bytes())
    with pytest.raises(FileNotFoundError, match="preprocessor_config.json"):
        run(empty, IMAGES, cache_dir=tmp_path)
    (empty / "config.json").write_text("{")
    with pytest.raises(ValueError, match="config.json"):
        run(empty, IMAGES, cache_dir=tmp_path)


def test_the_cache_is_never_written_among_the_images(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for item in IMAGES.iterdir():
        (images / item.name).write_bytes(item.read_bytes())
    for cache in (images, images / "cache"):
        with pytest.raises(ValueError, match="the images"):
            run(MODEL, images, passes=[2], trials=2, dropout=0, cache_dir=cache)
    assert sorted(p.name for p in images.iterdir()) == sorted(p.name for p in IMAGES.iterdir())
