#!/usr/bin/env bash
# One lent GPU session's measurements, in priority order, inside a fixed time budget.
#
# Build on the development machine (the GPU machine has no Rust toolchain), then copy the
# binaries, stripped and packed (the device tool carries 64 MiB at most), into BIN (default
# .gpu/, listed in .git/info/exclude):
#
#   cargo build --release --features cuda --example exp0_mc
#   cargo bench --no-run --features cuda --bench vision [--bench text --bench forcefield]
#   cargo test --release --features cuda --no-run --test mc_backends
#   scripts/bench/cuda_session.sh --collect        # .gpu/binaries.tar.xz
#
# and run it there from the repository root (the `device` tool: carry .gpu):
#
#   scripts/bench/cuda_session.sh [BUDGET_SECONDS]     # logs into $OUT (default /tmp/out)
#
# Each step gets what is left of the budget; a step that runs out is cut and logged as such.
#  1. The dropout masks made on the device equal the host's bit for bit, in any batch
#     composition, and none is uploaded (mc_backends' masks::cuda, KILN_REQUIRE_CUDA=1).
#  2. The main job side by side: exp0_mc with CLIP-B/32 (random weights, 64 generated images,
#     T = 4, 8, 16, K = 2, 256 rows a batch), once to compile the kernels into kiln's cache, then
#     alternated with scripts/bench/exp0_torch.py on the same images (TF32 on both sides).
#  3. The towers' plain and Monte-Carlo forwards (the `vision` bench) against
#     scripts/bench/vision_torch.py: CLIP-B/32, then DINOv2-S.
set -u
BIN=${BIN:-.gpu}

if [ "${1:-}" = "--collect" ]; then
    # Whichever of the benches and tests below were built (the newest of each: build the CUDA
    # binaries last), and exp0_mc.
    mkdir -p "$BIN"
    names=()
    for name in vision text forcefield train mc_backends; do
        newest=$(ls -t target/release/deps/"$name"-* 2>/dev/null | grep -v '\.d$' | head -1)
        [ -n "$newest" ] && cp "$newest" "$BIN/$name" && names+=("$name")
    done
    cp target/release/examples/exp0_mc "$BIN/exp0_mc" && names+=(exp0_mc)
    (cd "$BIN" && strip "${names[@]}" && tar -cf - "${names[@]}" | xz -T0 -6 >binaries.tar.xz &&
        rm "${names[@]}")
    du -sh "$BIN"/*
    exit 0
fi
[ -f "$BIN/binaries.tar.xz" ] && (cd "$BIN" && tar -xJf binaries.tar.xz)

BUDGET=${1:-540}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
START=$(date +%s)
export CUBECL_AUTOTUNE_LEVEL=${CUBECL_AUTOTUNE_LEVEL:-minimal}

left() { echo $((BUDGET - ($(date +%s) - START))); }

# step NAME CAP COMMAND...: runs COMMAND for at most min(CAP, what is left) seconds, logging its
# output to $OUT/NAME.log and its wall time to $OUT/steps.log.
step() {
    local name=$1 cap=$2
    shift 2
    local limit
    limit=$(left)
    [ "$cap" -lt "$limit" ] && limit=$cap
    if [ "$limit" -le 5 ]; then
        echo "$name: skipped (budget spent)" | tee -a "$OUT/steps.log"
        return
    fi
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    awk -v n="$name" -v rc="$rc" -v a="$t0" -v b="$t1" -v l="$limit" \
        'BEGIN { printf "%s: rc %s, %.1f s (limit %s s)\n", n, rc, b - a, l }' |
        tee -a "$OUT/steps.log"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/steps.log"
export KILN_KERNEL_CACHE=${KILN_KERNEL_CACHE:-$HOME/.cache/kiln/kernels}

step masks 60 env KILN_REQUIRE_CUDA=1 "$BIN/mc_backends" --exact masks::cuda

e0=(--device cuda --model clip-b32 --passes 4,8,16 --trials 2 --batch 256)
step exp0_cold 200 "$BIN/exp0_mc" "${e0[@]}" --generate 64 --out /tmp/e0_cold
for round in 1 2; do
    step "exp0_kiln_$round" 60 "$BIN/exp0_mc" "${e0[@]}" --images /tmp/e0_cold/images \
        --out "/tmp/e0_$round"
    cp "/tmp/e0_$round/summary.json" "$OUT/exp0_kiln_$round.json" 2>/dev/null
    step "exp0_torch_$round" 90 python3 scripts/bench/exp0_torch.py --images /tmp/e0_cold/images \
        --model clip-b32 --passes 4,8,16 --trials 2 --batch 256 --device cuda --tf32
done
du -sh "$KILN_KERNEL_CACHE" >>"$OUT/steps.log" 2>&1

for tower in clip_b32 dinov2_s; do
    step "vision_$tower" 150 "$BIN/vision" --device cuda --quick --no-calibration --filter "$tower"
    step "vision_torch_$tower" 60 python3 scripts/bench/vision_torch.py --device cuda --runs 30 \
        --tf32 --only "$tower"
    step "vision_torch_${tower}_bf16" 40 python3 scripts/bench/vision_torch.py --device cuda \
        --runs 30 --dtype bf16 --only "$tower"
done
echo "total $(($(date +%s) - START)) s" | tee -a "$OUT/steps.log"
