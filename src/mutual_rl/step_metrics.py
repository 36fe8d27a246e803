"""Hygiene of the per-step training metrics: no stale values, and a warning when a policy collapses."""

from __future__ import annotations

from collections.abc import Sequence

from lightning.pytorch.utilities import rank_zero_warn

from mutual_rl.model.spec import PolicySpec
from mutual_rl.step.report import StepReport


def fill_absent(metrics: dict[str, float], seen: set[str], counts: set[str]) -> None:
    """Every key logged at an earlier step (``seen``) but absent from this step's ``metrics`` is set: counts (the
    names in ``counts``, from the report's count fields: exchange flows such as
    ``exchange/<s>-><r>/dropped/<reason>``, reward errors/timeouts) to 0.0, everything else (per-token statistics of
    the update when no token of that kind trained -- ``entropy``, ``clip_frac_*``, ``self/...``, ``peer/...``,
    ``kl`` --, THL residuals on steps that do not measure them, a regime's per-source statistics) to NaN, so a
    dashboard shows a gap. Otherwise Lightning logs the key's last value again at every later step (it keeps it in
    its result collection), which repeats a stale value in ``callback_metrics``, the progress bar and the loggers'
    files. Then adds this step's keys to ``seen``."""
    for key in seen - metrics.keys():
        metrics[key] = 0.0 if key in counts else float("nan")
    seen.update(metrics)


def warn_on_collapse(report: StepReport, specs: Sequence[PolicySpec], step: int, warned: set[str]) -> None:
    """Warn once per policy (``warned`` remembers) when it collapses: reward 0 with no response ending on EOS
    (after step 0), or token entropy below 1e-3."""
    for spec in specs:
        name = spec.name
        r = report.policies.get(name)
        if r is None:
            continue
        tokens = r.update.tokens if r.update is not None else None
        entropy = tokens.rows.entropy if tokens is not None else None
        why = None
        if step > 0 and r.scoring.reward == 0.0 and r.rollout.eos_frac == 0.0:
            why = "reward 0 and no response ends on EOS"
        elif entropy is not None and entropy == entropy and entropy < 1e-3:
            why = f"token entropy {entropy:.2g}"
        if why and name not in warned:
            warned.add(name)
            rank_zero_warn(
                f"policy {name!r} looks collapsed at step {step}: {why}. Typical causes: a learning rate too high "
                f"(optimizer.lr = {spec.optimizer.lr:g}), a reward that never fires, max_new_tokens too small for the "
                "answer; check the sample completions.")


def log_histograms(logger, hists: dict, step: int) -> None:
    """Each non-empty tensor of ``hists`` as a TensorBoard histogram (loggers without histograms: nothing)."""
    exp = getattr(logger, "experiment", None)
    if hists and hasattr(exp, "add_histogram"):
        for tag, values in hists.items():
            if values.numel():
                exp.add_histogram(tag, values, step)


def log_samples(logger, groups: dict, batch, step: int, every: int) -> None:
    """Every ``every`` steps (0 = never), a TensorBoard text table per policy: 2 responses to each of its first 4
    groups, with their rewards. A group's prompt is looked up by prompt id among the batch's problems (a group of
    DAPO dynamic sampling's extra rounds has none there: it shows its rendered prompt and no answer)."""
    exp = getattr(logger, "experiment", None)
    if not every or step % every or not hasattr(exp, "add_text"):
        return
    problems = {p.prompt_id: p for p in batch.problems}
    for name, gs in groups.items():
        rows = ["| prompt | answer | response | reward |", "|---|---|---|---|"]
        for g in list(gs)[:4]:
            problem = problems.get(g.prompt_id)
            text, answer = (problem.problem, problem.answer) if problem else (g.rollouts[0].prompt_text, "")
            for r, rew in list(zip(g.rollouts, g.rewards.tolist()))[:2]:
                rows.append(f"| `{text}` | `{answer}` | `{r.response_text!r}` | {rew:g} |")
        exp.add_text(f"{name}/samples", "\n".join(rows), step)
