"""kiln.foveated.caption on kiln-foveated's caption fixture (fVLM's checkpoint of a tiny model
over kiln-foveated's DINOv2 fixture and an LM on kiln-text's fixture tokenizer, written by
scripts/fixtures/fvlm_release.py; kiln's generation from it is checked against fVLM's own
generate_captions.py in crates/kiln-foveated/tests/integration/caption.rs). Here: what the
Python call adds, the reading of clips from disk, checked by invariances."""

import numpy as np
import pytest
from conftest import ROOT
from PIL import Image

from kiln.foveated import caption

FIXTURE = ROOT / "crates/kiln-foveated/tests/fixtures"
MODEL = dict(
    checkpoint=FIXTURE / "caption", dino=FIXTURE / "dino", lm=FIXTURE / "caption/lm"
)


def frame(seed, width=20, height=20):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture
def clips(tmp_path):
    """A two-frame clip, a still image, and eight copies of that image as a frame folder."""
    root = tmp_path / "clips"
    (root / "moving").mkdir(parents=True)
    frame(1).save(root / "moving/000.png")
    frame(2).save(root / "moving/001.png")
    frame(3).save(root / "still.png")
    (root / "still_x8").mkdir()
    for t in range(8):
        frame(3).save(root / f"still_x8/{t:03}.png")
    return root


def test_each_clip_gets_a_caption_and_a_still_image_is_eight_frames(clips, tmp_path):
    cache = tmp_path / "cache"
    out = caption(**MODEL, clips=clips, max_new_tokens=12, cache_dir=cache)
    assert [line["clip"] for line in out] == ["moving", "still.png", "still_x8"]
    for line in out:
        assert isinstance(line["caption"], str) and 0 <= line["tokens"] <= 12
        assert line["seconds"] > 0
    # fVLM reads a still image as 8 copies of itself: the same frames as the folder of copies.
    assert out[1]["caption"] == out[2]["caption"] and out[1]["tokens"] == out[2]["tokens"]
    # Greedy decoding repeats; one clip file reads as that clip in the folder.
    again = caption(**MODEL, clips=clips / "still.png", max_new_tokens=12, cache_dir=cache)
    assert [again[0]["caption"]] == [out[1]["caption"]]
    sampled = dict(temperature=1.5, seed=3, max_new_tokens=12, cache_dir=cache)
    texts = lambda run: [line["caption"] for line in run]  # noqa: E731
    first = texts(caption(**MODEL, clips=clips, **sampled))
    assert first == texts(caption(**MODEL, clips=clips, **sampled))


def test_crop_and_squash_agree_on_a_square_frame(tmp_path):
    square = tmp_path / "square.png"
    frame(5, 30, 30).save(square)
    texts = [
        caption(**MODEL, clips=square, frame_fit=fit, max_new_tokens=8, cache_dir=tmp_path)[0]
        for fit in ("squash", "crop")
    ]
    assert texts[0]["caption"] == texts[1]["caption"]


def test_bad_arguments_are_errors(clips, tmp_path):
    with pytest.raises(FileNotFoundError, match="clips"):
        caption(**MODEL, clips=tmp_path / "absent")
    with pytest.raises(ValueError, match=r"\(--dino and --lm; from Python, dino= and lm=\)"):
        caption(FIXTURE / "caption", clips, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="frame_fit"):
        caption(**MODEL, clips=clips, frame_fit="stretch")
    with pytest.raises(ValueError, match="temperature"):
        caption(**MODEL, clips=clips, temperature=-1)
    with pytest.raises(ValueError, match="at least 1"):
        caption(**MODEL, clips=clips, frames=0)
