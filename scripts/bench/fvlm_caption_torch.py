"""fVLM's own caption generation, timed: `generate_captions.py`'s `main()` from a checkout,
run unchanged, on the work of kiln's `foveated_caption/release` bench.

`main()` hard-codes its tokenizer, model, checkpoint and shard paths; they are answered in
memory, as scripts/fixtures/fvlm_release.py answers them: the tokenizer is kiln-text's fixture
tokenizer (its ChatML template; kiln's bench encodes the same question with it), the model
fVLM's `FoveatedVLM` on DINOv2-S at 224 px and SmolLM2-135M of random weights (fp32, as the
script runs on a CPU: its `autocast("cuda")` is off there), the checkpoint that model's own
state dict, and the shards one sample of 16 random frames with fVLM's caption prompt. Random
weights never choose the end token, so a forward hook on `lm_head` makes the 32nd LM forward
after the frames choose it: the script's loop then stops having run the prompt and 31 single
tokens, the 32 LM forwards of kiln's 32 new tokens.

Each caption is timed from the script's `_encode_all_frames` call to its `tokenizer.decode`
(frames already tensors on both sides); `--rounds` captions after `--warmup`, one `main()`
each. Prints ms per caption per round, the median and a JSON line (also `--json PATH`).

    KILN_FVLM_DIR=/path/to/nanoSmol/fVLM /work/venvs/fvlm/bin/python \\
        scripts/bench/fvlm_caption_torch.py --threads 2 --warmup 1 --rounds 5

Requirements: scripts/fixtures/requirements-fvlm.txt (a git checkout of fVLM at bb7ea3e).
"""

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/bench"))
sys.path.insert(0, str(ROOT / "scripts/fixtures"))
from foveated_torch import WORKLOADS, save_fvlm_backbones  # noqa: E402

FRAMES, TOKENS = 16, 32
PROMPT = "Write a brief caption for this video."


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fvlm-dir", type=Path, default=os.environ.get("KILN_FVLM_DIR"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.fvlm_dir is None or not (args.fvlm_dir / "generate_captions.py").is_file():
        sys.exit("set --fvlm-dir (or KILN_FVLM_DIR) to a checkout's fVLM/ folder")
    from fvlm_release import check_checkout, tiny_tokenizer

    check_checkout(str(args.fvlm_dir))
    sys.path.insert(0, str(args.fvlm_dir))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    import generate_captions
    import model as fvlm_model

    folder = tempfile.TemporaryDirectory()
    dino_dir, lm_dir = save_fvlm_backbones(Path(folder.name))
    tokenizer = tiny_tokenizer()
    built = fvlm_model.FoveatedVLM(
        llm_name=str(lm_dir), dino_name=str(dino_dir), query_dim=WORKLOADS["fvlm"]["query_dim"],
        deep_query=True,
    ).float().eval()
    folder.cleanup()
    state = built.state_dict()
    side = WORKLOADS["fvlm"]["dino"]["image_size"]

    calls, started, seconds = [0], [0.0], []

    def force_end(_module, _inputs, output):
        calls[0] += 1
        if calls[0] == TOKENS:
            output[..., tokenizer.eos_token_id] = float("inf")
        return output

    built.llm.lm_head.register_forward_hook(force_end)
    encode = built._encode_all_frames

    def timed_encode(*a, **kw):
        calls[0] = 0
        started[0] = time.perf_counter()
        return encode(*a, **kw)

    built._encode_all_frames = timed_encode
    decode = tokenizer.decode

    def timed_decode(ids, **kw):
        seconds.append(time.perf_counter() - started[0])
        assert calls[0] == TOKENS, f"{calls[0]} LM forwards"
        return decode(ids, **kw)

    tokenizer.decode = timed_decode

    class Tokenizers:
        @staticmethod
        def from_pretrained(_path):
            return tokenizer

    def sample():
        frames = torch.randn(FRAMES, 3, side, side)
        return {"frames": frames, "gt_caption": "-", "source": "openvid", "user_prompt": PROMPT,
                "key": "000000", "num_frames": FRAMES}

    generate_captions.AutoTokenizer = Tokenizers
    fvlm_model.FoveatedVLM = lambda **_kw: built
    torch.load = lambda _path, **_kw: {"model_state_dict": state, "step": "bench"}
    generate_captions.load_samples_from_tar = lambda path, n: (
        [sample()] if "vript" in str(path) else []
    )
    for _ in range(args.warmup + args.rounds):
        with contextlib.redirect_stdout(io.StringIO()):
            generate_captions.main()
    rounds = [1000 * s for s in seconds[args.warmup:]]
    for ms in rounds:
        print(f"caption: {ms:.1f} ms", flush=True)
    result = {
        "workload": f"fvlm_caption,T={FRAMES},tokens={TOKENS}",
        "threads": args.threads,
        "torch": torch.__version__,
        "ms_per_caption_rounds": rounds,
        "median_ms_per_caption": statistics.median(rounds),
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
