#!/usr/bin/env bash
# One lent GPU session's measurements, in priority order, inside a fixed time budget.
#
# Build on the development machine (the GPU machine has no Rust toolchain), then copy the
# binaries, stripped and packed (the device tool carries 64 MiB at most), into BIN (default
# .gpu/, listed in .git/info/exclude). Build only what the groups you will run need:
#
#   cargo build --release --features cuda --example exp0_mc                  # exp0
#   cargo bench --no-run --features cuda --bench vision --bench text --bench forcefield \
#       --bench foveated
#   cargo test --release --features cuda --no-run --test integration  # cublaslt, parity, masks
#   cargo bench --no-run --features cuda --bench realtime \
#       && cargo build --release --features cuda --example realtime             # realtime
#   KILN_MIRAGE_DIR=<checkout> scripts/bench/cuda_session.sh --collect   # .gpu/binaries.tar.xz
#
# `realtime` also needs the system's two model files (mirage-hello at 04a704d), which --collect
# copies into BIN/mirage from the checkout KILN_MIRAGE_DIR names.
#
# schnetpack is not installed on the GPU machines: for `painn`, carry its wheels in .whl/ (the
# device tool's README says how to download them; scripts/fixtures/requirements-schnetpack.txt
# names the versions). Then run it there from the repository root (the `device` tool: carry .gpu
# and .whl):
#
#   scripts/bench/cuda_session.sh [BUDGET_SECONDS] [GROUP...]   # logs into $OUT (default /tmp/out)
#
# kiln's products through cuBLASLt are off by default (docs/PERFORMANCE.md): run the script with
# KILN_CUBLASLT=1 to measure them (the `cublaslt` group turns them on for its own test).
#
# The kernels compiled there come back as $OUT/kernels.tar.xz; copied into BIN, the next
# session starts with them cached (first calls in seconds instead of a minute per shape).
#
# Each step gets what is left of the budget; a step that runs out is cut and logged as such.
# GROUPs, run in the order given (default: all, in this order):
#  cublaslt kiln's products through NVIDIA's cuBLASLt against the host's (each epilogue,
#          transposes, a residual, an offset operand; f32/TF32, bf16, f16; none falling back).
#  products The towers' MLP projections alone (the `vision` bench's `projection/` rows), burn's
#          products then cuBLASLt's (KILN_CUBLASLT=1), in f32/TF32 and in bf16.
#  parity  The CUDA parity tests under their TF32 bounds: vision (tiny CLIP, SigLIP, DINOv2 vs
#          transformers), text (vs transformers), one Monte-Carlo trial vs Flex.
#  masks   kiln's own CUDA kernels against the host's results (KILN_REQUIRE_CUDA=1): the dropout
#          masks bit for bit in any batch composition, none uploaded (mc_backends' masks::cuda);
#          attention with probability dropout as one kernel, f32 and bf16 (attention::cuda);
#          PaiNN's segment sums, by hand and against schnetpack (forcefield_backends' cuda).
#  exp0    The main job side by side: exp0_mc with CLIP-B/32 (random weights, 64 generated
#          images, T = 4, 8, 16, K = 2, 256 rows a batch), once to compile the kernels into
#          kiln's cache, then alternated with scripts/bench/exp0_torch.py on the same images
#          (TF32 on both sides).
#  towers  The towers' plain and Monte-Carlo forwards (the `vision` bench) against
#          scripts/bench/vision_torch.py in f32/TF32 and bf16: CLIP-B/32, then DINOv2-S.
#  towers-bf16  The same in bf16 on kiln's side (mixed-bf16): DINOv2-S, CLIP-B/32.
#  siglip2 SigLIP2-B/16 as `towers`, f32 and bf16.
#  text    kiln-text's SmolLM2-135M prefill and decode (the `text` bench) against
#          scripts/bench/text_torch.py, f32/TF32 then bf16.
#  foveated  The foveated model's training steps (the `foveated` bench: the synthetic default and
#          fVLM's shapes, then DINOv2-S's per-frame cost) against scripts/bench/foveated_torch.py,
#          TF32 on both sides.
#  painn   PaiNN energies and forces at batch 1 … 256 (the `forcefield` bench, seed size)
#          against scripts/bench/painn_torch.py (schnetpack) on the same GPU. Each new batch
#          size compiles for tens of seconds: PAINN_FILTER=painn/seed/b=64 times one size alone.
#  realtime The frame models (the `realtime` bench: mirage-hello's U-Net and live-stream model at
#          b = 1 and 8) under the system's FP16 conversion (pure-f16), beside
#          scripts/bench/realtime_torch.py (FP16 + channels_last, its method) on the same GPU,
#          the live-stream model also with kiln's per-slot key cache (--cache-keys); then kernel
#          launches per frame: the `realtime` example with cubecl's execution log on (a
#          cubecl.toml, profiling level "minimal"), 2 frames and 12, the difference per frame;
#          its summaries (launches_*.json) hold the device's peak memory (memory_kind
#          "device"), beside torch's max_memory_allocated in the script's JSON line.
set -u
BIN=${BIN:-.gpu}

if [ "${1:-}" = "--collect" ]; then
    # Whichever of the benches and tests below were built (the newest of each: build the CUDA
    # binaries last), and exp0_mc.
    mkdir -p "$BIN"
    names=()
    for name in vision text forcefield foveated train integration realtime; do
        newest=$(ls -t target/release/deps/"$name"-* 2>/dev/null | grep -v '\.d$' | head -1)
        [ -n "$newest" ] && cp "$newest" "$BIN/$name" && names+=("$name")
    done
    [ -f target/release/examples/exp0_mc ] && cp target/release/examples/exp0_mc "$BIN" &&
        names+=(exp0_mc)
    [ -f target/release/examples/realtime ] &&
        cp target/release/examples/realtime "$BIN/realtime_example" && names+=(realtime_example)
    if [ -n "${KILN_MIRAGE_DIR:-}" ]; then
        for file in examples/advanced/day2_fixed.py examples/basic/simplified_lsd.py; do
            mkdir -p "$BIN/mirage/$(dirname "$file")" && cp "$KILN_MIRAGE_DIR/$file" "$BIN/mirage/$file"
        done
    fi
    (cd "$BIN" && strip "${names[@]}" && tar -cf - "${names[@]}" | xz -T0 -6 >binaries.tar.xz &&
        rm "${names[@]}")
    # Tests read the repository's fixtures by the path they were built in.
    pwd >"$BIN/source_dir"
    du -sh "$BIN"/*
    exit 0
fi
[ -f "$BIN/binaries.tar.xz" ] && (cd "$BIN" && tar -xJf binaries.tar.xz)

BUDGET=540
if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
    BUDGET=$1
    shift
fi
GROUPS_TO_RUN=("$@")
[ ${#GROUPS_TO_RUN[@]} -eq 0 ] && GROUPS_TO_RUN=(cublaslt products parity masks exp0 towers towers-bf16 siglip2 text foveated painn realtime)
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
# kiln's CUDA products load libcublasLt at run time, as burn loads the driver: where the loader
# does not know it, the toolkit's copy or PyTorch's (the nvidia-cublas wheel) serves.
if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so'; then
    for dir in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os
for p in nvidia.__path__:
    for sub in os.listdir(p): print(os.path.join(p, sub, "lib"))' 2>/dev/null); do
        if ls "$dir"/libcublasLt.so* >/dev/null 2>&1; then
            export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            break
        fi
    done
fi
echo "libcublasLt: $(ldconfig -p 2>/dev/null | grep -c 'libcublasLt\.so') in the cache;" \
    "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" | tee -a "$OUT/steps.log"
# kiln's info lines say which library ran the products (and any fallback, as a warning).
export KILN_LOG=${KILN_LOG:-info}
export KILN_KERNEL_CACHE=${KILN_KERNEL_CACHE:-$HOME/.cache/kiln/kernels}
# A kernel cache brought back from an earlier session (same cubecl, same chip family) spares
# the compiles its kernels cost; this session's cache goes back in $OUT/kernels.tar.xz.
if [ -f "$BIN/kernels.tar.xz" ]; then
    mkdir -p "$KILN_KERNEL_CACHE" && tar -xJf "$BIN/kernels.tar.xz" -C "$KILN_KERNEL_CACHE"
    echo "kernel cache carried in: $(du -sh "$KILN_KERNEL_CACHE" | cut -f1)" | tee -a "$OUT/steps.log"
fi

# The tests read the repository's fixtures where they were built: this checkout, linked there.
fixtures_here() {
    local source
    source=$(cat "$BIN/source_dir" 2>/dev/null || echo "$PWD")
    [ -e "$source" ] || { mkdir -p "$(dirname "$source")" && ln -s "$PWD" "$source"; }
}

cublaslt() {
    step cublaslt 150 env KILN_REQUIRE_CUDA=1 "$BIN/integration" --exact backends::cublaslt::cuda \
        --nocapture
}

products() {
    for policy in full mixed-bf16; do
        for lt in 0 1; do
            step "products_${policy}_cublaslt$lt" 90 env KILN_CUBLASLT=$lt "$BIN/vision" \
                --device cuda --quick --no-calibration --filter projection/ --policy "$policy"
        done
    done
}

parity() {
    local tests="$BIN/integration"
    fixtures_here
    for test in vision_backends::cuda text_backends::cuda mc_backends::cuda; do
        step "parity_${test%%::*}" 200 env KILN_REQUIRE_CUDA=1 "$tests" --exact "$test" --nocapture
    done
}

masks() {
    local tests="$BIN/integration"
    step masks 60 env KILN_REQUIRE_CUDA=1 "$tests" --exact mc_backends::masks::cuda
    step attention 90 env KILN_REQUIRE_CUDA=1 "$tests" --exact mc_backends::attention::cuda
    if [ -x "$tests" ]; then
        fixtures_here
        step segments 150 env KILN_REQUIRE_CUDA=1 "$tests" --exact forcefield_backends::cuda
    fi
}

exp0() {
    local e0=(--device cuda --model clip-b32 --passes 4,8,16 --trials 2 --batch 256)
    step exp0_cold 200 "$BIN/exp0_mc" "${e0[@]}" --generate 64 --out /tmp/e0_cold
    for round in 1 2; do
        step "exp0_kiln_$round" 60 "$BIN/exp0_mc" "${e0[@]}" --images /tmp/e0_cold/images \
            --out "/tmp/e0_$round"
        cp "/tmp/e0_$round/summary.json" "$OUT/exp0_kiln_$round.json" 2>/dev/null
        step "exp0_torch_$round" 90 python3 scripts/bench/exp0_torch.py --images /tmp/e0_cold/images \
            --model clip-b32 --passes 4,8,16 --trials 2 --batch 256 --device cuda --tf32
    done
    du -sh "$KILN_KERNEL_CACHE" >>"$OUT/steps.log" 2>&1
}

# tower NAME POLICY: kiln's plain and Monte-Carlo forwards of one tower under POLICY, then
# PyTorch's in the matching dtype (TF32 for f32).
tower() {
    local name=$1 policy=$2 dtype=bf16 tf32=()
    [ "$policy" = full ] && dtype=f32 tf32=(--tf32)
    step "vision_${name}_$dtype" 150 "$BIN/vision" --device cuda --quick --no-calibration \
        --filter "$name" --policy "$policy"
    step "vision_torch_${name}_$dtype" 60 python3 scripts/bench/vision_torch.py --device cuda \
        --runs 30 "${tf32[@]}" --dtype "$dtype" --only "$name"
}

towers() {
    tower clip_b32 full
    tower dinov2_s full
}

towers-bf16() {
    tower dinov2_s mixed-bf16
    tower clip_b32 mixed-bf16
}

siglip2() {
    tower siglip2_b16 full
    tower siglip2_b16 mixed-bf16
}

text() {
    step text_f32 200 "$BIN/text" --device cuda --quick --no-calibration
    step text_torch_f32 60 python3 scripts/bench/text_torch.py --device cuda --tf32
    step text_bf16 120 "$BIN/text" --device cuda --quick --no-calibration --policy mixed-bf16
    step text_torch_bf16 60 python3 scripts/bench/text_torch.py --device cuda --dtype bf16
}

foveated() {
    step foveated_kiln 240 "$BIN/foveated" --device cuda --quick --no-calibration
    step foveated_torch_synthetic 60 python3 scripts/bench/foveated_torch.py --device cuda \
        --tf32 --workload synthetic
    step foveated_torch_fvlm 90 python3 scripts/bench/foveated_torch.py --device cuda --tf32 \
        --workload fvlm --warmup 2 --rounds 5 --steps-per-round 3
}

painn() {
    step painn_kiln 200 "$BIN/forcefield" --device cuda --quick --no-calibration \
        --filter "${PAINN_FILTER:-painn/seed}"
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1
        export PYTHONPATH=/tmp/site
        # schnetpack 2.1.1 imports a name that newer torch renamed (`T_co` → `_T_co`).
        sed -i 's/import _collate_fn_t, T_co$/import _collate_fn_t, _T_co as T_co/' \
            /tmp/site/schnetpack/data/loader.py
    fi
    step painn_torch 90 python3 scripts/bench/painn_torch.py --device cuda --models seed \
        --seconds 2 --threads 16
}

# launches MODEL: kernels launched per frame of MODEL's `realtime` example (pure-f16, one stream):
# cubecl's execution log over 12 frames less that over 2, divided by 10.
launches() {
    local model=$1 counts=()
    for frames in 2 12; do
        local dir=/tmp/launches_${model}_$frames
        mkdir -p "$dir"
        printf '[profiling.logger]\nlevel = "minimal"\nfile = "%s"\nappend = false\n' \
            "$dir/executions.log" >"$dir/cubecl.toml"
        step "launches_${model}_$frames" 120 env -C "$dir" "$PWD/$BIN/realtime_example" \
            --out "$dir/out" --model "$model" --frames "$frames" --device cuda --policy pure-f16
        counts+=("$(grep -c Executing "$dir/executions.log" 2>/dev/null || echo 0)")
        cp "$dir/out/summary.json" "$OUT/launches_${model}_$frames.json" 2>/dev/null
    done
    echo "launches $model: ${counts[0]} in 2 frames, ${counts[1]} in 12:" \
        "$(((counts[1] - counts[0]) / 10)) a frame" | tee -a "$OUT/steps.log"
}

realtime() {
    step realtime_f16 240 "$BIN/realtime" --device cuda --quick --no-calibration \
        --policy pure-f16
    for model in lsd unet; do
        for batch in 1 8; do
            step "realtime_torch_${model}_$batch" 60 env KILN_MIRAGE_DIR="$BIN/mirage" python3 \
                scripts/bench/realtime_torch.py --device cuda --dtype f16 --model "$model" \
                --batch "$batch"
            [ "$model" = lsd ] && step "realtime_torch_lsd_${batch}_cached" 60 \
                env KILN_MIRAGE_DIR="$BIN/mirage" python3 scripts/bench/realtime_torch.py \
                --device cuda --dtype f16 --model lsd --batch "$batch" --cache-keys
        done
        launches "$model"
    done
}

for group in "${GROUPS_TO_RUN[@]}"; do
    "$group"
done
echo "total $(($(date +%s) - START)) s" | tee -a "$OUT/steps.log"
[ -d "$KILN_KERNEL_CACHE" ] && tar -cf - -C "$KILN_KERNEL_CACHE" . | xz -T0 -6 >"$OUT/kernels.tar.xz"
