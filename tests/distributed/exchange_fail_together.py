"""Run under torchrun (2 CPU ranks, gloo): rank 0's SEE accounting fails (a flow never reported), rank 1's is fine;
both ranks must raise ExchangeAccountingError instead of rank 1 waiting forever in the next collective. Each rank
writes what it raised to ``OUT_DIR/rank<r>.txt``. Usage: torchrun --nproc-per-node 2 exchange_fail_together.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mutual_rl.exchange import ExperienceExchange  # noqa: E402
from mutual_rl.exchange.bus import ExchangeAccountingError  # noqa: E402
from tests.exchange.helpers import make_group  # noqa: E402


def main(out: str) -> None:
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=True)  # a hang is a failure
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ex = ExperienceExchange()
    for p in ("a", "b"):
        ex.subscribe(p, {"rollout", "reward", "advantage"}, regime="prp")
    ex.begin_step(0)
    for i, p in enumerate(("a", "b")):
        ex.publish(make_group(p, 10 + rank, 100 * i + rank, n=2))
    for r in ("a", "b"):
        for s, gs in ex.deliveries(r).items():
            if not (rank == 0 and r == "b"):  # rank 0 forgets one report
                ex.report(r, s, consumed=sum(len(g.rollouts) for g in gs))
    try:
        ex.end_step()
        result = "no error"
    except ExchangeAccountingError as e:
        result = f"ExchangeAccountingError: {e}"
    Path(out, f"rank{rank}.txt").write_text(result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
