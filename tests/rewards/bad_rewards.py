"""Rewards that misbehave, given to runs as ``tests.rewards.bad_rewards:<name>`` like a user's own reward.

Standard library only: an isolated reward's worker process imports this module at each (re)start, so it stays light
(a reward module that imports torch costs seconds per worker start). Rewards that start processes write their pids,
one per line, to the file named by ``$MUTUAL_RL_TEST_PIDS`` (read when the worker starts), so that a test can check
that none is left.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time


def _record(*pids: int) -> None:
    with open(os.environ["MUTUAL_RL_TEST_PIDS"], "a") as f:
        f.write("".join(f"{p}\n" for p in pids))


def parity(completion: str, answer: str) -> float:
    return float(len(completion) % 2 == 0)


def sleep_forever(completion: str, answer: str) -> float:
    while True:
        time.sleep(60)


def raises(completion: str, answer: str) -> float:
    raise KeyError(answer)


def returns_none(completion: str, answer: str):
    return None


def returns_nan(completion: str, answer: str) -> float:
    return float("nan")


def returns_abc(completion: str, answer: str):
    return "abc"


def returns_lock(completion: str, answer: str):
    import threading

    return threading.Lock()


def exits_0(completion: str, answer: str) -> float:
    sys.exit(0)


def exits_3(completion: str, answer: str) -> float:
    sys.exit(3)


def ctrl_c(completion: str, answer: str) -> float:
    raise KeyboardInterrupt


def os_exit(completion: str, answer: str) -> float:
    _record(os.getpid())
    os._exit(0)


def chdir_away(completion: str, answer: str) -> float:
    os.chdir(os.environ.get("MUTUAL_RL_TEST_CHDIR", "/"))
    return 1.0


def _sleep(x):
    time.sleep(600)
    return x


def pool_hangs(completion: str, answer: str) -> float:
    """A pool whose tasks never finish: the call times out (the issue's orphaned pool worker)."""
    pool = multiprocessing.get_context("fork").Pool(2)
    _record(os.getpid(), *(p.pid for p in pool._pool))
    return float(pool.apply(_sleep, (1,)))


def _square(x):
    return x * x


_POOLS: list = []


def pool_left_open(completion: str, answer: str) -> float:
    """Returns, but leaves its pool's workers running (a pool kept for later calls)."""
    pool = multiprocessing.get_context("fork").Pool(2)
    _POOLS.append(pool)
    _record(*(p.pid for p in pool._pool))
    return float(pool.apply(_square, (1,)))


def pool_closed(completion: str, answer: str) -> float:
    """A pool used properly: allowed."""
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return float(sum(pool.map(_square, [0, 1])) == 1)


def fork_returns(completion: str, answer: str) -> float:
    """Forks, and the child returns out of the reward as the parent does (the issue's multiplying trainers)."""
    if os.fork() == 0:
        _record(os.getpid())
        return 1.0
    time.sleep(0.3)  # the child has returned by now
    return 1.0


def fork_and_hang(completion: str, answer: str) -> float:
    """Forks a child that never ends (and ignores SIGTERM), and returns."""
    pid = os.fork()
    if pid == 0:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(60)
    _record(pid)
    return 1.0


def trl_exits(prompts, completions, **kwargs):
    sys.exit(5)


def waits_to_be_killed_once(completion: str, answer: str) -> float:
    """The first call (no ``$MUTUAL_RL_TEST_PIDS.once`` file yet) creates that file, records the worker's pid and
    waits (up to 60 s) for the test to kill the worker; every later call is :func:`parity`."""
    once = os.environ["MUTUAL_RL_TEST_PIDS"] + ".once"
    if not os.path.exists(once):
        open(once, "w").close()
        _record(os.getpid())
        time.sleep(60)
    return parity(completion, answer)


def sigkills_itself(completion: str, answer: str) -> float:
    """Records its worker's pid and kills that process with SIGKILL, at every call."""
    import signal

    _record(os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
    return 0.0
