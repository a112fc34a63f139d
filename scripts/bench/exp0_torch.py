"""The main job (exp0) in PyTorch, as a careful user writes it, for docs/PERFORMANCE.md.

The same work as `cargo run --release --example exp0_mc -- --model clip-b32 --images DIR
--passes 4,8 --trials 2 --dropout 0.1`: for every pass count T and each of K trials, T
Monte-Carlo passes of every image through a vision tower with dropout active, the embedding's
mean and variance per image accumulated in f64 (Welford, merged per batch with Chan's update), and
the statistics across trials that exp0 reports (kiln-mc's `NestedStats`). What the seed project's
optimisations already give it:
- pixels precomputed once (the model's transformers image processor over the whole folder) and
  kept on the device as one tensor; no image is opened inside the loop;
- large batches: rows of m images × r passes (image-major, `--batch` rows, 64 by default as
  kiln's host batches), each image's pixels repeated r times;
- `torch.inference_mode()`, the thread count fixed.

Models: transformers `CLIPVisionModelWithProjection` (the embedding is `image_embeds`) and
`Dinov2Model` (`pooler_output`) at the released sizes (openai/clip-vit-base-patch32,
facebook/dinov2-small), randomly initialised from `--seed`, or `--model-dir` for a checkpoint.
Dropout `p` at kiln's four sites (kiln-vision's `DropoutSites::all(p)`): after the embeddings,
on the attention probabilities, on the attention output projection, and on the MLP's hidden
activations. transformers' (5.23) configs cover some of them (CLIP: `attention_dropout`;
DINOv2: `attention_probs_dropout_prob`, and `hidden_dropout_prob` after the embeddings); forward
hooks add the rest, and `model.train()` turns them on (these towers have no batch norm, so
nothing else changes).

Timing: the trial loop only (a warm-up batch first; the pixels' preprocessing is reported
apart), as exp0's `timings_s.wall`. Prints one row per T and a final JSON line.

    /work/venvs/hf/bin/python scripts/bench/exp0_torch.py --images results/exp0/images \\
        --model clip-b32 --passes 4,8 --trials 2 --dropout 0.1 --threads 2

Requirements: scripts/fixtures/requirements-hf.txt (torch, transformers, Pillow, numpy).
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import (
    AutoConfig,
    AutoImageProcessor,
    BitImageProcessor,
    CLIPImageProcessor,
    CLIPVisionModelWithProjection,
    Dinov2Model,
)

import vision_torch  # the released configurations, beside this script

EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}


def clip_b32_preset(p):
    return vision_torch.clip_b32(attention_dropout=p), CLIPImageProcessor()


def dinov2_s_preset(p):
    model = vision_torch.dinov2_s(hidden_dropout_prob=p, attention_probs_dropout_prob=p)
    processor = BitImageProcessor(
        size={"shortest_edge": 256},
        crop_size={"height": 224, "width": 224},
        do_center_crop=True,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
        resample=3,
    )
    return model, processor


PRESETS = {"clip-b32": clip_b32_preset, "dinov2-s": dinov2_s_preset}


def from_checkpoint(folder, p):
    """A CLIP or DINOv2 checkpoint directory, with dropout `p` in the config's own sites."""
    kind = AutoConfig.from_pretrained(folder).model_type
    if kind in ("clip", "clip_vision_model"):
        model = CLIPVisionModelWithProjection.from_pretrained(folder, attention_dropout=p)
    elif kind == "dinov2":
        model = Dinov2Model.from_pretrained(
            folder, hidden_dropout_prob=p, attention_probs_dropout_prob=p
        )
    else:
        raise SystemExit(f"{folder}: a {kind} checkpoint; this script runs CLIP and DINOv2")
    return model, AutoImageProcessor.from_pretrained(folder)


def dropout_hook(p):
    def hook(_module, _inputs, output):
        return F.dropout(output, p, training=True)

    return hook


def add_dropout(model, p):
    """Hooks for the sites transformers' configs do not cover; returns the embedding function."""
    if isinstance(model, CLIPVisionModelWithProjection):
        tower = model.vision_model
        tower.embeddings.register_forward_hook(dropout_hook(p))
        for layer in tower.encoder.layers:
            layer.self_attn.out_proj.register_forward_hook(dropout_hook(p))
            layer.mlp.activation_fn.register_forward_hook(dropout_hook(p))
        return lambda pixels: model(pixel_values=pixels).image_embeds
    for layer in model.encoder.layer:
        layer.attention.o_proj.register_forward_hook(dropout_hook(p))
        layer.mlp.activation_fn.register_forward_hook(dropout_hook(p))
    return lambda pixels: model(pixel_values=pixels).pooler_output


def load_pixels(folder, processor):
    paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in EXTENSIONS)
    if not paths:
        raise SystemExit(f"{folder}: no images")
    images = [Image.open(p).convert("RGB") for p in paths]
    return processor(images=images, return_tensors="pt")["pixel_values"]


def run_trial(embed, pixels, passes, batch):
    """Per image, the mean and M2 (Σ squared deviations) of the embedding over `passes` passes,
    in f64."""
    n = pixels.shape[0]
    r = min(passes, batch)
    m = max(1, batch // r)
    mean = count = m2 = None
    for first in range(0, n, m):
        chunk = pixels[first : first + m]
        done = 0
        while done < passes:
            rows = min(r, passes - done)
            x = chunk.repeat_interleave(rows, dim=0)
            e = embed(x).double().view(chunk.shape[0], rows, -1)
            b_mean = e.mean(dim=1)
            b_m2 = ((e - b_mean[:, None]) ** 2).sum(dim=1)
            if mean is None:
                dims = e.shape[-1]
                mean = torch.zeros(n, dims, dtype=torch.float64, device=e.device)
                m2 = torch.zeros_like(mean)
                count = torch.zeros(n, 1, dtype=torch.float64, device=e.device)
            sl = slice(first, first + chunk.shape[0])
            # Chan's merge of (count, mean, m2) with the batch's (rows, b_mean, b_m2).
            na, nb = count[sl], float(rows)
            total = na + nb
            delta = b_mean - mean[sl]
            mean[sl] += delta * (nb / total)
            m2[sl] += b_m2 + delta**2 * (na * nb / total)
            count[sl] = total
            done += rows
    return mean.cpu().numpy(), (m2 / (count - 1)).cpu().numpy()


def nested_stats(trials):
    """kiln-mc's NestedStats over the trials' (mean, variance) per image."""
    means = np.stack([m for m, _ in trials])  # [K, N, D]
    scores = np.stack([v.sum(axis=1) for _, v in trials])  # [K, N]
    mean_variance = means.var(axis=0, ddof=1).sum(axis=1).mean()
    uncertainty = scores.mean(axis=0).mean()
    spread = scores.std(axis=0, ddof=1).mean()
    ranks = scores.argsort(axis=1).argsort(axis=1).astype(np.float64)
    k = len(trials)
    correlations = [
        np.corrcoef(ranks[i], ranks[j])[0, 1] for i in range(k) for j in range(i + 1, k)
    ]
    return {
        "mean_variance": float(mean_variance),
        "uncertainty": float(uncertainty),
        "uncertainty_spread": float(spread),
        "rank_stability": float(np.mean(correlations)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", required=True, help="a folder of images")
    parser.add_argument("--model", choices=sorted(PRESETS), default="clip-b32")
    parser.add_argument("--model-dir", help="a transformers checkpoint instead of --model")
    parser.add_argument("--passes", default="4,8", help="pass counts T, comma-separated")
    parser.add_argument("--trials", type=int, default=2, help="trials K per pass count")
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--batch", type=int, default=64, help="rows per forward pass")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the final JSON line to this file")
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="f32 matrix products and convolutions on TF32 tensor cores (as burn's CUDA backend)",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="the forward under torch.autocast(dtype=torch.bfloat16), the one-line mixed "
        "precision a careful user adds (kiln's --policy mixed-bf16)",
    )
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    passes = [int(t) for t in args.passes.split(",")]
    if min(passes) < 2 or args.trials < 2 or args.batch < 1 or not 0 <= args.dropout < 1:
        parser.error("pass counts ≥ 2, --trials ≥ 2, --batch ≥ 1, 0 ≤ --dropout < 1")

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)
    if args.model_dir:
        model, processor = from_checkpoint(args.model_dir, args.dropout)
    else:
        model, processor = PRESETS[args.model](args.dropout)
    model = model.to(args.device).train()
    embed = add_dropout(model, args.dropout)
    if args.bf16:
        f32_embed = embed
        device_type = args.device.split(":")[0]

        def embed(pixels):
            with torch.autocast(device_type, dtype=torch.bfloat16):
                return f32_embed(pixels).float()

    start = time.perf_counter()
    pixels = load_pixels(args.images, processor).to(args.device)
    preprocess_s = time.perf_counter() - start

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    rows = []
    with torch.inference_mode():
        embed(pixels[:1].repeat(min(args.batch, max(passes)), 1, 1, 1))  # warm-up
        sync()
        start = time.perf_counter()
        for t in passes:
            trials = []
            for k in range(args.trials):
                torch.manual_seed(args.seed * 1_000_003 + t * 1_009 + k)
                trials.append(run_trial(embed, pixels, t, args.batch))
            rows.append({"passes": t, "trials": args.trials, **nested_stats(trials)})
        sync()
        wall = time.perf_counter() - start

    image_passes = pixels.shape[0] * args.trials * sum(passes)
    print(f"torch {torch.__version__} on {args.device}, {args.threads} threads, {args.model}, "
          f"{'bf16 autocast' if args.bf16 else 'f32'}, "
          f"{pixels.shape[0]} images, dropout {args.dropout}, batch {args.batch} rows")
    print("T   mean variance   uncertainty     spread  rank stab.")
    for row in rows:
        print(f"{row['passes']:<3} {row['mean_variance']:13.4e} {row['uncertainty']:13.4e} "
              f"{row['uncertainty_spread']:10.3e} {row['rank_stability']:10.3f}")
    print(f"trial loop {wall:.2f} s ({image_passes / wall:.1f} image passes/s); "
          f"pixels preprocessed once in {preprocess_s:.2f} s")
    result = {
        "framework": "pytorch",
        "torch": torch.__version__,
        "device": args.device,
        "threads": args.threads,
        "model": args.model_dir or args.model,
        "images": pixels.shape[0],
        "passes": passes,
        "trials": args.trials,
        "dropout": args.dropout,
        "batch": args.batch,
        "bf16_autocast": args.bf16,
        "wall_s": wall,
        "image_passes_per_s": image_passes / wall,
        "preprocess_s": preprocess_s,
        "rows": rows,
    }
    line = json.dumps(result)
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")


if __name__ == "__main__":
    main()
