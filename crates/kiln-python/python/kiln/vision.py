"""Image embeddings with CLIP, SigLIP / SigLIP2 and DINOv2 checkpoints.

>>> import numpy as np
>>> from kiln.vision import embed
>>> images = ["cat.jpg", np.zeros((480, 640, 3), np.uint8)]
>>> embeddings = embed("clip-vit-base-patch32/", images)   # (2, 512) float32

Images are decoded (PNG, JPEG, WebP, BMP, GIF) and preprocessed by kiln exactly as the
checkpoint's Hugging Face processor (PIL backend) does. CLIP gives ``image_embeds``; SigLIP and
DINOv2 their ``pooler_output``.
"""

import os

import numpy as np

from kiln._kiln import Encoder
from kiln._paths import existing_dir

__all__ = ["Encoder", "embed", "load"]


def load(model_dir, device="cpu", policy="full"):
    """The tower in ``model_dir`` on ``device``, to embed many calls' images with one load."""
    return Encoder(existing_dir(model_dir, "model_dir"), device, policy)


def embed(model, images, batch=32, device="cpu", policy="full"):
    """The embeddings ``(N, D)`` float32 of ``images`` (paths or ``(H, W, 3)`` uint8 arrays).

    ``model``: a Hugging Face checkpoint directory (config.json, weights,
    preprocessor_config.json) or an :class:`Encoder` from :func:`load` (then ``device`` and
    ``policy`` are the encoder's). ``policy``: ``"full"`` (f32), ``"mixed-bf16"``, ``"mixed-f16"``...
    """
    if not isinstance(model, Encoder):
        model = load(model, device, policy)
    if isinstance(images, (str, os.PathLike, np.ndarray)) and not (
        isinstance(images, np.ndarray) and images.ndim == 4
    ):
        images = [images]
    return model.embed([os.fspath(i) if isinstance(i, os.PathLike) else i for i in images], batch)
