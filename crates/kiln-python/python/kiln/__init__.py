"""kiln from Python: kiln's Rust models with numpy in and numpy out.

- :mod:`kiln.forcefield`: an ASE calculator for PaiNN potentials (kiln-trained or schnetpack).
- :mod:`kiln.vision`: image embeddings with CLIP, SigLIP / SigLIP2 and DINOv2 checkpoints.
- :mod:`kiln.mc`: the main job's Monte-Carlo statistics over a folder of images.
- :mod:`kiln.text`: generation with Llama and Qwen2 checkpoints.
- :mod:`kiln.foveated`: captions of clips with a foveated video-language model (fVLM).

Every computation runs in Rust with the interpreter's lock released. Devices are named as
kiln's examples name them: ``"cpu"`` in the default build, ``"wgpu"`` / ``"cuda"`` in builds
with those features.
"""

from kiln._kiln import __version__

__all__ = ["__version__", "forcefield", "foveated", "mc", "text", "vision"]


def __getattr__(name):
    # Submodules load on first use, so `import kiln` needs neither ASE nor anything else.
    if name in ("forcefield", "foveated", "mc", "text", "vision"):
        import importlib

        return importlib.import_module(f"kiln.{name}")
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
