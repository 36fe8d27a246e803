"""The papers' orderings checked against a comparison (``mutual_rl.compare.claims``): hand-derived Δ, SE and
verdicts, which claims get rows, and the section in ``table.md``."""

from __future__ import annotations

import math

import pytest

from mutual_rl.compare import report
from mutual_rl.compare.claims import CLAIMS, Claim, claim_lines, claim_rows, verdict
from mutual_rl.compare.labels import LABELS

NAN = float("nan")


def _cell(values):
    return {"pass@1": {"values": values, "seeds": list(range(len(values))), "start": 0.35}}


def test_every_claim_names_two_labels_of_the_driver_and_a_known_relation():
    for c in CLAIMS:
        assert c.a in LABELS and c.b in LABELS and c.a != c.b, c
        assert c.relation in (">", ">=", "~") and c.source in ("GRAFT", "Mutual RL") and c.says, c
    assert len({(c.a, c.b) for c in CLAIMS}) == len(CLAIMS)  # no pair stated twice


@pytest.mark.parametrize("relation, delta, se, want", [
    (">", 3.0, 1.0, "holds"), (">", 2.0, 1.0, "not resolved"), (">", -2.1, 1.0, "reversed"),
    (">", 0.0, 0.0, "not resolved"),
    (">=", 2.1, 1.0, "holds"), (">=", -1.9, 1.0, "consistent"), (">=", -2.1, 1.0, "fails"),
    ("~", 1.9, 1.0, "consistent"), ("~", -2.1, 1.0, "fails"),
    (">", 5.0, NAN, "n/a (1 seed)"), ("~", NAN, NAN, "n/a (1 seed)"),
])
def test_verdicts_at_and_around_two_standard_errors(relation, delta, se, want):
    assert verdict(relation, delta, se) == want


def test_unknown_relation_is_one_clear_error():
    with pytest.raises(ValueError, match="unknown relation '<'"):
        verdict("<", 1.0, 0.1)


def test_rows_are_hand_derived():
    # graft vs grpo on gpt2: means 0.52 and 0.41, sds 0.02 and 0.01 -> Δ 11.0 points,
    # SE = sqrt(0.02²/3 + 0.01²/3) = 0.012910 -> 1.291 points: holds.
    # On llama graft is below: means 0.30 and 0.33, sds 0.01 and 0.01 -> Δ -3.0, SE 0.8165: reversed.
    summary = {"graft": {"gpt2": _cell([0.50, 0.52, 0.54]), "llama": _cell([0.29, 0.30, 0.31])},
               "grpo": {"gpt2": _cell([0.40, 0.41, 0.42]), "llama": _cell([0.32, 0.33, 0.34])},
               "xgrpo": {"gpt2": _cell([0.41, NAN, 0.41])}}  # the NaN seed left out: 2 seeds, sd 0
    rows = {(r.claim.a, r.claim.b, r.policy): r for r in claim_rows(summary)}
    assert set(rows) == {("graft", "grpo", "gpt2"), ("graft", "grpo", "llama"), ("xgrpo", "grpo", "gpt2")}
    r = rows["graft", "grpo", "gpt2"]
    assert r.delta == pytest.approx(11.0, abs=1e-9) and r.se == pytest.approx(100 * math.sqrt(0.0005 / 3), abs=1e-9)
    assert r.verdict == "holds"
    r = rows["graft", "grpo", "llama"]
    assert r.delta == pytest.approx(-3.0, abs=1e-9) and r.se == pytest.approx(100 * math.sqrt(0.0002 / 3))
    assert r.verdict == "reversed"
    r = rows["xgrpo", "grpo", "gpt2"]  # Δ 0.0, SE = sqrt(0/2 + 0.01²/3) = 0.5774 points: consistent
    assert r.delta == pytest.approx(0.0, abs=1e-9) and r.se == pytest.approx(100 * 0.01 / math.sqrt(3))
    assert r.verdict == "consistent"


def test_section_lines_and_counts():
    summary = {"graft": {"gpt2": _cell([0.50, 0.52, 0.54])}, "grpo": {"gpt2": _cell([0.40, 0.41, 0.42])},
               "sgt": {"gpt2": _cell([0.45])}}  # one seed: n/a
    lines = claim_lines(summary)
    assert lines[0] == "## The papers' orderings"
    assert "| graft | `>` | grpo | gpt2 | +11.0 ± 2.6 | holds | GRAFT abstract, introduction, Table 1 | " in "\n".join(lines)
    assert "| graft | `>` | sgt | gpt2 | +7.0 | n/a (1 seed) |" in "\n".join(lines)
    assert "| sgt | `>` | grpo | gpt2 | +4.0 | n/a (1 seed) |" in "\n".join(lines)
    assert lines[-2] == "Verdicts: holds 1, n/a (1 seed) 2."
    assert claim_lines({"grpo": summary["grpo"]}) == []  # no claim has both labels: no section


def test_custom_claims_and_the_tables_section():
    mine = (Claim("sgt", ">", "grpo", "Mutual RL", "results", "x"),)
    summary = {"grpo": {"gpt2": _cell([0.40, 0.41, 0.42])}, "sgt": {"gpt2": _cell([0.30, 0.31, 0.32])}}
    assert [r.verdict for r in claim_rows(summary, mine)] == ["reversed"]
    body = "\n".join(report.table_body(["grpo", "sgt"], summary, ["gpt2"], ["pass@1"], {}))
    assert body.index("## gpt2") < body.index("## The papers' orderings") < body.index("## Compute")
    assert "| sgt | `>` | grpo | gpt2 | -10.0 ± 1.6 | reversed |" in body
    # a label not among the table's regimes is not checked
    body = "\n".join(report.table_body(["grpo"], summary, ["gpt2"], ["pass@1"], {}))
    assert "## The papers' orderings" not in body
