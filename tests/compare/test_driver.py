"""The regime comparison's pieces without training: run configs and label overrides, the job plan and its
graft_stored dependency, the scheduler, the compute table's arithmetic and the step-0 diagnostics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mutual_rl.compare import labels, report, runner, step0
from mutual_rl.compare.settings import Settings
from mutual_rl.config_files import load_config


def _settings(**kw) -> Settings:
    return Settings(**{"smoke": True, "read_config": load_config, **kw})


def test_run_configs_apply_the_label_overrides(tmp_path):
    present = [lab for lab in labels.LABELS if labels.config_path(lab).exists()]
    assert {"grpo", "grpo_n16", "grpo_n32", "sgt", "graft", "graft_stored"} <= set(present)
    for job in runner.plan_jobs(present, [3], load_config):
        cfg = runner.run_config(job, _settings(), tmp_path / "runs" / job.name, tmp_path)
        pols = cfg["model"]["policies"]
        exchange = cfg["trainer"]["callbacks"][-1]
        assert exchange["class_path"] == "mutual_rl.exchange.ExperienceExchange"
        assert cfg["seed_everything"] == 3 and cfg["data"]["seed"] == 3 and cfg["data"]["batch_size"] == 4
        assert cfg["trainer"]["max_steps"] == 2
        n = {"grpo_n16": 16, "grpo_n32": 32}.get(job.label, 4)
        assert all(p["sampling"]["n"] == n for p in pols), job.name
        if job.label == "grpo":
            assert exchange["init_args"] == {"store_dir": str(tmp_path / "runs" / "grpo-s3" / "traffic")}
        elif job.label == "graft_stored":
            assert [p["name"] for p in pols] == [job.receiver]
            other = {"gpt2": "llama", "llama": "gpt2"}[job.receiver]
            assert exchange["init_args"] == {"replay_dir": str(tmp_path / "runs" / "grpo-s3" / "traffic"),
                                             "replay_policies": [other]}
            graft = load_config(labels.configs_dir() / "graft.yaml")["model"]["regime"]
            assert cfg["model"]["regime"] == {"class_path": "GRAFT",
                                              "init_args": {**graft.get("init_args", {}), "balance": False}}
        else:
            assert "init_args" not in exchange and len(pols) == 2
    if "dapo_ds" in present:
        job = runner.Job("dapo_ds", 0)
        assert runner.run_config(job, _settings(), tmp_path / "d", tmp_path)["model"]["algorithm"]["dynamic_sampling"]


def test_plan_adds_the_recording_run_and_the_dependency():
    jobs = runner.plan_jobs(["sgt", "graft_stored"], [0, 1], load_config)
    assert [j.name for j in jobs] == ["grpo-s0", "sgt-s0", "graft_stored-gpt2-s0", "graft_stored-llama-s0",
                                      "grpo-s1", "sgt-s1", "graft_stored-gpt2-s1", "graft_stored-llama-s1"]
    assert jobs[2].deps == ("grpo-s0",) and jobs[7].deps == ("grpo-s1",) and jobs[1].deps == ()
    assert len(runner.plan_jobs(list(labels.LABELS), [0], load_config)) == len(labels.LABELS) + 1  # one extra: two receiver runs
    dirs = runner.run_dirs(["graft_stored"], [0], Path("/r"), load_config)
    assert dirs == {("graft_stored", 0): [("gpt2", Path("/r/runs/graft_stored-gpt2-s0")),
                                          ("llama", Path("/r/runs/graft_stored-llama-s0"))]}


def test_the_default_config_reader_merges_the_base_chain():
    """Settings read configs as `mutual-rl fit --config` does (mutual_rl.config_files, not the CLI module)."""
    cfg = Settings(regimes=["sgt"]).reader()(labels.config_path("sgt"))
    assert "base" not in cfg and cfg["model"]["regime"]["class_path"] == "SGT"
    assert [p["name"] for p in cfg["model"]["policies"]] == ["gpt2", "llama"]  # from base.yaml


def test_missing_config_is_a_clear_error(monkeypatch):
    future = labels.Label("future", "does_not_exist.yaml", "a config not written yet", "#123456", "o")
    monkeypatch.setitem(labels.LABELS, "future", future)
    with pytest.raises(SystemExit, match=r"missing config file.*future: configs/does_not_exist\.yaml"):
        labels.check_configs(["grpo", "future"])
    labels.check_configs(["grpo", "graft_stored"])


def test_scheduler_starts_receivers_only_after_the_recording(tmp_path, monkeypatch):
    events: list[str] = []

    class FakeProc:
        def __init__(self, job, polls):
            self.job, self.run_dir, self.t0, self.prior, self.returncode = job, tmp_path / "runs" / job.name, 0.0, 0.0, 0
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.polls = polls

        def poll(self):
            self.polls -= 1
            if self.polls > 0:
                return None
            events.append(f"end {self.job.name}")
            return 0

    def fake_launch(job, args, root):
        assert all((root / "runs" / d / "done.json").exists() for d in job.deps), job.name
        events.append(f"start {job.name}")
        return FakeProc(job, polls=6 if job.label == "grpo" else 1)

    monkeypatch.setattr(runner, "launch", fake_launch)
    monkeypatch.setattr(runner, "print_step0_if_ready", lambda dirs: False)
    args = _settings(regimes=["grpo", "graft_stored", "sgt", "graft"], seeds=[0], parallel=2)
    runner.run_all(args, tmp_path, poll_s=0)
    starts = [e for e in events if e.startswith("start")]
    assert starts[:2] == ["start grpo-s0", "start sgt-s0"]  # receivers skipped while grpo runs
    grpo_end = events.index("end grpo-s0")
    assert events.index("start graft_stored-gpt2-s0") > grpo_end
    assert events.index("start graft_stored-llama-s0") > grpo_end
    assert events.index("start graft-s0") < grpo_end  # independent runs are not held back
    assert all(json.loads((tmp_path / "runs" / j.name / "done.json").read_text())["seconds"] >= 0
               for j in runner.plan_jobs(args.regimes, [0], load_config))


def test_receiver_refuses_an_incomplete_recording(tmp_path):
    from mutual_rl.exchange.store import step_path

    traffic = tmp_path / "traffic"
    traffic.mkdir()
    step_path(traffic, 0).write_text("")
    with pytest.raises(SystemExit, match="lacks 1 of 2 step files"):
        runner.check_traffic(traffic, 2, runner.Job("graft_stored", 0, receiver="gpt2"))
    step_path(traffic, 1).write_text("")
    runner.check_traffic(traffic, 2, runner.Job("graft_stored", 0, receiver="gpt2"))


def test_compute_sums_steps_once_and_counts_extra_rollouts():
    rep = report
    sc = {  # step 1 logged twice (a resumed run): counted once, the last value
        "a/reward": [(0, 0.0), (1, 0.5), (1, 0.5), (2, 1.0)],
        "a/generated_tokens": [(0, 100.0), (1, 999.0), (1, 120.0), (2, 80.0)],
        "a/trained_tokens": [(0, 10.0), (1, 20.0), (2, 30.0)],
        "a/dynamic_sampling/extra_rollouts": [(0, 16.0), (1, 0.0), (2, 32.0)],
        "a/gen_s": [(0, 1.0), (1, 1.0), (2, 1.0)], "a/train_s": [(0, 0.5), (1, 0.5), (2, 0.5)],
        "b/reward": [(0, 0.0), (1, 0.0), (2, 0.0)],
        "b/response_length": [(0, 5.0), (1, 6.0), (2, 7.0)],  # no generated_tokens: length x n x prompts
    }
    out = rep.compute_of(sc, {"n": {"a": 8, "b": 4}, "batch": 16, "seconds": 42.0})
    assert out["wall_s"] == 42.0
    a, b = out["policies"]["a"], out["policies"]["b"]
    assert a == {"steps": 3, "rollouts": 8 * 16 * 3 + 48, "generated_tokens": 300.0, "trained_tokens": 60.0,
                 "policy_s": 4.5}
    assert b["rollouts"] == 4 * 16 * 3 and b["generated_tokens"] == (5 + 6 + 7) * 4 * 16
    lines = rep.compute_lines({"x": {"seeds": {"0": out}}}, ["x"])
    assert "| x | a | 432 | 300 | 60 | 4.5 |  |" in lines
    assert "| x | total | 624 | 1452 | 60 | 4.5 | 42 |" in lines


def test_step0_diagnostics_and_preconditions():
    rep = step0

    def run(pa, pb, comp_ab, comp_ba):
        sc = {"a/val/pass@1": [(0, pa), (0, 0.9), (5, 0.9)], "b/val/pass@1": [(0, pb), (5, 0.1)]}
        for d, c in (("a->b", comp_ab), ("b->a", comp_ba)):
            sc[f"complementarity/{d}"] = [(0, c), (5, 0.0)]
            sc[f"complementarity/{d}/mixed_frac"] = [(0, c / 2)]
            sc[f"complementarity/{d}/all_pass_frac"] = [(0, c / 2)]
            sc[f"complementarity/{d}/all_fail"] = [(0, 40.0)]
            sc[f"complementarity/{d}/solved"] = [(0, 40.0 * c)]
        return sc

    assert rep.step0_of({"a/val/pass@1": [(0, 0.3)]}) is None
    data = {("grpo", 0): run(0.3, 0.5, 0.4, 0.5), ("sgt", 0): run(0.9, 0.9, 0.0, 0.0),
            ("grpo", 1): run(0.5, 0.3, 0.6, 0.5)}
    s0 = rep.step0_summary(data, ["grpo", "sgt"])
    assert s0["seeds"] == [0, 1] and s0["pass@1"]["a"] == [0.3, 0.5]  # the first value at step 0, grpo's run
    ok, why = rep.preconditions(s0)
    assert ok and not why
    text = "\n".join(rep.step0_lines(s0))
    assert "| a->b | 50.0 ± 14.1 % | 25.0 ± 7.1 % | 25.0 ± 7.1 % | 40 | 20 |" in text
    assert "pass@1 at step 0: a 40.0 ± 14.1 %, b 40.0 ± 14.1 %" in text and "**hold**" in text
    bad = rep.step0_summary({("grpo", 0): run(0.1, 0.7, 0.2, 0.5)}, ["grpo"])
    ok, why = rep.preconditions(bad)
    assert not ok and len(why) == 3 and "complementarity a->b 20.0 % < 30 %" in why
    assert "**do not hold**" in "\n".join(rep.step0_lines(bad))


def test_curves_keep_rescue_and_complementarity_series():
    keep = report.keep_curve
    pols = ["gpt2", "llama"]
    assert keep("gpt2/rescued/llama", pols) and keep("llama/rescued", pols) and keep("gpt2/val/pass@1", pols)
    assert keep("complementarity/gpt2->llama", pols) and keep("complementarity/gpt2->llama/mixed_frac", pols)
    assert keep("exchange/gpt2->llama/consumed", pols)
    assert not keep("complementarity/gpt2->llama/all_fail", pols) and not keep("gpt2/gen_s", pols)


def test_benchmark_v4_overlay_and_regime_args(tmp_path):
    """--benchmark v4 merges configs/v4.yaml over each label's config (the task replaced whole, the policies list
    replaced), keeping the label's regime; regime_args labels set the regime's arguments over the config's."""
    v4 = load_config(labels.configs_dir() / "v4.yaml")
    for label, regime, args in (("sgt_lam01", "SGT", {"coef": 0.1}), ("graft_d05", "GRAFT", {"delta": 0.5}),
                                ("graft", "GRAFT", {"delta": 0.8})):
        cfg = runner.run_config(runner.Job(label, 0), _settings(benchmark="v4"), tmp_path / label, tmp_path)
        assert cfg["data"]["task"] == v4["data"]["task"]
        assert cfg["data"]["task"]["class_path"] == "mutual_rl.data.chain.ChainTask"
        assert [p["sampling"]["max_new_tokens"] for p in cfg["model"]["policies"]] == [40, 40]
        assert [p["warmstart"]["skills"] for p in cfg["model"]["policies"]] == [["add"], ["sub"]]
        assert cfg["model"]["regime"]["class_path"] == regime
        assert cfg["model"]["regime"].get("init_args") == args
    v3 = runner.run_config(runner.Job("graft_d03", 0), _settings(), tmp_path / "d03", tmp_path)
    assert v3["model"]["regime"]["init_args"] == {"delta": 0.3} and "digits" in v3["data"]["task"]
    with pytest.raises(SystemExit, match="unknown benchmark 'v9'; the benchmarks: v3, v4"):
        _settings(benchmark="v9")


@pytest.mark.slow
def test_benchmark_v4_run_config_parses_as_fit_reads_it(tmp_path, capsys):
    import yaml

    from mutual_rl.cli import main

    cfg = runner.run_config(runner.Job("graft_d05", 0), _settings(benchmark="v4"), tmp_path / "r", tmp_path)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(path), "--print_config"])
    assert exc.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    task = printed["data"]["task"]  # the parsed ChainTask, printed by its fields
    assert task["terms"] == 3 and task["max_value"] == 99 and "digits" not in task
    assert printed["model"]["regime"]["init_args"]["delta"] == 0.5
