#!/usr/bin/env bash
# One lent GPU session's measurements, in priority order, inside a fixed time budget.
#
# Build on the development machine (the GPU machine has no Rust toolchain), then copy the
# binaries, stripped and packed (the device tool carries 64 MiB at most), into BIN (default
# .gpu/, listed in .git/info/exclude):
#
#   cargo bench --no-run --features cuda --bench train --bench vision --bench forcefield
#   cargo build --release --features cuda --example exp0_mc
#   scripts/bench/cuda_session.sh --collect        # .gpu/binaries.tar.xz
#
# and run it there from the repository root (the `device` tool: carry .gpu):
#
#   scripts/bench/cuda_session.sh [BUDGET_SECONDS]     # logs into $OUT (default /tmp/out)
#
# Each step gets what is left of the budget; a step that runs out is cut and logged as such.
#  1. exp0_mc twice, each into a fresh results directory: the first compiles every kernel, the
#     second finds them in kiln's kernel cache (`KILN_KERNEL_CACHE`, issue 26: the second run
#     reaches its first forward within 5 s).
#  2. train_classifier's step against PyTorch (kiln's `train` bench, scripts/bench/train_torch.py),
#     interleaved, kiln first.
#  3. PaiNN's force-matching training step (the `forcefield` bench's painn-train rows).
#  4. CLIP-B/32's plain and Monte-Carlo forwards (the `vision` bench).
set -u
BIN=${BIN:-.gpu}

if [ "${1:-}" = "--collect" ]; then
    mkdir -p "$BIN"
    for bench in train vision forcefield; do
        newest=$(ls -t target/release/deps/"$bench"-* | grep -v '\.d$' | head -1)
        cp "$newest" "$BIN/$bench"
    done
    cp target/release/examples/exp0_mc "$BIN/exp0_mc"
    strip "$BIN"/*
    (cd "$BIN" && tar -cf - exp0_mc forcefield train vision | xz -T0 -6 >binaries.tar.xz &&
        rm exp0_mc forcefield train vision)
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

mkdir -p /tmp/exp0_cold /tmp/exp0_cached
step exp0_cold 180 "$BIN/exp0_mc" --device cuda --passes 4 --trials 2 --out /tmp/exp0_cold
step exp0_cached 90 "$BIN/exp0_mc" --device cuda --passes 4 --trials 2 \
    --images /tmp/exp0_cold/images --out /tmp/exp0_cached
cp /tmp/exp0_cold/summary.json "$OUT/exp0_cold_summary.json" 2>/dev/null
cp /tmp/exp0_cached/summary.json "$OUT/exp0_cached_summary.json" 2>/dev/null
du -sh "$KILN_KERNEL_CACHE" >>"$OUT/steps.log" 2>&1

for round in 1 2; do
    step "train_kiln_$round" 120 "$BIN/train" --device cuda --quick --no-calibration \
        --filter classifier_step
    step "train_torch_$round" 60 python3 scripts/bench/train_torch.py --device cuda \
        --attention sdpa --rounds 3 --steps-per-round 100
done

step painn_train 120 "$BIN/forcefield" --device cuda --quick --no-calibration --filter painn-train
step vision_clip 150 "$BIN/vision" --device cuda --quick --no-calibration --filter clip_b32
echo "total $(($(date +%s) - START)) s" | tee -a "$OUT/steps.log"
