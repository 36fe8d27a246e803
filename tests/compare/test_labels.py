"""The label table: every label's config is shipped as package data and parses as ``mutual-rl fit`` reads it,
every label is drawn in its own colour, and ``mutual-rl compare --list`` prints them all."""

from __future__ import annotations

from importlib.resources import files

import pytest

from mutual_rl.cli import main
from mutual_rl.compare import labels
from mutual_rl.compare.labels import LABELS, Label
from mutual_rl.config_files import load_config


def test_label_records_are_complete_and_in_table_order():
    assert list(LABELS)[:4] == ["grpo", "grpo_n16", "grpo_n32", "dapo_ds"]
    assert list(LABELS)[-1] == "graft_stored" and len(LABELS) == 23
    assert {n: dict(lab.regime_args) for n, lab in LABELS.items() if lab.regime_args} == {
        "graft_d09": {"delta": 0.9}, "graft_d05": {"delta": 0.5}, "graft_d03": {"delta": 0.3}, "sgt_lam01": {"coef": 0.1},
        "sgt_lam03": {"coef": 0.3}, "prp_span": {"granularity": "span"}}
    assert labels.DEFAULT_LABELS == tuple(n for n in LABELS if n not in labels.EXTRA_LABELS)
    assert len(labels.DEFAULT_LABELS) == 17
    assert {"graft_stored", "ftis", "graft_no_peer_last", "graft_no_compat", "graft_successes"} <= set(LABELS)
    for name, lab in LABELS.items():
        assert isinstance(lab, Label) and lab.name == name
        assert lab.style in ("-", "--", "-.", ":") and lab.marker and lab.what
    assert [lab.name for lab in LABELS.values() if lab.stored] == ["graft_stored"]
    assert {n: lab.n for n, lab in LABELS.items() if lab.n} == {"grpo_n16": 16, "grpo_n32": 32}
    with pytest.raises(AttributeError):  # frozen: one place to change a label
        LABELS["grpo"].color = "#ffffff"  # type: ignore[misc]


def test_every_label_has_a_distinct_colour():
    colours = [lab.color for lab in LABELS.values()]
    assert len(set(colours)) == len(colours) == len(LABELS)
    assert all(c.startswith("#") and len(c) == 7 for c in colours)
    assert labels.color("grpo") == "#404040" and labels.color("graft") == "#9467bd"
    assert labels.color("not-a-label") == labels.DEFAULT_COLOR  # a real-pair run folder named otherwise


@pytest.mark.parametrize("name", list(LABELS))
def test_every_label_config_is_packaged_and_parses(name):
    packaged = files("mutual_rl") / "configs" / LABELS[name].config
    assert packaged.is_file(), f"{name}: {LABELS[name].config} is not shipped in mutual_rl/configs"
    assert labels.config_path(name).read_text() == packaged.read_text()
    cfg = load_config(labels.config_path(name))  # base.yaml merged in, as `mutual-rl fit --config` reads it
    assert [p["name"] for p in cfg["model"]["policies"]] == ["gpt2", "llama"]
    assert cfg["model"]["regime"]["class_path"] and cfg["data"]["batch_size"] == 32
    expected = {"grpo": "NoSharing", "dapo_ds": "NoSharing", "xgrpo": "XGRPO", "prp_snapshot": "PRP",
                "prp_aligned": "PRP", "prp_span": "PRP", "sgt": "SGT", "sgt_lam01": "SGT", "sgt_lam03": "SGT", "hacpo": "HACPO",
                "ftis": "FTIS"}
    regime = cfg["model"]["regime"]["class_path"].rsplit(".", 1)[-1]
    assert regime == expected.get(name.removesuffix("_n16").removesuffix("_n32"), "GRAFT"), name


def test_the_packaged_configs_are_the_repository_configs():
    """``mutual_rl/configs`` is the repository's ``configs/`` (a link in a checkout, a copy in a wheel)."""
    root = labels.configs_dir()
    assert {p.name for p in root.glob("*.yaml")} >= {lab.config for lab in LABELS.values()} | {"base.yaml"}
    assert (root / "real" / "sgt.yaml").is_file() and (root / "real" / "base.yaml").is_file()


def test_shipped_config_names_resolve_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert labels.resolve_config("configs/real/sgt.yaml") == labels.configs_dir() / "real" / "sgt.yaml"
    assert labels.resolve_config("real/grpo.yaml") == labels.configs_dir() / "real" / "grpo.yaml"
    (tmp_path / "mine.yaml").write_text("base: x\n")
    assert labels.resolve_config("mine.yaml") == tmp_path / "mine.yaml"  # a file given wins
    with pytest.raises(SystemExit, match="no such file"):
        labels.resolve_config("configs/real/nope.yaml")


def test_list_prints_every_label_with_its_config(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the packaged ones are listed
    main(["compare", "--list"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(LABELS)
    for line, lab in zip(lines, LABELS.values()):
        assert line.split()[0] == lab.name and f"configs/{lab.config}" in line and lab.what in line
    assert "grpo_n16             configs/grpo.yaml, n = 16: GRPO with 16 rollouts" in lines[1]
    assert lines[-1].startswith("graft_stored         configs/graft.yaml, stored peers: GRAFT with stored peers")
    assert not (tmp_path / "results").exists()  # --list writes nothing
