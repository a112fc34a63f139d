"""kiln.vision.embed against transformers (processor with the PIL backend, then the model) on
the same image files: crates/kiln-vision/tests/fixtures, written by scripts/fixtures/vision.py.
The bound is kiln-vision's own parity test's (1e-4 relative, max |Δ| / max |ref|)."""

import numpy as np
import pytest
from conftest import VISION, read_safetensors, relative
from PIL import Image

from kiln.vision import Encoder, embed, load

IMAGES = sorted((VISION / "images").iterdir())
TOWERS = [
    ("clip_vision", "images.image_embeds"),
    ("siglip_vision", "images.pooler_output"),
    ("dinov2", "images.pooler_output"),
]


@pytest.mark.parametrize("tower, output", TOWERS)
def test_files_embed_as_transformers_does(tower, output):
    expected = read_safetensors(VISION / f"{tower}.safetensors")[output]
    ours = embed(VISION / tower, IMAGES, batch=2)
    assert ours.dtype == np.float32
    assert ours.shape == expected.shape
    for i in range(len(IMAGES)):
        assert relative(ours[i], expected[i]) <= 1e-4, IMAGES[i].name


def test_arrays_embed_as_their_files_do():
    """uint8 (H, W, 3) arrays decoded by Pillow from the (lossless) PNGs give the files'
    embeddings; a non-contiguous view is read too."""
    encoder = load(VISION / "clip_vision")
    pngs = [p for p in IMAGES if p.suffix == ".png"]
    arrays = [np.asarray(Image.open(p).convert("RGB")) for p in pngs]
    from_files = encoder.embed([str(p) for p in pngs], 32)
    assert np.array_equal(embed(encoder, arrays), from_files)
    flipped = arrays[0][:, ::-1]
    assert not flipped.flags.c_contiguous
    assert np.array_equal(embed(encoder, [flipped]), embed(encoder, [flipped.copy()]))


def test_one_image_and_batches_of_any_size():
    encoder = Encoder(str(VISION / "dinov2"))
    all_at_once = embed(encoder, IMAGES, batch=32)
    one_by_one = np.concatenate([embed(encoder, p) for p in IMAGES])
    assert np.abs(all_at_once - one_by_one).max() <= 1e-5


@pytest.mark.parametrize("tower, output", TOWERS)
def test_no_images_embed_as_an_empty_array_of_the_embedding_width(tower, output):
    expected = read_safetensors(VISION / f"{tower}.safetensors")[output]
    empty = embed(VISION / tower, [])
    assert empty.shape == (0, expected.shape[1])
    assert empty.dtype == np.float32


def test_bad_images_are_errors(tmp_path):
    encoder = load(VISION / "clip_vision")
    with pytest.raises(FileNotFoundError, match="image 2"):
        embed(encoder, [IMAGES[0], tmp_path / "absent.png"])
    with pytest.raises(ValueError, match="image 1"):
        embed(encoder, [np.zeros((8, 8, 4), np.uint8)])
    with pytest.raises(ValueError, match=r"image 2: .*each side needs 1 to"):
        embed(encoder, [np.zeros((8, 8, 3), np.uint8), np.zeros((0, 8, 3), np.uint8)])
    with pytest.raises(ValueError, match="image 1"):
        embed(encoder, [42])
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes(b"not a png")
    with pytest.raises(ValueError, match="image 1"):
        embed(encoder, [corrupt])
    with pytest.raises(ValueError, match="batch"):
        embed(encoder, IMAGES, batch=0)


def test_bad_models_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        embed(tmp_path / "absent", IMAGES)
    with pytest.raises(FileNotFoundError, match="preprocessor_config.json"):
        embed(tmp_path, IMAGES)
    with pytest.raises(ValueError, match="policy"):
        load(VISION / "clip_vision", policy="fp7")
