"""PyTorch training throughput of the foveated model, on the work of kiln's `foveated` bench.

The model is fVLM's two-pass computation as kiln-foveated implements it, written in PyTorch in
scripts/fixtures/foveated.py (the parity fixtures' reference, imported from there): every frame
through a transformers `Dinov2Model` once (patch features and each layer's keys and values), a
query reading one token per frame (shallow or deep readout), the coarse pass through a
transformers `LlamaForCausalLM` with `q_static`, the fine pass with queries made from the coarse
pass's states, loss = fine + λ·coarse (λ = 1). Random weights, fp32 on the CPU, SDPA attention
in both backbones.

Each step: forward of both passes, backward, `clip_grad_norm_(…, 1.0)`, AdamW, `zero_grad`, the
loss read back as a Python float (as kiln's trainer reads it for metrics.jsonl). Workloads (the
`foveated` bench's, same shapes and optimizer):

- `synthetic`: the `foveated_synthetic` example's model and batch on 3×3 boards (between its
  2×2 start and 4×4 boards) — DINOv2 8 wide, 2 layers, 2 heads, 18 px frames in 6 px patches; an LM 64 wide, 2
  layers, 4 query and 2 key-value heads, MLP 128, vocabulary 16; 16-wide queries, shallow readout, a 16-class
  per-frame head (the example's has 24); 16 clips of 4 frames, a one-token caption; AdamW lr 2e-3, weight decay 0.01 on
  every parameter.
- `fvlm`: fVLM's shapes — DINOv2-S at 224 px, SmolLM2-135M, 384-wide queries, deep readout,
  2 clips of 8 frames, a 16-token prompt and a 32-token caption, no per-frame head; AdamW with
  fVLM's groups (connectors lr 1e-3, backbones 1e-5; weight decay 0.01 except on biases, norms
  and LayerScale).

With `--optimizer-only`, a step is `AdamW.step()` alone over the workload's parameters, each
given a fixed random gradient (kiln's `adamw/dinov2_s+smollm2_135m` row for `fvlm`).

`--warmup` steps run untimed, then `--rounds` rounds of `--steps-per-round` steps are timed;
prints ms per step per round, their median, and a final JSON line (also `--json PATH`). Each
step's `.item()` waits for the device, so the clock covers the work on a GPU too.

    /work/venvs/hf/bin/python scripts/bench/foveated_torch.py --threads 2 --workload synthetic
    /work/venvs/hf/bin/python scripts/bench/foveated_torch.py --threads 2 --workload fvlm \
        --warmup 1 --rounds 3 --steps-per-round 1
    /work/venvs/hf/bin/python scripts/bench/foveated_torch.py --threads 2 --workload fvlm \
        --optimizer-only --warmup 2 --rounds 5 --steps-per-round 2
    python3 scripts/bench/foveated_torch.py --device cuda --tf32 --workload fvlm   # on a GPU

Requirements: scripts/fixtures/requirements-hf.txt (torch, transformers).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import Dinov2Config, Dinov2Model, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from foveated import Connectors, two_passes  # noqa: E402

WORKLOADS = {
    "synthetic": {
        "dino": dict(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, image_size=18,
                     patch_size=6),
        "lm": dict(vocab_size=16, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2),
        "query_dim": 16, "readout": "shallow", "classes": 16,
        "clips": 16, "frames": 4, "prompt": 0, "caption": 1,
        "groups": None, "lr": 2e-3,
    },
    "fvlm": {
        "dino": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, image_size=224,
                     patch_size=14),
        "lm": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                   num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3),
        "query_dim": 384, "readout": "deep", "classes": 0,
        "clips": 2, "frames": 8, "prompt": 16, "caption": 32,
        "groups": (1e-3, 1e-5), "lr": None,
    },
}


def build(workload):
    w = WORKLOADS[workload]
    dino = Dinov2Model(Dinov2Config(mlp_ratio=4, layerscale_value=1.0, **w["dino"]))
    lm = LlamaForCausalLM(LlamaConfig(
        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True, **w["lm"],
    ))
    connectors = Connectors(dino.config.hidden_size, lm.config.hidden_size, w["query_dim"],
                            w["classes"])
    return w, dino.train(), lm.train(), connectors.train()


def optimizer(w, dino, lm, connectors):
    if w["groups"] is None:
        params = [*dino.parameters(), *lm.parameters(), *connectors.parameters()]
        return torch.optim.AdamW(params, lr=w["lr"], weight_decay=0.01)
    connector_lr, backbone_lr = w["groups"]

    def split(module, lr):
        named = list(module.named_parameters())
        no_decay = [p for n, p in named if p.dim() < 2]  # biases, norms, LayerScale, tokens
        decay = [p for n, p in named if p.dim() >= 2]
        return [dict(params=decay, lr=lr, weight_decay=0.01),
                dict(params=no_decay, lr=lr, weight_decay=0.0)]

    return torch.optim.AdamW(
        split(dino, backbone_lr) + split(lm, backbone_lr) + split(connectors, connector_lr)
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="synthetic")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--tf32", action="store_true", help="TF32 products on a GPU")
    parser.add_argument("--optimizer-only", action="store_true",
                        help="time AdamW.step() alone, with fixed gradients")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(0)
    device = torch.device(args.device)

    w, dino, lm, connectors = build(args.workload)
    dino, lm, connectors = dino.to(device), lm.to(device), connectors.to(device)
    params = [*dino.parameters(), *lm.parameters(), *connectors.parameters()]
    adamw = optimizer(w, dino, lm, connectors)
    clips, frames = w["clips"], w["frames"]
    side = w["dino"]["image_size"]
    vocab = w["lm"]["vocab_size"]
    pixels = torch.randn(clips * frames, 3, side, side, device=device)
    prompt = torch.randint(0, vocab, (clips, w["prompt"]), device=device)
    caption = torch.randint(0, vocab, (clips, w["caption"]), device=device)
    frame_targets = None
    if w["classes"]:
        frame_targets = torch.randint(0, w["classes"], (clips, frames), device=device)
        frame_targets[:, 0] = -100

    def step():
        passes = two_passes(dino, lm, connectors, w["readout"], pixels, prompt, caption,
                            frame_targets, 1.0, heads=1)
        loss = passes["loss"].sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        adamw.step()
        adamw.zero_grad(set_to_none=True)
        return loss.item()

    if args.optimizer_only:
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3

        def step():  # noqa: F811
            adamw.step()
            return 0.0

    for _ in range(args.warmup):
        step()
    rounds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps_per_round):
            step()
        ms = 1000 * (time.perf_counter() - start) / args.steps_per_round
        rounds.append(ms)
        print(f"{args.workload}: {ms:.2f} ms per step", flush=True)
    result = {
        "workload": args.workload,
        "threads": args.threads,
        "device": args.device,
        "tf32": args.tf32,
        "optimizer_only": args.optimizer_only,
        "torch": torch.__version__,
        "ms_per_step_rounds": rounds,
        "median_ms_per_step": statistics.median(rounds),
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
