"""PyTorch throughput of the vision towers kiln benchmarks, for docs/PERFORMANCE.md.

Same work as `cargo bench --bench vision`: randomly initialised transformers towers of the
released sizes (throughput does not depend on the weights), fp32, batch 32, forward only under
`torch.inference_mode()`, the same thread count (CPU) or the same GPU (`--device cuda`, timed
between `torch.cuda.synchronize()` calls; fp32 matrix products in full fp32, not TF32, as
PyTorch's default; `--tf32` allows TF32 as burn's CUDA backend does; `--dtype bf16` runs the
tower in bfloat16). Prints one line per model: median seconds per batch over the timed runs
and images/s.

    /work/venvs/hf/bin/python scripts/bench/vision_torch.py --threads 2 [--batch 32] [--runs 5]
    python3 scripts/bench/vision_torch.py --device cuda --runs 50

Requirements: scripts/fixtures/requirements-hf.txt (torch, transformers).
"""

import argparse
import json
import statistics
import time

import torch
from transformers import (
    CLIPVisionConfig,
    CLIPVisionModelWithProjection,
    Dinov2Config,
    Dinov2Model,
    SiglipVisionConfig,
    SiglipVisionModel,
)

# The released configurations (openai/clip-vit-base-patch32, facebook/dinov2-small), also
# used by exp0_torch.py; `extra` sets more of the config (dropout rates).
def clip_b32(**extra):
    return CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            image_size=224,
            patch_size=32,
            projection_dim=512,
            hidden_act="quick_gelu",
            **extra,
        )
    )


def dinov2_s(**extra):
    return Dinov2Model(
        Dinov2Config(
            hidden_size=384,
            num_hidden_layers=12,
            num_attention_heads=6,
            mlp_ratio=4,
            image_size=518,
            patch_size=14,
            **extra,
        )
    )


# name, model, pixel size (google/siglip2-base-patch16-224 besides the two above; DINOv2 at
# 256 px).
MODELS = [
    ("clip_b32", clip_b32, 224),
    (
        "siglip2_b16",
        lambda: SiglipVisionModel(
            SiglipVisionConfig(
                hidden_size=768,
                intermediate_size=3072,
                num_hidden_layers=12,
                num_attention_heads=12,
                image_size=224,
                patch_size=16,
                hidden_act="gelu_pytorch_tanh",
                layer_norm_eps=1e-6,
            )
        ),
        224,
    ),
    ("dinov2_s", dinov2_s, 256),
]

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", help="run only the model with this name")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="f32 matrix products and convolutions on TF32 tensor cores (as burn's CUDA backend)",
    )
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    args = parser.parse_args()
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32  # the patch convolution too, like the matmuls

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for name, build, size in MODELS:
        if args.only and name != args.only:
            continue
        model = build().eval().to(device, dtype)
        inputs = [
            torch.randn(args.batch, 3, size, size, device=device, dtype=dtype) for _ in range(3)
        ]
        with torch.inference_mode():
            for _ in range(3 if device.type == "cuda" else 1):  # warm-up
                model(pixel_values=inputs[0])
            seconds = []
            for run in range(args.runs):
                sync()
                start = time.perf_counter()
                model(pixel_values=inputs[run % len(inputs)])
                sync()
                seconds.append(time.perf_counter() - start)
        median = statistics.median(seconds)
        print(
            json.dumps(
                {
                    "model": name,
                    "pixels": size,
                    "batch": args.batch,
                    "device": str(device),
                    "dtype": args.dtype,
                    "tf32": args.tf32,
                    "threads": args.threads,
                    "torch": torch.__version__,
                    "median_s_per_batch": round(median, 4),
                    "images_per_s": round(args.batch / median, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
