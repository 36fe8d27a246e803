"""Held-out evaluation during fit and in ``mutual-rl validate``.

Per policy and problem: ``k`` sampled responses (papers' protocol: temperature 0.6, top-p 0.95, k = 8) scored by
the run's reward (correct iff reward > 0; with a weighted list of terms, iff the *first* term's value is > 0 --
:mod:`mutual_rl.rewards.combined`), plus, with ``greedy``, one greedy response. ``temperature: 0`` is greedy
decoding: the k samples are the one greedy response (so pass@1 = pass@k = maj@k = greedy accuracy; decoded once
and reused for ``greedy``). Metrics per policy, overall and per skill (``<metric>/<skill>``, skill ``""`` shown as
``other``; only when problems carry skills):

* ``pass@1``: mean over the k samples, then over problems; ``pass@k``: unbiased ``1 - C(n-c, k)/C(n, k)``;
* ``maj@k``: majority vote over the answers extracted with the reward's own rule
  (:mod:`mutual_rl.evaluation.answers`; ties share credit, no-answer samples do not vote);
* ``greedy``: accuracy of the greedy response (:mod:`mutual_rl.evaluation.greedy`; through the rollout engine
  when it decodes greedily itself -- ``VLLMRolloutEngine.generate_greedy`` -- else Hugging Face ``generate``);
* ``boxed_rate``: the share of the k samples with exactly one closed ``\\boxed{...}`` (the ``boxed_format`` rule,
  whatever the reward), mean over problems -- the format rate of chat tasks;
* ``num_problems``.

Across policies (:meth:`Evaluator.complementarity`, after :meth:`Evaluator.finish`): for every ordered pair
(A, B), the share of A's all-fail problems (no correct sample of k) that B solves (GRAFT Fig. 1), on the problems
both were evaluated on; see :mod:`mutual_rl.evaluation.complementarity` for the keys.

Accumulation uses torchmetrics states reduced by sum, so under a distributed strategy each rank evaluates its
shard and ``finish()`` returns the metrics over all problems of all ranks (every rank must call ``finish()``).
Sampling runs under its own seed and the training RNG state is restored afterwards, so evaluating changes nothing
in training (a resumed run and an uninterrupted one draw the same rollouts); greedy decoding draws nothing.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

import torch

from mutual_rl.distributed import collective_device, gather_objects
from mutual_rl.evaluation.answers import answer_extractor
from mutual_rl.evaluation.complementarity import complementarity_table
from mutual_rl.evaluation.greedy import greedy_generate
from mutual_rl.evaluation.metrics import (
    ComplementarityCounts,
    PassAtK,
    ProblemCount,
    ProblemMean,
    majority_correct,
)
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.names import PASS1, VAL_MEAN, policy, val, val_metric, val_metrics
from mutual_rl.rewards.combined import as_reward
from mutual_rl.rewards.integer import boxed_format


@dataclass
class EvalConfig:
    """Held-out evaluation protocol."""

    k: int = 8
    """Samples per problem."""
    temperature: float = 0.6
    """Sampling temperature of the k samples; 0 = greedy decoding (the k samples are the greedy response)."""
    top_p: float = 0.95
    """Nucleus sampling mass of the k samples (unused when temperature is 0)."""
    max_new_tokens: int | None = None
    """Default: each policy's own sampling.max_new_tokens."""
    seed: int = 1234
    """Seed of evaluation sampling (independent of training)."""
    greedy: bool = True
    """Also decode one greedy response per problem and report greedy accuracy (greedy)."""
    greedy_batch_size: int = 64
    """Problems per greedy generate call."""

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"evaluation.k must be >= 1 (got {self.k}).")
        if self.temperature < 0:
            raise ValueError(f"evaluation.temperature must be >= 0 (got {self.temperature}); 0 decodes greedily.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"evaluation.top_p must be in (0, 1] (got {self.top_p}).")
        if self.greedy_batch_size < 1:
            raise ValueError(f"evaluation.greedy_batch_size must be >= 1 (got {self.greedy_batch_size}).")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"evaluation.max_new_tokens must be >= 1 or null (got {self.max_new_tokens}); null "
                             "uses each policy's own sampling.max_new_tokens.")


@dataclass(frozen=True)
class ProblemResult:
    """One policy's outcome on one problem: ``c`` correct of ``n`` samples, maj@k score, greedy verdict."""

    prompt_id: int
    skill: str
    n: int
    c: int
    maj: float
    greedy: float | None
    boxed: float = 0.0  # fraction of the samples with exactly one closed \boxed{} (rewards.boxed_format)


class Evaluator:
    """``start(seed)``, then ``add(policy, problems)`` per batch and policy, then ``finish()`` (module docstring).

    Args:
        cfg: the protocol.
        reward_fn: the run's :class:`~mutual_rl.rewards.combined.Reward`, a guard, or a plain text-style
            ``fn(completion, answer) -> float`` or TRL-style function (run without a time limit, results checked); a
            sample is correct iff the (first term's) reward is > 0.
        engine: rollout engine (``generate(policy, problems, sampling, step=...)``).
        extract_answer: answer extraction for maj@k (default: the reward's own, by its name; see ``answers``).
    """

    def __init__(self, cfg: EvalConfig, reward_fn, engine, extract_answer=None):
        self.cfg, self.reward_fn, self.engine = cfg, as_reward(reward_fn, timeout_s=None), engine
        self.extract_answer = extract_answer or answer_extractor(self.reward_fn)
        self._results: dict[str, list[ProblemResult]] = defaultdict(list)
        self._devices: dict[str, torch.device] = {}
        self._complementarity: dict[str, float] = {}
        self._saved = None

    def start(self, seed: int) -> None:
        # torch.manual_seed also seeds the accelerator's generators: save and restore those too, so an evaluation
        # leaves every rank's own training stream where it was
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        self._saved = (torch.get_rng_state(), random.getstate(), cuda)
        torch.manual_seed(seed)
        random.seed(seed)
        self._results = defaultdict(list)
        self._devices = {}
        self._complementarity = {}

    def _greedy(self, policy, problems, max_new: int) -> list[str]:
        """Greedy texts through the engine when it decodes greedily itself (vLLM), else Hugging Face ``generate``."""
        through_engine = getattr(self.engine, "generate_greedy", None)
        texts = None if through_engine is None else through_engine(policy, problems, max_new)
        if texts is not None:  # None: the engine does not decode greedily itself (rollout_engine auto with HF)
            return texts
        return greedy_generate(policy, problems, max_new, self.cfg.greedy_batch_size)

    def add(self, policy, problems) -> None:
        s = policy.spec.sampling
        max_new = self.cfg.max_new_tokens or s.max_new_tokens
        greedy = None
        if self.cfg.temperature == 0:  # greedy decoding: k identical samples, decoded once
            greedy = self._greedy(policy, problems, max_new)
            samples = [[g] * self.cfg.k for g in greedy]
        else:
            sampling = SamplingSpec(n=self.cfg.k, temperature=self.cfg.temperature, top_p=self.cfg.top_p, top_k=0,
                                    max_new_tokens=max_new)
            groups = self.engine.generate(policy, problems, sampling, step=-1)
            samples = [[r.response_text for r in rollouts] for rollouts in groups]
        if not self.cfg.greedy:
            greedy = [None] * len(problems)
        elif greedy is None:
            greedy = self._greedy(policy, problems, max_new)
        self._devices[policy.name] = policy.device
        for problem, texts, g in zip(problems, samples, greedy):
            # each distinct text scored once (greedy decoding: k copies of one), in one call with the greedy response
            distinct = list(dict.fromkeys([*texts, *([] if g is None else [g])]))
            where = f"evaluating policy {policy.name!r}, prompt {problem.prompt_id}"
            verdicts = dict(zip(distinct, self.reward_fn.correct(problem, distinct, where=where)))
            correct = [verdicts[t] for t in texts]
            maj = majority_correct([self.extract_answer(t) for t in texts], correct)
            g_ok = None if g is None else float(verdicts[g])
            boxed = sum(boxed_format(t, "") for t in texts) / len(texts)
            self._results[policy.name].append(
                ProblemResult(problem.prompt_id, problem.skill, len(texts), sum(correct), maj, g_ok, boxed))

    def finish(self) -> dict[str, dict[str, float]]:
        """``{policy: {metric: value}}`` over all problems added since ``start`` (all ranks)."""
        if self._saved is not None:
            torch.set_rng_state(self._saved[0])
            random.setstate(self._saved[1])
            if self._saved[2] is not None:
                torch.cuda.set_rng_state_all(self._saved[2])
            self._saved = None
        local_skills = {name: sorted({r.skill for r in rs}) for name, rs in self._results.items()}
        skills = _union(local_skills)  # same keys on every rank, so every rank reduces the same metrics
        out: dict[str, dict[str, float]] = {}
        for name in sorted(skills):
            rows = self._results.get(name, [])
            device = self._devices.get(name, _default_device())
            m: dict[str, float] = {}
            for skill in [None, *(skills[name] if skills[name] != [""] else [])]:
                sel = [r for r in rows if skill is None or r.skill == skill]
                part = None if skill is None else skill or "other"
                m.update({val_metric(key, part): v for key, v in self._reduce(sel, device).items()})
            out[name] = m
        self._complementarity = self._reduce_complementarity(sorted(skills))
        return out

    def logged_metrics(self) -> dict[str, float]:
        """Finish the evaluation: ``<policy>/val/<metric>``, complementarity (NaN-free) and ``val_pass@1`` (the mean
        pass@1 over the policies)."""
        results = self.finish()
        flat = {policy(p, val(k)): v for p, ms in results.items() for k, v in ms.items()}
        flat.update({k: v for k, v in self.complementarity().items() if v == v})
        if results:
            flat[VAL_MEAN] = sum(ms[PASS1] for ms in results.values()) / len(results)
        return flat

    def complementarity(self) -> dict[str, float]:
        """Flat ``complementarity/<A>-><B>`` (+ ``/all_fail``, ``/solved``, ``/mixed_frac``, ``/all_pass_frac``)
        of the last ``finish()``; empty for fewer than two policies."""
        return dict(self._complementarity)

    # ------------------------------------------------------------------------------------------ internals
    def _reduce(self, rows: list[ProblemResult], device) -> dict[str, float]:
        k = self.cfg.k
        n = torch.tensor([r.n for r in rows], dtype=torch.long)
        c = torch.tensor([r.c for r in rows], dtype=torch.long)
        pass1, pass_k, maj, boxed, *greedy, count = val_metrics(k, self.cfg.greedy)  # the logged names
        metrics = {pass1: PassAtK(1), pass_k: PassAtK(k), maj: ProblemMean(), boxed: ProblemMean(),
                   **{g: ProblemMean() for g in greedy}, count: ProblemCount()}
        metrics = {key: mt.to(device) for key, mt in metrics.items()}
        metrics[pass1].update(n, c)
        metrics[pass_k].update(n, c)
        metrics[maj].update(torch.tensor([r.maj for r in rows], dtype=torch.float64))
        metrics[boxed].update(torch.tensor([r.boxed for r in rows], dtype=torch.float64))
        for g in greedy:
            metrics[g].update(torch.tensor([r.greedy for r in rows if r.greedy is not None], dtype=torch.float64))
        metrics[count].update(torch.ones(len(rows), dtype=torch.float64))
        return {key: float(mt.compute()) for key, mt in metrics.items()}

    def _reduce_complementarity(self, names: list[str]) -> dict[str, float]:
        if len(names) < 2:
            return {}
        by_policy = {name: {r.prompt_id: (r.c, r.n) for r in self._results.get(name, [])} for name in names}
        common = sorted(set.intersection(*(set(v) for v in by_policy.values())))
        table = torch.tensor([[by_policy[n][i] for n in names] for i in common], dtype=torch.long)
        table = table.reshape(-1, len(names), 2)
        metric = ComplementarityCounts(len(names)).to(self._devices.get(names[0], _default_device()))
        metric.update(table[..., 0], table[..., 1])
        all_fail, solved, all_pass = metric.compute()
        return complementarity_table(names, all_fail.cpu(), solved.cpu(), all_pass.cpu())


def _default_device() -> torch.device:
    """Where a policy with no results on this rank reduces its metrics: the device collectives need."""
    return collective_device()


def _union(local: dict[str, list[str]]) -> dict[str, list[str]]:
    """Union over ranks of ``{policy: skills}`` (identity without a process group)."""
    merged: dict[str, set[str]] = defaultdict(set)
    for part in gather_objects(local):
        for name, skills in part.items():
            merged[name].update(skills)
    return {name: sorted(s) for name, s in merged.items()}
