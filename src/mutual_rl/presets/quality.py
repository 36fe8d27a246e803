"""The quality report of a preset build: held-out greedy accuracy and pass@1 per skill, checked against a range.

Measured once, right after the warm-up, with the trainer's evaluation protocol
(:func:`mutual_rl.evaluation.benchmarks.evaluate_problems`: ``k = 8`` samples at temperature 0.6, top-p 0.95,
evaluation seed 1234, plus one greedy completion) on the task's whole held-out split, prompts rendered and encoded
as the policy will (its ``prompt_template`` and ``chat_template``), answers checked by the task's default reward.
``max_new_tokens`` is the longest target in tokens plus 4. The report is printed, stored in the preset folder's
``done.json`` under ``"quality"`` and shown again (one line) whenever the cached preset is loaded.

``WarmStart.expect`` (``{skill: [low, high]}`` of pass@1) turns the report into a check: a skill outside its
range (or missing from the report) gives one warning naming the preset, the skill, the value and the range. A
build is deterministic on one machine (one torch thread, seeded initialisation and data order); across machines
floating-point kernels may differ in the last bits, and the range is how a user learns that a build landed
elsewhere than it should.

``MUTUAL_RL_PRESET_REPORT=0`` skips the report (and so the ``expect`` check): the test suite sets it, because on
a 151k-token vocabulary (``tiny:qwen-vocab``) the report's ~7,000 sampled completions take minutes.
"""

from __future__ import annotations

import logging
import sys
import warnings

log = logging.getLogger(__name__)

K, TEMPERATURE, TOP_P, SEED = 8, 0.6, 0.95, 1234


def quality_report(model, tokenizer, task, *, name: str, prompt_template: str, chat_template: bool) -> dict:
    """``{"k", "temperature", "top_p", "problems", "overall": {"greedy", "pass@1"}, "skills": {skill: {...}}}`` of
    ``model`` on ``task``'s held-out problems (module docstring). Leaves the model in eval mode and the global
    random state as it was."""
    from mutual_rl.evaluation.benchmarks import evaluate_problems

    problems = task.heldout_problems()
    longest = max(len(tokenizer(task.target_text(p), add_special_tokens=False)["input_ids"]) for p in problems)
    max_new = longest + 4
    policy = BuildPolicy(name, model, tokenizer, prompt_template, chat_template, max_new)
    try:
        results, _ = evaluate_problems(policy, problems, reward=task.default_reward, k=K, temperature=TEMPERATURE,
                                       top_p=TOP_P, max_new_tokens=max_new, seed=SEED, progress=False)
    finally:
        model.eval()
    m = results[name]
    skills = sorted({p.skill for p in problems if p.skill})
    return {
        "k": K, "temperature": TEMPERATURE, "top_p": TOP_P, "problems": len(problems),
        "overall": {"greedy": m["greedy"], "pass@1": m["pass@1"]},
        "skills": {s: {"greedy": m[f"greedy/{s}"], "pass@1": m[f"pass@1/{s}"],
                       "problems": int(m[f"num_problems/{s}"])} for s in skills},
    }


class BuildPolicy:
    """What evaluation reads of a policy, for a model that is not a policy yet (presets must not import
    ``model.policy``, which loads presets): name, model, tokenizer, device, prompt rendering and encoding exactly
    as :class:`~mutual_rl.model.policy.Policy` does without prompt truncation, sampling settings."""

    version = 0

    def __init__(self, name, model, tokenizer, prompt_template: str, chat_template: bool, max_new_tokens: int):
        from mutual_rl.model.spec import SamplingSpec

        self.name, self.model, self.tokenizer = name, model, tokenizer
        self._template, self._chat = prompt_template, chat_template
        self.spec = type("BuildSpec", (), {"sampling": SamplingSpec(max_new_tokens=max_new_tokens)})()

    @property
    def device(self):
        return next(self.model.parameters()).device

    def render_prompt(self, problem: str) -> str:
        return self._template.replace("{problem}", problem)

    def encode_prompt(self, text: str) -> list[int]:
        from mutual_rl.thl.retokenize import prompt_ids

        return prompt_ids(self.tokenizer, text, chat_template=self._chat)


def format_report(preset: str, report: dict) -> str:
    """One line: ``tiny:gpt2-bpe held-out (k=8, T=0.6): add pass@1 41.2 % greedy 63.0 % | ...``."""
    parts = [f"{s} pass@1 {100 * v['pass@1']:.1f} % greedy {100 * v['greedy']:.1f} %"
             for s, v in report["skills"].items()]
    overall = report["overall"]
    parts.append(f"all pass@1 {100 * overall['pass@1']:.1f} % greedy {100 * overall['greedy']:.1f} %")
    return f"{preset} held-out (k={report['k']}, T={report['temperature']}): " + " | ".join(parts)


def out_of_range(report: dict, expect: dict[str, list[float]] | None) -> list[str]:
    """One message per skill of ``expect`` whose pass@1 in ``report`` lies outside ``[low, high]`` (or is absent)."""
    problems = []
    for skill, (low, high) in (expect or {}).items():
        got = report["skills"].get(skill)
        if got is None:
            problems.append(f"skill {skill!r} is not in the report (skills: {sorted(report['skills'])})")
        elif not low <= got["pass@1"] <= high:
            problems.append(f"{skill} pass@1 {got['pass@1']:.3f} outside the expected [{low}, {high}]")
    return problems


def announce(preset: str, report: dict, expect: dict[str, list[float]] | None, *, built: bool,
             shipped: bool = False) -> None:
    """Print the report after a build or when the preset ships with the package (log it at INFO when loaded from
    the cache) and warn when it is out of range."""
    line = format_report(preset, report)
    if built or shipped:
        print(f"[mutual-rl] {'built' if built else 'shipped'} {line}", file=sys.stderr, flush=True)
    else:
        log.info("cached %s", line)
    bad = out_of_range(report, expect)
    if bad:
        warnings.warn(
            f"preset {preset}: the warm-up landed outside warmstart.expect: {'; '.join(bad)}. RL results will not "
            "match those measured on this configuration; check the torch version and warmstart settings, or "
            "adjust warmstart (steps, lr, other_skill_fraction) or expect.", UserWarning, stacklevel=2)
