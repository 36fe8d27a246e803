"""The comparison's measured premises (compare/premise.py): GRAFT's gate at step 0 and response lengths, from
hand-made scalars."""

from __future__ import annotations

from mutual_rl.compare.premise import gate_at_step0, gate_lines, length_lines, premise_lines
from mutual_rl.regimes.graft_gate import GATE_DELTAS, admit_tag, quantile_tag


def _gate_run(p: str, first: float, later: float) -> dict:
    """A run whose receiver ``p`` logs every gate tag: ``first`` at step 0 (logged twice: the last counts, as a
    resumed run logs again), ``later`` at step 1."""
    sc = {}
    for kind in ("success", "failure"):
        for d in GATE_DELTAS:
            sc[f"{p}/{admit_tag(kind, d)}"] = [(0, 0.0), (0, first), (1, later)]
        for q in (10, 25, 50, 75, 90):
            sc[f"{p}/{quantile_tag(kind, q)}"] = [(0, first), (1, later)]
        sc[f"{p}/evaluated_{kind}"] = [(0, 40.0), (1, 8.0)]
    return sc


def test_gate_takes_the_first_graft_run_of_each_seed_at_its_first_step():
    data = {("grpo", 0): {"a/reward": [(0, 1.0)]},
            ("graft", 0): _gate_run("a", 0.2, 0.9), ("graft_d05", 0): _gate_run("a", 0.7, 0.7),
            ("graft", 1): _gate_run("a", 0.4, 0.9)}
    gate = gate_at_step0(data, ["grpo", "graft", "graft_d05"], ["a", "b"])
    assert gate["seeds"] == [0, 1]
    assert gate["a"][admit_tag("success", 0.8)] == [0.2, 0.4]  # graft's step 0, not graft_d05's, not step 1
    assert gate["a"]["evaluated_failure"] == [40.0, 40.0] and "b" not in gate
    lines = gate_lines(gate, ["a", "b"])
    rows = [line for line in lines if line.startswith("| a |")]
    assert len(rows) == 2
    assert rows[0].split(" | ")[1:4] == ["success", "40 ± 0", "30.0 ± 14.1"]  # (20 %, 40 %): mean 30, sd 14.1
    assert rows[0].split(" | ")[-1] == "0.30 ± 0.14 |"  # the s quantile p90


def test_no_graft_run_says_so():
    gate = gate_at_step0({("grpo", 0): {"a/reward": [(0, 1.0)]}}, ["grpo"], ["a"])
    assert gate == {"seeds": []}
    assert gate_lines(gate, ["a"])[0].startswith("No GRAFT run logged its gate")


def test_response_lengths_first_step_and_over_the_run():
    data = {("grpo", 0): {"a/response_length": [(0, 30.0), (1, 20.0), (2, 10.0)]},
            ("grpo", 1): {"a/response_length": [(0, 28.0), (1, 26.0)]}}
    (line, _) = length_lines(data, ["a", "b"])
    # first: 30, 28 -> 29.0 ± 1.4; over the run: 20, 27 -> 23.5 ± 4.9
    assert line == ("Mean sampled response length (tokens; mean ± std over runs): a 29.0 ± 1.4 at the first step, "
                    "23.5 ± 4.9 over the run.")
    assert premise_lines(data, ["grpo"], ["a"])[:3] == ["## Measured premises", "", line]
