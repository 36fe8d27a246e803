"""``mutual-rl compare`` runs end to end in its 2-step, 1-seed smoke mode and writes its outputs.

Every label runs in one of the tests below: the first covers the driver's outputs, graft_stored (its recording,
dependency and single-policy receiver runs), the compute table and the step-0 diagnostics; the others the
remaining labels, those that set a regime argument checked to reach the fit (each config must exist: a missing one
is reported as a skip naming the file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mutual_rl.cli import main
from mutual_rl.compare.labels import DEFAULT_LABELS, EXTRA_LABELS, LABELS, config_path, configs_dir
from mutual_rl.compare.runs import scalars
from mutual_rl.config_files import load_config

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.slow  # each test: several 2-step runs (presets built in the session's cache)

FIGURES = ("delta_pass_at_1.png", "pass_at_1_curves.png", "entropy_kl.png", "transfers.png",
           "rescue_complementarity.png", "pass_at_1_final.png", "score_vs_compute.png")
N, B, STEPS = 4, 4, 2  # smoke mode: rollouts per prompt, prompts per step, steps


def _smoke(tmp_path, labels, capsys):
    main(["compare", "--name", "smoke", "--smoke", "--results", str(tmp_path), "--regimes", *labels])
    return tmp_path / "smoke", capsys.readouterr().out


def _require_configs(labels):
    missing = [f"configs/{LABELS[lab].config}" for lab in labels if not config_path(lab).exists()]
    if missing:
        pytest.skip(f"config files not written yet: {', '.join(missing)}")


def _policy_compute(out: Path, label: str) -> dict:
    return json.loads((out / "compute.json").read_text())[label]["seeds"]["0"]


def test_compare_regimes_smoke(tmp_path, capsys):
    labels = ["grpo", "grpo_n16", "sgt", "graft", "graft_stored"]
    out, stdout = _smoke(tmp_path, labels, capsys)
    for name in ("table.md", "diagnostics.md", "summary.json", "compute.json", "curves.json", *FIGURES):
        assert (out / name).exists(), name
    table = (out / "table.md").read_text()
    for label in labels:
        assert f"| {label} |" in table, label
    assert "## gpt2" in table and "## llama" in table and "## Compute" in table
    assert "| regime | seeds |" in table and "| grpo | 1 |" in table  # the seed count of each row (1 in smoke)

    # step-0 diagnostics: printed (during the runs and at report time) and written, with the preconditions
    assert stdout.count("[compare] step-0 diagnostics:") == 2 and "[compare] step-0 evaluation of " in stdout
    for text in (stdout, table, (out / "diagnostics.md").read_text()):
        assert "pass@1 at step 0: gpt2" in text and "| gpt2->llama |" in text and "| llama->gpt2 |" in text
        assert "Benchmark preconditions" in text
    assert "**do not hold**" in table  # a 10-step warm-up solves nothing

    # graft_stored: grpo records its traffic; one receiver run per policy replays the other, after grpo is done
    runs = out / "runs"
    assert sorted(p.name for p in (runs / "grpo-s0" / "traffic").iterdir()) == [
        "step-000000.jsonl", "step-000001.jsonl"]
    lines = stdout.splitlines()
    grpo_done = next(i for i, line in enumerate(lines) if line.startswith("[compare] finished grpo-s0"))
    for me, peer in (("gpt2", "llama"), ("llama", "gpt2")):
        run = runs / f"graft_stored-{me}-s0"
        assert (run / "done.json").exists()
        assert next(i for i, line in enumerate(lines) if line.startswith(f"[compare] started {run.name}")) > grpo_done
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        assert [p["name"] for p in cfg["model"]["policies"]] == [me]
        graft = load_config(configs_dir() / "graft.yaml")["model"]["regime"].get("init_args", {})
        assert cfg["model"]["regime"] == {"class_path": "GRAFT", "init_args": {**graft, "balance": False}}
        assert cfg["trainer"]["callbacks"][-1]["init_args"] == {
            "replay_dir": str(runs / "grpo-s0" / "traffic"), "replay_policies": [peer]}
        assert cfg["data"]["seed"] == 0 and cfg["data"]["batch_size"] == B
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["graft_stored"]) == {"gpt2", "llama"}

    # compute: rollouts = n x prompts x steps; generated tokens = the logged per-step sums
    for label, n in (("grpo", N), ("grpo_n16", 16), ("sgt", N), ("graft", N), ("graft_stored", N)):
        comp = _policy_compute(out, label)
        for p in ("gpt2", "llama"):
            assert comp["policies"][p]["rollouts"] == n * B * STEPS, (label, p)
            assert comp["policies"][p]["steps"] == STEPS
        if label != "graft_stored":
            sc = scalars(runs / f"{label}-s0")
            for p in ("gpt2", "llama"):
                gen = sum(v for _, v in sc[f"{p}/generated_tokens"])
                assert comp["policies"][p]["generated_tokens"] == pytest.approx(gen)
                by_length = sum(v * n * B for _, v in sc[f"{p}/response_length"])
                assert gen == pytest.approx(by_length, rel=1e-5)
            assert comp["wall_s"] == json.loads((runs / f"{label}-s0" / "done.json").read_text())["seconds"]
    stored = _policy_compute(out, "graft_stored")
    assert stored["wall_s"] == pytest.approx(sum(
        json.loads((runs / f"graft_stored-{p}-s0" / "done.json").read_text())["seconds"] for p in ("gpt2", "llama")))
    assert f"| grpo_n16 | total | {2 * 16 * B * STEPS} |" in table

    curves = json.loads((out / "curves.json").read_text())["series"]
    assert "gpt2/rescued/llama" in curves["graft"]["0"] and "llama/rescued/gpt2" in curves["sgt"]["0"]
    assert "complementarity/gpt2->llama" in curves["grpo"]["0"]
    assert "## Transfer (SGT, GRAFT)" in (out / "diagnostics.md").read_text()

    # resumable: a second call finds every run done and only rebuilds the report
    _, stdout = _smoke(tmp_path, labels, capsys)
    assert "6 runs, 6 already done" in stdout and "[compare] started" not in stdout
    # the figures are redrawn from summary.json + compute.json + curves.json alone (no runs needed)
    for name in FIGURES:
        (out / name).unlink()
    main(["compare", "--name", "smoke", "--results", str(tmp_path), "--from-summary"])
    assert all((out / name).stat().st_size > 0 for name in FIGURES)


NEW_LABELS = ["dapo_ds", "ftis", "graft_no_peer_last", "graft_no_compat", "graft_successes"]


def test_compare_new_labels_smoke(tmp_path, capsys):
    """DAPO dynamic sampling, F-TIS and the GRAFT ablations run through the driver; dynamic sampling's extra
    rollouts are counted in the compute table."""
    _require_configs(NEW_LABELS)
    out, stdout = _smoke(tmp_path, NEW_LABELS, capsys)
    table, diag = (out / "table.md").read_text(), (out / "diagnostics.md").read_text()
    for label in NEW_LABELS:
        assert f"| {label} |" in table and (out / "runs" / f"{label}-s0" / "done.json").exists(), label
    assert "[compare] step-0 diagnostics:" in stdout
    sc = scalars(out / "runs" / "dapo_ds-s0")
    comp = _policy_compute(out, "dapo_ds")
    for p in ("gpt2", "llama"):
        extra = sum(v for _, v in sc[f"{p}/dynamic_sampling/extra_rollouts"])
        prompts = sum(v for _, v in sc[f"{p}/dynamic_sampling/extra_prompts"])
        assert extra == N * prompts
        assert comp["policies"][p]["rollouts"] == N * B * STEPS + extra
        assert comp["policies"][p]["generated_tokens"] == pytest.approx(sum(v for _, v in sc[f"{p}/generated_tokens"]))
    assert "## Dynamic sampling (DAPO)" in diag and "dynamic_sampling/extra_rollouts" in diag
    assert "## F-TIS" in diag and "| ftis | gpt2 |" in diag
    regimes = {lab: yaml.safe_load((out / "runs" / f"{lab}-s0" / "config.yaml").read_text())["model"]["regime"]
               for lab in NEW_LABELS}
    assert regimes["ftis"]["class_path"] == "FTIS"
    assert regimes["graft_no_compat"]["init_args"]["compatibility"] == "off"
    assert regimes["graft_no_peer_last"]["init_args"]["peer_last"] == "none"
    assert regimes["graft_successes"]["init_args"]["transfer"] == "successes"


REGIME_ARG_LABELS = ["graft_d09", "graft_d05", "graft_d03", "sgt_lam01", "sgt_lam03", "prp_span"]


def test_compare_regime_argument_labels_smoke(tmp_path, capsys):
    """The labels that set a regime argument over their config (GRAFT at other δ, SGT at a fixed λ, PRP's aligned
    trace at span granularity), run only when named: each runs through the driver, has its rows, and its argument
    reaches the fit, in the run's config and in the config the fit itself parsed and saved (jsonargparse's, with the
    regime's class resolved)."""
    assert set(REGIME_ARG_LABELS) == set(EXTRA_LABELS) and not set(EXTRA_LABELS) & set(DEFAULT_LABELS)
    out, _ = _smoke(tmp_path, REGIME_ARG_LABELS, capsys)
    table = (out / "table.md").read_text()
    expected = {"graft_d09": ("GRAFT", "delta", 0.9), "graft_d05": ("GRAFT", "delta", 0.5),
                "graft_d03": ("GRAFT", "delta", 0.3), "sgt_lam01": ("SGT", "coef", 0.1),
                "sgt_lam03": ("SGT", "coef", 0.3), "prp_span": ("PRP", "granularity", "span")}
    # (sgt_lam01 pins λ at 0.1, which is also sgt.yaml's today; the other five differ from their configs')
    for label, (regime, arg, value) in expected.items():
        assert f"| {label} |" in table, label
        assert dict(LABELS[label].regime_args) == {arg: value}, label
        run = out / "runs" / f"{label}-s0"
        assert (run / "done.json").exists(), label
        given = yaml.safe_load((run / "config.yaml").read_text())["model"]["regime"]
        assert given["class_path"] == regime and given["init_args"][arg] == value, (label, given)
        parsed = yaml.safe_load((run / "tb" / "version_0" / "config.yaml").read_text())["model"]["regime"]
        assert parsed["class_path"] == f"mutual_rl.regimes.{regime}", (label, parsed)
        assert parsed["init_args"][arg] == value, (label, parsed)
        assert _policy_compute(out, label)["policies"]["gpt2"]["steps"] == STEPS


def test_compare_other_labels_smoke(tmp_path, capsys):
    """The remaining labels (larger rollout budget, XGRPO, PRP, HACPO, GRAFT's §6.3 cross rules) run through the
    driver."""
    labels = ["grpo_n32", "xgrpo", "prp_snapshot", "prp_aligned", "hacpo", "graft_hacpo_rule", "graft_sgt_rule"]
    out, _ = _smoke(tmp_path, labels, capsys)
    table = (out / "table.md").read_text()
    for label in labels:
        assert f"| {label} |" in table, label
    # HACPO's ratios (logged on every update, also where no row has an advantage; PRP's peer approx-KL needs
    # trained peer tokens, which a 2-step smoke run rarely has) in the diagnostics table
    peer_rows = (out / "diagnostics.md").read_text().split("## Peer rows and HACPO's ratios")[1].split("\n## ")[0]
    assert "| L_m |" in peer_rows and "| self/clip_frac |" in peer_rows
    for label in ("hacpo", "graft_hacpo_rule"):
        assert f"| {label} | gpt2 |" in peer_rows and f"| {label} | llama |" in peer_rows, label
    assert _policy_compute(out, "grpo_n32")["policies"]["gpt2"]["rollouts"] == 32 * B * STEPS
    tested = {"grpo", "grpo_n16", "sgt", "graft", "graft_stored", *NEW_LABELS, *REGIME_ARG_LABELS, *labels}
    assert tested == set(LABELS)  # every label is exercised by one of these tests


def test_real_pair_report_runs_through_the_launcher(tmp_path, capsys):
    """``mutual-rl compare real`` on a shrunk CPU config (the real pair's own run is tests/real): one fit through
    the comparison's launcher, fit arguments after ``--``, then report.json / report.md and the figure."""
    cfg = load_config(configs_dir() / "sgt.yaml")
    for p in cfg["model"]["policies"]:
        p["warmstart"] = {**p["warmstart"], "steps": 10}
        p["sampling"] = {**p["sampling"], "n": 2}
    cfg["data"].update(batch_size=2, val_per_skill=4)
    cfg["trainer"].update(enable_progress_bar=False)
    path = tmp_path / "tiny_sgt.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = tmp_path / "real" / "sgt"
    main(["compare", "real", "--config", str(path), "--out", str(out), "--steps", "2", "--", "--model.num_threads=1"])
    rep = json.loads((out / "report.json").read_text())
    assert rep["steps"] == 2 and set(rep["policies"]) == {"gpt2", "llama"}
    for row in rep["policies"].values():
        assert row["num_problems"] == 8 and row["after_step"] >= 1 and row["pass@1_before"] is not None
    assert set(rep["crossing"]) == {"gpt2->llama", "llama->gpt2"}
    assert rep["crossing"]["gpt2->llama"]["delivered"] > 0
    assert "--model.num_threads=1" in rep["command"] and "<out>" in rep["command"]
    assert (out / "report.md").read_text() == capsys.readouterr().out.split("\n", 1)[1].rstrip("\n") + "\n"
    main(["compare", "real", "--out", str(out), "--plot", str(tmp_path / "real" / "before_after.png")])
    assert (tmp_path / "real" / "before_after.png").stat().st_size > 0
