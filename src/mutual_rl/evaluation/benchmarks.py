"""Standalone evaluation of policies on local benchmark files (for scripts; the trainer uses the Evaluator).

A benchmark file is JSONL / JSON / Parquet with ``problem`` and ``answer`` columns (optionally a skill column;
:func:`mutual_rl.data.files.load_problems` states the exact rules). :func:`evaluate_file` runs the same protocol
as the held-out evaluation during fit (:class:`~mutual_rl.evaluation.validation.Evaluator`: k samples at
temperature 0.6 / top-p 0.95 by default, pass@1, pass@k, maj@k, greedy accuracy, per skill; answers checked with
``math_verify`` by default, which runs math-verify in a worker process with a time limit) batch by batch with a
progress bar, and the complementarity between the policies when several are given.

Example::

    from mutual_rl.evaluation.benchmarks import evaluate_file
    metrics = evaluate_file(policy, "benchmarks/math500.jsonl", reward="math_verify", k=8)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mutual_rl.data.files import load_problems
from mutual_rl.evaluation.validation import EvalConfig, Evaluator
from mutual_rl.rewards import build_reward
from mutual_rl.types import Problem


def evaluate_problems(
    policies, problems: Sequence[Problem], *, reward="math_verify", k: int = 8, temperature: float = 0.6,
    top_p: float = 0.95, max_new_tokens: int | None = None, greedy: bool = True, seed: int = 1234,
    batch_size: int = 32, engine=None, progress: bool = True, desc: str = "evaluate",
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """(``{policy: metrics}``, complementarity) of ``policies`` (one or a sequence) on ``problems``.

    reward: a registered reward name or a ``fn(completion, answer) -> float``; maj@k extracts answers by the
    reward's rule. engine: a rollout engine (default: ``HFRolloutEngine``). The training RNG state is restored
    afterwards (evaluation draws under ``seed``).
    """
    if not isinstance(policies, Sequence):
        policies = [policies]
    # by name: as in training (time limit, a custom package.module:function in its worker process)
    reward_fn = build_reward(reward) if isinstance(reward, str) else reward
    if engine is None:
        from mutual_rl.rollout.hf import HFRolloutEngine

        engine = HFRolloutEngine()
    cfg = EvalConfig(k=k, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                     greedy=greedy)
    evaluator = Evaluator(cfg, reward_fn, engine)
    evaluator.start(seed)
    bar = _progress(len(problems) * len(policies), desc, progress)
    try:
        for start in range(0, len(problems), batch_size):
            batch = list(problems[start : start + batch_size])
            for policy in policies:
                evaluator.add(policy, batch)
                bar.update(len(batch))
    finally:
        bar.close()
        results = evaluator.finish()  # also restores the RNG state on error
    return results, evaluator.complementarity()


def evaluate_file(
    policy, path: str | Path, reward="math_verify", k: int = 8, *, problem_key: str = "problem",
    answer_key: str = "answer", skill_key: str | None = None, limit: int | None = None, **kwargs,
):
    """Evaluate ``policy`` (or a sequence of policies) on the benchmark file ``path``.

    Returns the metrics dict of a single policy; for a sequence, ``{policy: metrics}`` plus the flat
    complementarity keys under ``"complementarity"``. ``limit`` keeps the first rows only. Other keyword
    arguments go to :func:`evaluate_problems` (temperature, top_p, max_new_tokens, greedy, seed, batch_size,
    engine, progress).
    """
    problems = load_problems(path, problem_key=problem_key, answer_key=answer_key, skill_key=skill_key)
    if limit is not None:
        problems = problems[:limit]
    kwargs.setdefault("desc", Path(path).name)
    results, comp = evaluate_problems(policy, problems, reward=reward, k=k, **kwargs)
    if not isinstance(policy, Sequence):
        return results[policy.name]
    return {**results, "complementarity": comp}


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="problem")
