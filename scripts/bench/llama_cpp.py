"""llama.cpp on a GGUF file, as `generate --model FILE.gguf` runs it: the prompt as a user turn of
the file's chat template, greedy decoding, the same threads; prints prefill and decode tokens/s,
the time to the first token, the whole run and peak resident memory, as JSON. With --tokens OUT
it also writes the greedy tokens of each prompt (ids after the prompt) for the parity check.

Needs llama-cpp-python built from source for this CPU (in its own virtual environment):

    python3 -m venv /work/venvs/llama
    CMAKE_ARGS="-DGGML_NATIVE=ON" /work/venvs/llama/bin/pip install llama-cpp-python
    /work/venvs/llama/bin/python scripts/bench/llama_cpp.py --model FILE.gguf \\
        --prompt "Explain why the sky is blue." --threads 2 --max-new-tokens 64

Time it against kiln back to back, interleaved (docs/PERFORMANCE.md):
    target/release/examples/generate --model FILE.gguf --chat --prompt "..." --max-new-tokens 64
"""

import argparse
import json
import resource
import sys
import time
from pathlib import Path

# This file shares the package's name: import the package, not this script.
HERE = Path(__file__).resolve().parent
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE]
from llama_cpp import Llama  # noqa: E402


def chat_tokens(llm, prompt):
    """The prompt as a user turn of the file's chat template, with the assistant's turn opened,
    tokenized as llama.cpp tokenizes a chat (no BOS of its own: the template writes what it
    needs)."""
    template = llm.metadata.get("tokenizer.chat_template")
    if template is None:
        return llm.tokenize(prompt.encode(), add_bos=True)
    from jinja2 import Template

    text = Template(template).render(
        messages=[{"role": "user", "content": prompt}], add_generation_prompt=True
    )
    return llm.tokenize(text.encode(), add_bos=False, special=True)


def stop_tokens(llm):
    """End of sequence, and `<|im_end|>` where the vocabulary has it as one token (as
    `generate --chat` stops)."""
    stops = {llm.token_eos()}
    end_of_turn = llm.tokenize(b"<|im_end|>", add_bos=False, special=True)
    if len(end_of_turn) == 1:
        stops.add(end_of_turn[0])
    return stops


def greedy(llm, tokens, max_new_tokens):
    """Prefill `tokens`, then up to `max_new_tokens` greedy tokens (stopping at end of
    generation); returns the tokens and the prefill and decode seconds."""
    stops = stop_tokens(llm)
    llm.reset()
    start = time.perf_counter()
    llm.eval(tokens)
    first = llm.sample(temp=0.0)
    prefilled = time.perf_counter()
    out = [first]
    while len(out) < max_new_tokens and out[-1] not in stops:
        llm.eval([out[-1]])
        out.append(llm.sample(temp=0.0))
    done = time.perf_counter()
    return out, prefilled - start, done - prefilled


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt", action="append", required=True, help="repeatable")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--tokens", help="write each prompt's greedy tokens to this JSON file")
    args = parser.parse_args()

    started = time.perf_counter()
    llm = Llama(
        model_path=args.model,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_ctx=2048,
        verbose=False,
    )
    loaded = time.perf_counter() - started
    runs = []
    for prompt in args.prompt:
        tokens = chat_tokens(llm, prompt)
        out, prefill, decode = greedy(llm, tokens, args.max_new_tokens)
        runs.append(
            {
                "prompt": prompt,
                "prompt_tokens": len(tokens),
                "generated": out,
                "prefill_tokens_per_s": len(tokens) / prefill,
                "decode_tokens_per_s": (len(out) - 1) / decode if len(out) > 1 else None,
                "first_token_s": prefill,
            }
        )
    report = {
        "model": args.model,
        "threads": args.threads,
        "load_s": loaded,
        "whole_s": time.perf_counter() - started,
        "peak_resident_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "runs": [{k: v for k, v in run.items() if k != "generated"} for run in runs],
    }
    print(json.dumps(report, indent=1))
    if args.tokens:
        with open(args.tokens, "w") as f:
            json.dump([{"prompt": r["prompt"], "tokens": r["generated"]} for r in runs], f)


if __name__ == "__main__":
    main()
