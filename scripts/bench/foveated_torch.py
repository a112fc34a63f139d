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

- `release`: fVLM's own `FoveatedVLM` (`model.py`, imported from a checkout: `--fvlm-dir`, or
  `$KILN_FVLM_DIR`; needs transformers 4, scripts/fixtures/requirements-fvlm.txt) on the `fvlm`
  shapes, random weights saved as Hugging Face directories in a temporary folder, the LM cast to
  fp32 as fVLM runs on the CPU; its training step `forward_coarse_fine` with λ_coarse = 0 (the
  coarse LM over the 8 visual tokens alone), 48 text tokens scored (`loss_mask=None`), AdamW over
  its `get_param_groups` (connectors 1e-3, DINOv2 and the LM 1e-5, weight decay 0.01 on every
  parameter). kiln's `release` row runs `FoveatedConfig::release()` on the same.

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
    /work/venvs/fvlm/bin/python scripts/bench/foveated_torch.py --threads 2 --workload release \
        --fvlm-dir /path/to/nanoSmol/fVLM --warmup 1 --rounds 3 --steps-per-round 1 [--bf16]
    python3 scripts/bench/foveated_torch.py --device cuda --tf32 --workload fvlm   # on a GPU

Requirements: scripts/fixtures/requirements-hf.txt (torch, transformers); for `release`,
scripts/fixtures/requirements-fvlm.txt.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
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


def save_fvlm_backbones(folder: Path):
    """DINOv2-S (224 px) and SmolLM2-135M of random weights as Hugging Face directories in
    `folder`: what fVLM's `FoveatedVLM(llm_name=…, dino_name=…)` loads."""
    w = WORKLOADS["fvlm"]
    dino_dir, lm_dir = folder / "dino", folder / "lm"
    Dinov2Model(Dinov2Config(mlp_ratio=4, layerscale_value=1.0, **w["dino"])).save_pretrained(
        dino_dir
    )
    LlamaForCausalLM(LlamaConfig(
        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True, **w["lm"],
    )).save_pretrained(lm_dir)
    return dino_dir, lm_dir


def release_step(fvlm_dir: Path, device, params_out, bf16=False):
    """fVLM's own model on the `fvlm` shapes and its training step (see the module's doc), the
    forward under `torch.autocast(bfloat16)` with `bf16` (fp32 weights, bf16 products)."""
    sys.path.insert(0, str(fvlm_dir))
    from model import FoveatedVLM

    w = WORKLOADS["fvlm"]
    folder = tempfile.TemporaryDirectory()
    dino_dir, lm_dir = save_fvlm_backbones(Path(folder.name))
    model = FoveatedVLM(
        llm_name=str(lm_dir), dino_name=str(dino_dir), query_dim=w["query_dim"],
        visual_scale=0.14, lambda_coarse=0.0, deep_query=True,
    ).float().to(device).train()
    folder.cleanup()
    groups = model.get_param_groups(lr_backbone=1e-5, lr_connector=1e-3)
    adamw = torch.optim.AdamW(groups, weight_decay=0.01)
    params = list(model.parameters())
    params_out.extend(params)
    clips, frames, text = w["clips"], w["frames"], w["prompt"] + w["caption"]
    side = w["dino"]["image_size"]
    pixels = torch.randn(clips, frames, 3, side, side, device=device)
    ids = torch.randint(0, w["lm"]["vocab_size"], (clips, text), device=device)
    attention = torch.ones(clips, text, dtype=torch.long, device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model.forward_coarse_fine(pixels, ids, attention)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        adamw.step()
        adamw.zero_grad(set_to_none=True)
        return loss.item()

    return step, adamw


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


def two_pass_step(workload, device):
    """The parity fixtures' PyTorch model on `workload` and its training step."""
    w, dino, lm, connectors = build(workload)
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

    return step, adamw, params


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", choices=sorted([*WORKLOADS, "release"]), default="synthetic")
    parser.add_argument("--fvlm-dir", type=Path, default=os.environ.get("KILN_FVLM_DIR"),
                        help="a checkout's fVLM/ folder (the release workload)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--tf32", action="store_true", help="TF32 products on a GPU")
    parser.add_argument("--bf16", action="store_true",
                        help="the release step's forward under torch.autocast(bfloat16), as a "
                             "careful user runs it where the CPU has bf16 units")
    parser.add_argument("--optimizer-only", action="store_true",
                        help="time AdamW.step() alone, with fixed gradients")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(0)
    device = torch.device(args.device)

    if args.workload == "release":
        if args.fvlm_dir is None or not (args.fvlm_dir / "model.py").is_file():
            sys.exit("the release workload needs --fvlm-dir (or KILN_FVLM_DIR): fVLM/ of a checkout")
        params = []
        step, adamw = release_step(args.fvlm_dir, device, params, args.bf16)
    else:
        if args.bf16:
            sys.exit("--bf16 is for the release workload")
        step, adamw, params = two_pass_step(args.workload, device)

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
        "bf16": args.bf16,
        "torch": torch.__version__,
        "ms_per_step_rounds": rounds,
        "median_ms_per_step": statistics.median(rounds),
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
