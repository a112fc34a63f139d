"""PyTorch training throughput on the work of kiln's `train_classifier` example.

The same model and step as `cargo run --release --example train_classifier`: a randomly
initialised transformers `Dinov2Model` of the example's tiny size (hidden 64, 2 layers, 4 heads,
MLP ratio 4, 32 px images in 8 px patches, LayerNorm ε 1e-6, LayerScale 1.0, GELU, qkv biases,
no dropout, no mask token, as kiln's tower has none) with a `Linear(64, 4)` head on
`pooler_output` (the CLS token after the final LayerNorm), fp32 on the CPU. Each step: forward,
mean cross-entropy and the batch's accuracy, backward, `clip_grad_norm_(…, 1.0)`, AdamW
(lr 2e-3, β (0.9, 0.999), ε 1e-8, weight decay 0.05 on matrices and none on vectors: biases,
norms, LayerScale), a LambdaLR step (linear warm-up from 0.01 over steps/10 steps, cosine to 0.05
at `--steps`, the floor after it, as kiln's schedule), `zero_grad(set_to_none=True)`, and the
loss, accuracy and gradient norm read back as Python floats every step, as kiln's trainer reads
them for metrics.jsonl.

The training set lives in memory, decoded and normalised, as kiln's example keeps its cached set
resident: `--images DIR` reads DIR's PNGs (`c{class}_{index}.png`, as the example writes under
OUT/images/train) once and normalises them with ImageNet's mean and standard deviation; without
it the images are random normal values with random labels (`--train-images` of them). Each epoch
is a seeded permutation cut into batches, the last one short when the batch does not divide the
set (as kiln's loader). `--warmup` steps run untimed, then `--rounds` rounds of
`--steps-per-round` steps each are timed (each step's `.item()` reads wait for the device, so
the clock covers the work on a GPU too); prints steps/s per round, their median, and a final JSON
line (also written to `--json PATH`). `--device cuda` runs on a GPU.

    /work/venvs/hf/bin/python scripts/bench/train_torch.py --threads 2 [--batch 32]
        [--images runs/stripes/images/train] [--attention eager|sdpa] [--json out.json]

Requirements: scripts/fixtures/requirements-hf.txt (torch, transformers; Pillow and numpy for
`--images`).
"""

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Dinov2Config, Dinov2Model

CLASSES = 4
SIDE = 32
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


class Classifier(nn.Module):
    """kiln's example model: the tiny DINOv2 backbone and a linear head on its CLS output."""

    def __init__(self, attention):
        super().__init__()
        config = Dinov2Config(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            mlp_ratio=4,
            image_size=SIDE,
            patch_size=8,
            layer_norm_eps=1e-6,
            layerscale_value=1.0,
            hidden_act="gelu",
            qkv_bias=True,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            drop_path_rate=0.0,
            use_mask_token=False,  # kiln's tower has none (it would get no gradient anyway)
            attn_implementation=attention,
        )
        self.backbone = Dinov2Model(config)
        self.head = nn.Linear(config.hidden_size, CLASSES)

    def forward(self, pixels):
        return self.head(self.backbone(pixel_values=pixels).pooler_output)


def load_images(directory):
    """DIR's `c{class}_{index}.png` files, in name order, as normalised [N, 3, 32, 32] f32."""
    import numpy as np
    from PIL import Image

    paths = sorted(Path(directory).glob("*.png"))
    if not paths:
        raise SystemExit(f"{directory}: no PNG files")
    pixels = np.stack(
        [np.asarray(Image.open(p).convert("RGB"), dtype=np.float32) for p in paths]
    )
    labels = [int(p.name[1:].split("_")[0]) for p in paths]
    if pixels.shape[1:] != (SIDE, SIDE, 3):
        raise SystemExit(f"{directory}: images are {pixels.shape[1:]}, not {SIDE}×{SIDE}×3")
    images = torch.from_numpy(pixels).permute(0, 3, 1, 2).div(255.0)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    images = ((images - mean) / std).contiguous()
    return images, torch.tensor(labels, dtype=torch.int64)


def schedule(steps):
    """kiln's `Schedule::warmup_cosine(max(steps / 10, 1), 0.01, 0.05, steps)` as a LambdaLR
    factor of the optimizer step with `step` steps before it."""
    warmup, start, floor = max(steps // 10, 1), 0.01, 0.05

    def factor(step):
        if step < warmup:
            return start + (1.0 - start) * step / warmup
        span = steps - warmup
        progress = 1.0 if span <= 0 else min((step - warmup) / span, 1.0)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def batches(count, batch, generator):
    """Index tensors of batches over endless epochs, each a fresh permutation."""
    while True:
        order = torch.randperm(count, generator=generator)
        for first in range(0, count, batch):
            yield order[first : first + batch]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (inter-op: 1)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200, help="the schedule's length")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=100)
    parser.add_argument(
        "--attention",
        choices=["eager", "sdpa"],
        default="eager",
        help="transformers' attention implementation (eager measured ~10%% faster on 2 CPU "
        "threads at this size)",
    )
    parser.add_argument("--images", help="a directory of c{class}_{index}.png training images")
    parser.add_argument(
        "--train-images", type=int, default=2000, help="random images without --images"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu or cuda[:N] (the data set moves to the device once, as kiln keeps it resident)",
    )
    parser.add_argument("--json", help="also write the final JSON line to this file")
    args = parser.parse_args()
    if min(args.batch, args.steps, args.rounds, args.steps_per_round) < 1 or args.warmup < 0:
        parser.error("--batch, --steps, --rounds and --steps-per-round must be at least 1")

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    torch.manual_seed(args.seed)

    if args.images:
        images, labels = load_images(args.images)
        data = f"{len(labels)} images from {args.images}"
    else:
        data_generator = torch.Generator().manual_seed(args.seed)
        images = torch.randn(args.train_images, 3, SIDE, SIDE, generator=data_generator)
        labels = torch.randint(0, CLASSES, (args.train_images,), generator=data_generator)
        data = f"{args.train_images} random normal images with random labels"

    device = torch.device(args.device)
    images, labels = images.to(device), labels.to(device)
    model = Classifier(args.attention).to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    decayed = [p for p in params if p.ndim >= 2]
    plain = [p for p in params if p.ndim <= 1]
    optimizer = torch.optim.AdamW(
        [
            {"params": decayed, "weight_decay": 0.05},
            {"params": plain, "weight_decay": 0.0},
        ],
        lr=2e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(args.steps))
    order = (
        index.to(device)
        for index in batches(len(labels), args.batch, torch.Generator().manual_seed(args.seed))
    )
    print(
        f"torch {torch.__version__} on {device}, {args.threads} threads, batch {args.batch}, "
        f"{args.attention} attention, {sum(p.numel() for p in params)} parameters "
        f"({len(decayed)} decayed, {len(plain)} not); data: {data}",
        flush=True,
    )

    last = {}

    def step():
        index = next(order)
        pixels, targets = images[index], labels[index]
        logits = model(pixels)
        loss = F.cross_entropy(logits, targets)
        accuracy = (logits.detach().argmax(1) == targets).float().mean()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        last["loss"], last["accuracy"], last["grad_norm"] = (
            loss.item(),
            accuracy.item(),
            norm.item(),
        )

    for _ in range(args.warmup):
        step()
    rates = []
    for round_ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps_per_round):
            step()
        seconds = time.perf_counter() - start
        rates.append(args.steps_per_round / seconds)
        print(
            f"round {round_ + 1}: {rates[-1]:.2f} steps/s ({1000 / rates[-1]:.2f} ms/step), "
            f"loss {last['loss']:.4f}, accuracy {last['accuracy']:.3f}, "
            f"grad norm {last['grad_norm']:.3f}",
            flush=True,
        )
    median = statistics.median(rates)
    print(f"median: {median:.2f} steps/s, {args.batch * median:.1f} images/s", flush=True)
    result = {
        "framework": "pytorch",
        "torch": torch.__version__,
        "device": str(device),
        "threads": args.threads,
        "batch": args.batch,
        "steps_per_s_median": round(median, 3),
        "steps_per_s_rounds": [round(r, 3) for r in rates],
        "ms_per_step_median": round(1000 / median, 3),
        "attention": args.attention,
        "data": "images" if args.images else "random",
    }
    line = json.dumps(result)
    print(line, flush=True)
    if args.json:
        Path(args.json).write_text(line + "\n")


if __name__ == "__main__":
    main()
