"""fVLM's checkpoints to and from what kiln reads: a directory holding `model.safetensors`.

fVLM's `train.py` saves a `.pt` dict whose `model_state_dict` is `FoveatedVLM.state_dict()`
(fVLM's names: `encoder.dino.*`, `encoder.query_input_proj.weight`, `encoder.output_proj.*`,
`q_static` [1, query_dim], `q_init`, `dino_to_llm.*`, `llm_to_query.*`, `llm.*`); a bare state
dict works too. kiln loads the directory with `FoveatedModel::with_fvlm_weights` and writes one
with `FoveatedModel::save_fvlm`; `--to-pt` turns that back into the dict fVLM's `init_from`
loads (`model_state_dict` only).

    python scripts/fvlm_checkpoint.py CHECKPOINT.pt OUT_DIR           # fVLM → kiln
    python scripts/fvlm_checkpoint.py --to-pt KILN_DIR CHECKPOINT.pt   # kiln → fVLM

Needs torch and safetensors (any of the repository's fixture environments has both).
"""

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def to_kiln(checkpoint: Path, out: Path) -> None:
    loaded = torch.load(checkpoint, map_location="cpu", weights_only=False)
    state = loaded.get("model_state_dict", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        sys.exit(f"{checkpoint}: neither fVLM's checkpoint dict nor a state dict")
    # torch.compile's wrapper prefix, as fVLM's own loader strips it.
    tensors = {k.replace("._orig_mod", ""): v.detach().contiguous() for k, v in state.items()}
    # Tied weights share storage, which safetensors refuses: each gets its own copy.
    tensors = {k: v.clone() for k, v in tensors.items()}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors")
    print(f"{out / 'model.safetensors'}: {len(tensors)} tensors")


def to_pt(directory: Path, checkpoint: Path) -> None:
    state = load_file(directory / "model.safetensors")
    torch.save({"model_state_dict": state}, checkpoint)
    print(f"{checkpoint}: {len(state)} tensors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to-pt", action="store_true", help="kiln's directory → fVLM's .pt")
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args()
    if args.to_pt:
        to_pt(args.source, args.target)
    else:
        to_kiln(args.source, args.target)


if __name__ == "__main__":
    main()
