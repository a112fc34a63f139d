"""PyTorch (transformers) speed of the SmolLM2-135M shape, for docs/PERFORMANCE.md.

Same work as `cargo bench --bench text`: a randomly initialised LlamaForCausalLM of
HuggingFaceTB/SmolLM2-135M's configuration (speed does not depend on the weights), fp32 unless `--dtype` says otherwise, under
`torch.inference_mode()`, the same thread count (CPU) or GPU (`--device cuda`, timed between
`torch.cuda.synchronize()` calls), sdpa attention (transformers' default). On a GPU, `--tf32`
allows TF32 as burn's CUDA backend does, and `--dtype bf16` runs the model in bfloat16:

- prefill: one forward of a 512-token prompt per sequence, batch 1 and 8, the last token's
  logits only (`logits_to_keep=1`, as `generate` runs its prefill); tokens/s = batch · 512 / s;
- decode: after a 128-token prompt, 32 steps of one token per sequence through the
  `DynamicCache`, batch 1 and 8, the last logits each step; tokens/s = batch · 32 / s.

Prints one line per figure: median seconds over the timed runs and tokens/s, and with `--json`
the same as JSON.

    /work/venvs/hf/bin/python scripts/bench/text_torch.py --threads 2 [--runs 5]
    python3 scripts/bench/text_torch.py --device cuda --tf32 [--dtype bf16]

Requirements: scripts/fixtures/requirements-hf.txt (torch, transformers).
"""

import argparse
import json
import statistics
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

PROMPT, DECODE_PROMPT, DECODE_STEPS = 512, 128, 32


def smollm2_135m():
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_theta=100000.0,
            tie_word_embeddings=True,
            attn_implementation="sdpa",
        )
    )


def timed(run, runs, sync):
    run()  # warm-up
    times = []
    for _ in range(runs):
        sync()
        start = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="f32 matrix products on TF32 tensor cores (as burn's CUDA backend)",
    )
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    device = torch.device(args.device)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    model = smollm2_135m().to(device, dtype).eval()
    vocab = model.config.vocab_size
    results = []
    with torch.inference_mode():
        for batch in (1, 8):
            ids = torch.randint(0, vocab, (batch, PROMPT), device=device)
            seconds = timed(lambda: model(input_ids=ids, logits_to_keep=1), args.runs, sync)
            results.append(("prefill", batch, seconds, batch * PROMPT / seconds))

            prompt = torch.randint(0, vocab, (batch, DECODE_PROMPT), device=device)
            steps = torch.randint(0, vocab, (batch, DECODE_STEPS), device=device)

            def decode():
                cache = DynamicCache(config=model.config)
                model(input_ids=prompt, past_key_values=cache, logits_to_keep=1)
                sync()
                start = time.perf_counter()
                for step in range(DECODE_STEPS):
                    model(input_ids=steps[:, step : step + 1], past_key_values=cache, logits_to_keep=1)
                sync()
                return time.perf_counter() - start

            decode()  # warm-up
            seconds = statistics.median(decode() for _ in range(args.runs))
            results.append(("decode", batch, seconds, batch * DECODE_STEPS / seconds))
    for kind, batch, seconds, rate in results:
        print(f"smollm2_135m/{kind},b={batch} ({args.dtype}): median {seconds:.4f} s, {rate:.1f} tokens/s")
    if args.json:
        print(json.dumps([dict(kind=k, batch=b, seconds=s, tokens_per_s=r) for k, b, s, r in results]))


if __name__ == "__main__":
    main()
