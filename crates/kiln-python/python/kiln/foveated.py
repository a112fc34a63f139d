"""Captions of clips with a foveated video-language model (fVLM), on fVLM's inference path.

>>> from kiln.foveated import caption
>>> caption("runs/fvlm/model", "clips/")  # a model foveated_train saved
[{'clip': 'dog.gif', 'caption': 'A dog runs across a field.', 'tokens': 8, 'seconds': 0.9}]
>>> caption("fvlm-135m/", "dog.mp4", dino="dinov2-small/", lm="SmolLM2-135M-Instruct/")

As fVLM's ``generate_captions.py`` makes them (``examples/foveated_caption`` is the same from
the command line): each clip read one frame a second, at most ``frames``, squashed to DINOv2's
size (``frame_fit="crop"`` reads frames as fVLM's training shards were made); a still image
becomes ``still_frames`` copies of itself; frame t + 1's query comes from the LM's state after
frame t; then fVLM's question (its system prompt and ``prompt`` as the user's turn) and up to
``max_new_tokens`` tokens, each one LM step, greedy unless ``temperature`` is above 0.
"""

import os

from kiln import _kiln
from kiln._paths import existing_dir

__all__ = ["FVLM_CAPTION_PROMPT", "caption"]

#: fVLM's user prompt for captions.
FVLM_CAPTION_PROMPT = "Write a brief caption for this video."


def caption(
    checkpoint,
    clips,
    prompt=FVLM_CAPTION_PROMPT,
    max_new_tokens=200,
    dino=None,
    lm=None,
    frames=64,
    frame_fit="squash",
    still_frames=8,
    temperature=0.0,
    top_p=1.0,
    seed=0,
    device="cpu",
    policy="full",
    cache_dir=None,
):
    """The caption of every clip below the folder ``clips`` (frame folders, GIFs, MP4 in builds
    with video decoding, still images), or of the one clip file ``clips``: a list of dicts
    ``{"clip", "caption", "tokens", "seconds"}`` in the clips' order.

    ``checkpoint``: a model ``foveated_train`` saved (its ``model/`` directory, the LM's
    tokenizer beside it; ``lm`` for one saved without it), or fVLM's own checkpoint directory
    (``model.safetensors`` in fVLM's names) with ``dino`` and ``lm``, the Hugging Face
    directories it was trained from. ``cache_dir``: where decoded clips are kept (default
    ``$KILN_CACHE_DIR`` or ``~/.cache/kiln``).
    """
    optional = lambda path, what: None if path is None else existing_dir(path, what)  # noqa: E731
    rows = _kiln.caption(
        existing_dir(checkpoint, "checkpoint"),
        os.fspath(clips),
        str(prompt),
        int(max_new_tokens),
        optional(dino, "dino"),
        optional(lm, "lm"),
        int(frames),
        str(frame_fit),
        int(still_frames),
        float(temperature),
        float(top_p),
        int(seed),
        device,
        policy,
        None if cache_dir is None else os.fspath(cache_dir),
    )
    return [
        {"clip": name, "caption": text, "tokens": tokens, "seconds": seconds}
        for name, text, tokens, seconds in rows
    ]
