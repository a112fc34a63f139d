"""Text generation with Llama and Qwen2 checkpoints.

>>> from kiln.text import generate, load
>>> model = load("SmolLM2-135M-Instruct/")
>>> generate(model, "What is the capital of France?", chat=True, max_new_tokens=32)
"""

from kiln._kiln import LanguageModel
from kiln._paths import existing_dir

__all__ = ["LanguageModel", "generate", "load"]


def load(model_dir, device="cpu", policy="full"):
    """The checkpoint in ``model_dir`` (config.json, weights, tokenizer.json) on ``device``."""
    return LanguageModel(existing_dir(model_dir, "model_dir"), device, policy)


def generate(
    model,
    prompt,
    max_new_tokens=64,
    temperature=0.0,
    top_p=1.0,
    seed=0,
    chat=False,
    device="cpu",
    policy="full",
):
    """The continuation of ``prompt`` (a string, or a list of strings generated as one batch).

    ``model``: a checkpoint directory or a :class:`LanguageModel` from :func:`load`. Greedy at
    ``temperature`` 0 (the default), else sampled with nucleus ``top_p`` from ``seed``. With
    ``chat``, each prompt is wrapped as a user turn in the checkpoint's chat template. Stops at
    the checkpoint's end-of-sequence token or after ``max_new_tokens``.
    """
    if not isinstance(model, LanguageModel):
        model = load(model, device, policy)
    single = isinstance(prompt, str)
    prompts = [prompt] if single else list(prompt)
    out = model.generate(prompts, max_new_tokens, temperature, top_p, seed, chat)
    return out[0] if single else out
