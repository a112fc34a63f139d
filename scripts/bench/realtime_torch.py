"""PyTorch per-forward and per-frame speed of mirage-hello's frame models, run as the system runs
them, each frame timed to a device synchronisation.

The models are the system's own (`SimpleOptimizedUNet` from examples/advanced/day2_fixed.py,
`LiveStreamDiffusionModel` from examples/basic/simplified_lsd.py), imported from a checkout of
github.com/toddllm/mirage-hello (`--mirage-dir` or `$KILN_MIRAGE_DIR`, commit 04a704d) by
scripts/fixtures/realtime.py's loader.

The U-Net as `comprehensive_day2_benchmark` runs it: the model converted once to the precision
(`--dtype f16|bf16` with channels_last, as `Day2Model` converts it; f32 stays contiguous, as
there), eval mode, `inference_mode`, a warm-up of 5 single forwards at timestep 25, then 12 timed
frames; a frame is 6 forwards at timesteps 50, 40, …, 0 (`--steps`), each on the incoming frame
with its timestep plane, as the benchmark calls `Day2Model.forward` (which ignores the previous
output it is passed), the frame's output the last forward's (`--chain`: each forward reads the
previous one's output, kiln's chained variant; the cost is the same). The system's benchmark
synchronises too (day2_fixed.py:235), but reports forwards per second as FPS (`6 / avg_time`);
here both per-frame and per-forward figures are printed.

The live-stream model as its demo (`demo_simplified_lsd`) runs it: eval mode, one call of the
model's forward a frame with the previous outputs as context, the block drawing its timestep at
random; `--warmup` frames first (the demo warms up with one call in training mode). The demo
times with `time.time()` and never synchronises (it runs on the CPU as often as on a GPU); here
every frame is synchronised. As written, its bank never changes in eval mode, and every frame
runs the bank's `feature_net` on all 8 slots and on the blend: 9 runs. `--cache-keys` runs it
as kiln does, the careful user's version: each frame is written into the next slot (as the
system's training mode does) and each slot's pooled features are kept with the slot, so
`feature_net` runs twice a frame (the new frame, the blend), with one bank per stream.

At `--batch` above 1, the U-Net reads B frames at once; the live-stream model's memory query
only works for a batch of one in the system's code (it squeezes the similarities and views the
weights flat), so here it is generalised to one softmax per stream over the shared bank, the
smallest change that lets B streams run as one batch.

    /work/venvs/hf/bin/python scripts/bench/realtime_torch.py --threads 2 --model unet --batch 1
    /work/venvs/hf/bin/python scripts/bench/realtime_torch.py --threads 2 --model lsd --cache-keys

Prints ms per frame per iteration, their median, per-forward figures and a final JSON line.
Requirements: scripts/fixtures/requirements-hf.txt (torch).
"""

import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from realtime import mirage_module  # noqa: E402  (scripts/fixtures/realtime.py)


def batched_query(self, current_frame):
    """The system's `ContextMemoryBank.query_memory`, one softmax over the bank per stream."""
    query = F.adaptive_avg_pool2d(self.memory_query(current_frame), 1).flatten(1)
    memory = F.adaptive_avg_pool2d(self.feature_net(self.frame_memory), 1).flatten(1)
    weights = F.softmax(query @ memory.T, dim=1)
    blend = torch.einsum("bm,mchw->bchw", weights, self.frame_memory)
    return self.memory_out(self.feature_net(blend))


def cached_memory(self, current_frame):
    """`ContextMemoryBank.forward` as kiln runs it: each stream's frame written into the next
    slot of its own bank (as the system's training mode writes the shared one), each slot's
    pooled features kept with the slot, the weights one softmax per stream."""
    if not hasattr(self, "_keys"):
        streams = current_frame.shape[0]
        keys = F.adaptive_avg_pool2d(self.feature_net(self.frame_memory), 1).flatten(1)
        self._bank = self.frame_memory.unsqueeze(0).repeat(streams, 1, 1, 1, 1)
        self._keys = keys.unsqueeze(0).repeat(streams, 1, 1)
        self._slot = 0
    slot = self._slot
    self._bank[:, slot] = current_frame
    self._keys[:, slot] = F.adaptive_avg_pool2d(self.feature_net(current_frame), 1).flatten(1)
    self._slot = (slot + 1) % self.memory_size
    query = F.adaptive_avg_pool2d(self.memory_query(current_frame), 1).flatten(1)
    weights = F.softmax(torch.einsum("bmk,bk->bm", self._keys, query), dim=1)
    blend = torch.einsum("bm,bmchw->bchw", weights, self._bank)
    return self.memory_out(self.feature_net(blend))


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirage-dir", default=os.environ.get("KILN_MIRAGE_DIR"))
    parser.add_argument("--model", choices=["unet", "lsd"], default="unet")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=["f32", "f16", "bf16"], default="f32")
    parser.add_argument(
        "--autocast",
        action="store_true",
        help="an f32 model whose forwards run under torch.autocast(dtype=torch.bfloat16), the "
        "one-line mixed precision (kiln's --policy mixed-bf16)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6, help="U-Net forwards per frame")
    parser.add_argument("--chain", action="store_true",
                        help="each U-Net forward reads the previous one's output (kiln's variant)")
    parser.add_argument(
        "--cache-keys",
        action="store_true",
        help="the live-stream model's bank as kiln runs it: each frame recorded, each slot's "
        "pooled features kept (feature_net twice a frame instead of 9 times)",
    )
    parser.add_argument("--warmup", type=int, default=5,
                        help="U-Net: single forwards at timestep 25; lsd: frames")
    parser.add_argument("--iterations", type=int, default=12)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    b, size = args.batch, args.size

    if args.model == "unet":
        day2 = mirage_module(args.mirage_dir, "examples/advanced/day2_fixed.py")
        model = day2.SimpleOptimizedUNet(4, 3, base_channels=96)
        forwards = args.steps
        timesteps = [50 - 50 * i / max(forwards - 1, 1) for i in range(forwards)]
    else:
        lsd = mirage_module(args.mirage_dir, "examples/basic/simplified_lsd.py")
        model = lsd.LiveStreamDiffusionModel(3, 128, 8, size, size)
        memory = model.context_memory
        if args.cache_keys:
            memory.forward = types.MethodType(cached_memory, memory)
        elif b > 1:
            memory.query_memory = types.MethodType(batched_query, memory)
        forwards = 1
    if args.cache_keys and args.model != "lsd":
        parser.error("--cache-keys is the live-stream model's bank")
    # Day2Model: f16 and bf16 with channels_last, f32 as it is.
    layout = torch.contiguous_format if args.dtype == "f32" else torch.channels_last
    model = model.to(device=device, dtype=dtype, memory_format=layout).eval()
    frame = torch.randn(b, 3, size, size, device=device, dtype=dtype)
    frame = frame.contiguous(memory_format=layout)

    context = None

    def one_frame():
        nonlocal context
        if args.model == "unet":
            x = frame
            for t in timesteps:
                plane = torch.full((b, 1, size, size), t / 100.0, device=device, dtype=dtype)
                read = x if args.chain else frame
                x = model(torch.cat([read, plane], dim=1).contiguous(memory_format=layout))
            return x
        out, context = model(frame.view(b, 1, 3, size, size), context)
        return out

    def warm_up():
        if args.model == "lsd":
            for _ in range(args.warmup):
                one_frame()
            return
        plane = torch.full((b, 1, size, size), 0.25, device=device, dtype=dtype)
        for _ in range(args.warmup):  # the system's: single forwards at timestep 25
            model(torch.cat([frame, plane], dim=1).contiguous(memory_format=layout))

    if args.autocast and args.dtype != "f32":
        parser.error("--autocast runs an f32 model: leave --dtype at f32")
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if args.autocast
        else contextlib.nullcontext()
    )
    with torch.inference_mode(), autocast:
        warm_up()
        synchronize(device)
        times = []
        for i in range(args.iterations):
            start = time.perf_counter()
            one_frame()
            synchronize(device)
            times.append(time.perf_counter() - start)
            print(f"frame {i + 1}: {times[-1] * 1e3:.2f} ms")
    median = statistics.median(times)
    result = {
        "model": args.model,
        "batch": b,
        "dtype": args.dtype,
        "bf16_autocast": args.autocast,
        "cache_keys": args.cache_keys,
        "chain": args.chain,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "size": size,
        "forwards_per_frame": forwards,
        "frame_ms_median": median * 1e3,
        "frame_ms_min": min(times) * 1e3,
        "forward_ms_median": median * 1e3 / forwards,
        "frames_per_s_per_stream": 1.0 / median,
        "frames_per_s_all_streams": b / median,
        "parameters": sum(p.numel() for p in model.parameters()),
        # The system's measure (day2_fixed.py): the device's peak allocated bytes.
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
        # The process's resident peak (kiln's `peak_host_memory_bytes`, VmHWM).
        "peak_host_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "torch": torch.__version__,
    }
    print(f"median {median * 1e3:.2f} ms per frame ({median * 1e3 / forwards:.2f} ms per forward)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
