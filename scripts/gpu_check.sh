#!/usr/bin/env bash
# GPU check (one GPU, <= 8 minutes): vLLM engine vs HF engine on the embedded tiny presets (no hub downloads),
# the weight-sync probe, a 2-policy training run with vLLM + FSDP, and the GPU-marked tests.
# Prints:  SYNC PROBE: max|Δlogp| = ...   TOKENS/S vllm=... hf=... ratio=...   FIT: ok|FAILED   and a summary.
# Usage: bash scripts/gpu_check.sh        (env: PY=python, SKIP_INSTALL=1 to never pip install)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
export MUTUAL_RL_CACHE=${MUTUAL_RL_CACHE:-$PWD/.gpu_check_cache}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
status=0

echo "== environment"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || { echo "FAIL: no GPU visible"; exit 2; }
if ! $PY -c "import vllm" 2>/dev/null; then
  if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    echo "== installing mutual-rl[vllm] (torch as vllm pins it)"
    timeout 240 $PY -m pip install -q -e ".[vllm]" || echo "WARN: pip install failed (offline?)"
  fi
fi
$PY -c "import mutual_rl" 2>/dev/null || timeout 120 $PY -m pip install -q --no-deps -e . || true
HAVE_VLLM=0; $PY -c "import vllm; print('vllm', vllm.__version__)" && HAVE_VLLM=1 || echo "WARN: vllm unavailable"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

echo "== engines: tokens/s and sync probe"
cat > "$WORK/engines.py" <<'PYEOF'
import sys, time, torch
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.policies.policy import build_policy
from mutual_rl.policies.spec import PolicySpec, SamplingSpec, WarmStart
from mutual_rl.rollout import get_engine

have_vllm = sys.argv[1] == "1"
task = ArithmeticTask(operators=["+", "-"], digits=2, num_heldout=50)
problems = task.train_problems()[:64]
dev = torch.device(torch.cuda.current_device())
sampling = SamplingSpec(n=8, max_new_tokens=8)
for model in ("tiny:gpt2-bpe", "tiny:llama-char"):
    pol = build_policy(PolicySpec(name=model.split(":")[1], model=model, warmstart=WarmStart(steps=100)), task=task)
    pol.to(dev)
    rates = {}
    for name in (["vllm"] if have_vllm else []) + ["hf"]:
        eng = get_engine(name, **({"gpu_memory_utilization": 0.1, "enforce_eager": True, "dtype": "float32"}
                                  if name == "vllm" else {}))
        eng.generate(pol, problems[:4], sampling, step=0)  # warm-up (and vLLM engine creation + first probe)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        groups = eng.generate(pol, problems, sampling, step=1)
        torch.cuda.synchronize(); dt = time.perf_counter() - t0
        rates[name] = sum(len(r.response_ids) for g in groups for r in g) / dt
        if name == "vllm":
            with torch.no_grad():
                for p in pol.parameters():
                    if p.requires_grad:
                        p.add_(torch.randn_like(p) * 0.01)
            pol.version += 1
            m = eng.sync_weights(pol)
            print(f"SYNC PROBE: max|Δlogp| = {m['probe_max_dlogp']:.3g} mean = {m['probe_mean_dlogp']:.3g} "
                  f"sync_s = {m['sync_s']:.3f} ({model})", flush=True)
    v = rates.get("vllm", float("nan"))
    print(f"TOKENS/S vllm={v:.0f} hf={rates['hf']:.0f} ratio={v / rates['hf']:.2f} ({model})", flush=True)
PYEOF
timeout 240 $PY "$WORK/engines.py" "$HAVE_VLLM" || { echo "ENGINES: FAILED"; status=1; }

echo "== 2-policy fit: vLLM + FSDP (1 GPU)"
ENGINE=$([ $HAVE_VLLM = 1 ] && echo vllm || echo hf)
$PY - "$WORK" "$ENGINE" <<'PYEOF'
import sys, yaml
work, engine = sys.argv[1], sys.argv[2]
cfg = yaml.safe_load(open("configs/gpu/grpo_tiny_vllm.yaml"))
if engine != "vllm":
    cfg["model"]["rollout_engine"] = "hf"
for p in cfg["model"]["policies"]:
    p["warmstart"] = {"steps": 100}
cfg["trainer"].update(max_steps=2, logger=False, enable_progress_bar=False, limit_val_batches=0,
                      default_root_dir=work)
cfg["model"].update(export_dir=f"{work}/export", eval_at_start=False)
yaml.safe_dump(cfg, open(f"{work}/fit.yaml", "w"))
PYEOF
set +e
timeout 240 $PY -m mutual_rl.cli fit --config "$WORK/fit.yaml" > "$WORK/fit.log" 2>&1; rc=$?
set -e
tail -25 "$WORK/fit.log"
if [ $rc = 0 ]; then echo "FIT: ok ($ENGINE + FSDP)"; else echo "FIT: FAILED (rc=$rc)"; status=1; fi

echo "== GPU tests"
set +e
timeout 120 $PY -m pytest -q -m gpu -p no:cacheprovider tests/rollout/test_vllm_engine.py; rc=$?
set -e
if [ $rc = 0 ] || [ $rc = 5 ]; then echo "GPU TESTS: ok"; else echo "GPU TESTS: FAILED (rc=$rc)"; status=1; fi
echo "GPU CHECK: $([ $status = 0 ] && echo PASSED || echo FAILED) (vllm=$HAVE_VLLM)"
exit $status
