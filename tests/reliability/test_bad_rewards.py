"""Rewards that hang or fail, as a run meets them.

The rewards (:mod:`tests.rewards.bad_rewards`) are given to the module as ``package.module:function`` names, like a
user's own reward, so they run in a worker process (``model.reward_isolation: custom``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from mutual_rl.rewards import RewardError
from mutual_rl.rewards.reward_worker import alive
from mutual_rl.stats import flatten
from mutual_rl.step.pipeline import StepContext, sample_policy
from mutual_rl.types import Problem, PromptBatch, Rollout
from tests.reliability.one_glance import one_glance

HERE = "tests.rewards.bad_rewards"  # standard library only: each worker (re)start imports it


def _spec(name: str = "char", n: int = 2, max_new_tokens: int = 5) -> PolicySpec:
    return PolicySpec(name=name, model="tiny:llama-char", warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=n, max_new_tokens=max_new_tokens))


class ScriptedEngine:
    """Answers every prompt with the given response texts (so a test chooses what the reward sees)."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def generate(self, policy, problems, sampling, *, step, group_id_base=0):
        return [[self._rollout(policy, p, text, step, group_id_base + i) for text in self.texts[: sampling.n]]
                for i, p in enumerate(problems)]

    @staticmethod
    def _rollout(policy, problem, text, step, group_id):
        ids = torch.tensor(policy.tokenizer(text, add_special_tokens=False)["input_ids"] or [0], dtype=torch.long)
        return Rollout(policy.name, problem.prompt_id, group_id, step, 0, problem.problem, text,
                       torch.tensor(policy.encode_prompt(problem.problem)), ids, torch.zeros(len(ids)),
                       tuple((0, 0) for _ in ids), "length")


def _module(reward: str, texts: list[str] | None = None, **kw) -> MutualRLModule:
    m = MutualRLModule([_spec()], reward=reward, log_samples_every_n_steps=0, **kw)
    m.configure_model()
    if texts is not None:
        m.engine = ScriptedEngine(texts)
    return m


BATCH = PromptBatch(0, [Problem(11, "12+34=", "46"), Problem(12, "50-8=", "42")])


def _sample(m: MutualRLModule, batch: PromptBatch = BATCH):
    """The step's first phase for the module's one policy: its scored groups and the logged names of its stats."""
    ctx = StepContext(specs=m.specs, policies=m.policies, regimes=m.regimes, algorithm=m.algorithm, engine=m.engine,
                      exchange=None, reward_fn=m.reward_fn, optimizers={})
    s = sample_policy(ctx, m.specs[0], batch, step=0)
    return s.groups, {**flatten(s.rollout), **flatten(s.scoring)}


def test_reward_that_never_returns_is_a_counted_timeout_in_skip_mode(preset_cache):
    m = _module(f"{HERE}:sleep_forever", reward_timeout_s=0.2, reward_errors="skip")
    t0 = time.perf_counter()
    groups, metrics = _sample(m)  # the real rollout engine
    assert time.perf_counter() - t0 < 4.0  # 4 calls x 0.2 s, plus sampling
    assert (metrics["reward_timeouts"], metrics["reward_errors"]) == (4.0, 0.0)
    assert metrics["reward"] == 0.0 and all(g.rewards.tolist() == [0.0, 0.0] for g in groups)


def test_reward_that_never_returns_stops_the_run_in_raise_mode(preset_cache):
    m = _module(f"{HERE}:sleep_forever", ["46", "47"], reward_timeout_s=0.2)
    t0 = time.perf_counter()
    with pytest.raises(RewardError) as err:
        _sample(m)
    assert time.perf_counter() - t0 < 1.5
    msg = str(err.value)
    assert msg.startswith(f"reward '{HERE}:sleep_forever' did not return within 0.2 s (policy 'char', prompt 11) on "
                          "completion '46' with answer '46'")
    assert "raise model.reward_timeout_s (now 0.2 s)" in msg and "model.reward_errors: skip" in msg


@pytest.mark.parametrize(
    ("fn", "what"),
    [
        ("raises", "raised KeyError: '46'"),
        ("returns_none", "returned None, not a finite number"),
        ("returns_nan", "returned nan (float), not a finite number"),
        ("returns_abc", "returned 'abc' (str), not a finite number"),
    ],
)
def test_failing_reward_raises_one_error_naming_reward_completion_and_answer(preset_cache, fn, what):
    long_text = "so \\boxed{46}" + " and more" * 50
    m = _module(f"{HERE}:{fn}", [long_text, "47"])
    with pytest.raises(RewardError) as err:
        _sample(m)
    msg = str(err.value)
    assert msg.startswith(f"reward '{HERE}:{fn}' {what} (policy 'char', prompt 11) on completion 'so \\\\boxed{{46}}")
    assert f"... ({len(long_text)} characters) with answer '46'" in msg
    assert "returns a finite float for every completion" in msg and "model.reward_errors: skip" in msg


@pytest.mark.parametrize("fn", ["raises", "returns_none", "returns_nan", "returns_abc"])
def test_failing_reward_is_counted_per_policy_in_skip_mode(preset_cache, fn):
    m = _module(f"{HERE}:{fn}", ["46", "47"], reward_errors="skip")
    groups, metrics = _sample(m)
    assert (metrics["reward_errors"], metrics["reward_timeouts"]) == (4.0, 0.0)
    assert [g.rewards.tolist() for g in groups] == [[0.0, 0.0], [0.0, 0.0]]


def test_working_reward_reports_zero_counts(preset_cache):
    m = _module("integer_match", ["46", "42"])
    groups, metrics = _sample(m)
    assert [g.rewards.tolist() for g in groups] == [[1.0, 0.0], [0.0, 1.0]]
    assert (metrics["reward_errors"], metrics["reward_timeouts"]) == (0.0, 0.0)


@pytest.mark.slow
def test_math_verify_timeouts_are_counted_per_policy(preset_cache):
    pytest.importorskip("math_verify")
    from mutual_rl.rewards.verify import verifier_for

    m = _module("math_verify", ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{46}"], reward_timeout_s=0.5)
    try:
        groups, metrics = _sample(m, PromptBatch(0, BATCH.problems[:1]))
    finally:
        verifier_for(0.5).close()
    assert (metrics["reward_timeouts"], metrics["reward_errors"]) == (1.0, 0.0)  # counted, not raised
    assert groups[0].rewards.tolist() == [0.0, 1.0]


# ------------------------------------------------------ rewards that would take the trainer with them (issue 24)
REPO = Path(__file__).resolve().parents[2]
MUTUAL_RL = Path(sys.executable).with_name("mutual-rl")  # the console script: no working directory on sys.path


def _fit(tmp_path: Path, reward: str, cwd: Path, **model) -> subprocess.CompletedProcess:
    """``mutual-rl fit`` (the console script) for 1 step of one tiny policy, in ``cwd``, outputs under ``out``."""
    cfg = {"trainer": {"logger": False, "enable_progress_bar": False, "enable_model_summary": False,
                       "default_root_dir": "out", "max_steps": 1},
           "model": {"policies": [{"name": "char", "model": "tiny:llama-char", "warmstart": {"steps": 0},
                                   "sampling": {"n": 2, "max_new_tokens": 4}}],
                     "reward": reward, "export_dir": "out/export", "log_samples_every_n_steps": 0,
                     "eval_at_start": False, **model},
           "data": {"task": {"operators": ["+"], "digits": 1, "num_train": 40, "num_heldout": 4}, "batch_size": 2,
                    "val_batch_size": 4, "val_per_skill": 1}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           "MUTUAL_RL_TEST_PIDS": str(tmp_path / "pids")}
    return subprocess.run([str(MUTUAL_RL), "fit", "--config", str(path)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _reported_error(out: subprocess.CompletedProcess, *names: str) -> str:
    """The command's error report (``mutual_rl/cli_errors.py``): one paragraph from ``mutual-rl: error: `` to the end
    of stderr, at most ``MAX_LINES`` lines (not cut to fit), with no traceback before it, naming ``names``
    (:func:`tests.reliability.one_glance.one_glance`)."""
    return one_glance(out.stderr, *names, head="mutual-rl: error: ")


@pytest.mark.slow
@pytest.mark.parametrize(("fn", "what"), [("exits_0", "raised SystemExit(0)"), ("exits_3", "raised SystemExit(3)")])
def test_a_reward_that_calls_sys_exit_ends_the_run_with_an_error_naming_it(tmp_path, fn, what):
    out = _fit(tmp_path, f"{HERE}:{fn}", cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]  # not 0 (a scheduler's success), not the reward's 3
    report = _reported_error(out, f"reward '{HERE}:{fn}'", "policy 'char'")
    assert report.startswith(f"mutual-rl: error: reward '{HERE}:{fn}' {what} (policy 'char', prompt "), report
    assert "it may not end its process" in report, report
    assert not (tmp_path / "out" / "export" / "char").exists()  # stopped before the end of fit


@pytest.mark.slow
def test_a_reward_whose_pool_hangs_ends_the_run_and_leaves_no_process(tmp_path):
    (tmp_path / "pids").touch()
    out = _fit(tmp_path, f"{HERE}:pool_hangs", cwd=tmp_path, reward_timeout_s=1.0)
    assert out.returncode == 1, out.stderr[-3000:]
    report = _reported_error(out, f"reward '{HERE}:pool_hangs'", "policy 'char'")
    assert report.startswith(f"mutual-rl: error: reward '{HERE}:pool_hangs' did not return within 1 s (policy 'char', "
                             "prompt "), report
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 3  # the reward's worker and its pool's two processes
    deadline = time.monotonic() + 5
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)]


@pytest.mark.slow
def test_a_reward_module_in_the_working_directory_that_chdirs_moves_no_output(tmp_path):
    """The issue's two holes in one run of the console script: a reward module that is a file in the working
    directory (found as ``python -m`` would), and a reward that ``os.chdir``s, run in the trainer's process
    (``reward_isolation: none``): the export (written relative to the working directory) stays under it."""
    away = tmp_path / "away"
    away.mkdir()
    (tmp_path / "my_chdir_reward.py").write_text(
        f"import os\n\ndef parity(completion, answer):\n    os.chdir({str(away)!r})\n"
        "    return float(len(completion) % 2 == 0)\n")
    out = _fit(tmp_path, "my_chdir_reward:parity", cwd=tmp_path, reward_isolation="none")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"reward 'my_chdir_reward:parity' changed the working directory to {str(away)!r}" in out.stderr
    assert (tmp_path / "out" / "export" / "char" / "config.json").is_file()
    assert list(away.iterdir()) == []
