"""Rewards that would take the trainer with them (issue 24): exits, pools, forks, chdir, a dead trainer.

Each reward is a real function of :mod:`tests.rewards.bad_rewards`, run through the real guard, in its real worker
process (``isolation="custom"``, the default) or in this process (``isolation="none"``). Rewards that start processes
write their pids to a file; every test that has one checks by pid that none is left (gone, or a zombie awaiting its
reaper: no longer running).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mutual_rl.rewards import RewardError, build_reward
from mutual_rl.rewards.isolation import IsolatedReward, close_workers
from mutual_rl.rewards.reward_worker import alive
from mutual_rl.types import Problem

BAD = "tests.rewards.bad_rewards"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def pids_file(tmp_path, monkeypatch):
    """``$MUTUAL_RL_TEST_PIDS`` for this test; every reward worker is killed after it (fresh environment each)."""
    path = tmp_path / "pids"
    path.touch()
    monkeypatch.setenv("MUTUAL_RL_TEST_PIDS", str(path))
    close_workers()
    yield path
    close_workers()


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def _assert_gone(pids: list[int], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], f"still running: {[p for p in pids if alive(p)]}"


def _worker_pid(reward) -> int:
    from mutual_rl.rewards.isolation import _worker

    fn = reward.terms[0].scorer.fn
    assert isinstance(fn, IsolatedReward)
    return _worker(fn.module, fn.attr).proc.pid


# ------------------------------------------------------------------ SystemExit / KeyboardInterrupt / os._exit
@pytest.mark.parametrize("isolation", ["custom", "none"])
@pytest.mark.parametrize("errors", ["raise", "skip"])
@pytest.mark.parametrize(("fn", "what"), [("exits_0", "raised SystemExit(0)"), ("exits_3", "raised SystemExit(3)"),
                                          ("ctrl_c", "raised KeyboardInterrupt")])
def test_a_reward_that_exits_is_one_error_naming_it_in_both_modes(fn, what, errors, isolation):
    reward = build_reward(f"{BAD}:{fn}", timeout_s=5.0, errors=errors, isolation=isolation)
    with pytest.raises(RewardError) as e:
        reward("46", "46")
    msg = str(e.value)
    assert msg.startswith(f"reward '{BAD}:{fn}' {what}")
    assert "on completion '46' with answer '46'" in msg
    assert "it may not end its process" in msg and "whatever model.reward_errors says" in msg
    assert reward.counts.errors == 0  # not skipped, not counted


def test_a_reward_that_ends_its_worker_is_one_error_and_the_next_call_gets_a_new_worker(pids_file):
    reward = build_reward(f"{BAD}:os_exit", timeout_s=5.0, errors="skip")
    with pytest.raises(RewardError, match=f"reward '{BAD}:os_exit' ended its worker process \\(exit code 0\\) "
                                          "during the call on completion 'a'"):
        reward("a", "b")
    with pytest.raises(RewardError, match="ended its worker process"):
        reward("a", "b")
    first, second = _pids(pids_file)
    assert first != second  # a fresh worker for the second call
    _assert_gone([first, second])


def test_a_trl_style_reward_that_exits_is_one_error_naming_it():
    reward = build_reward(f"{BAD}:trl_exits", errors="skip")
    with pytest.raises(RewardError, match=f"reward '{BAD}:trl_exits' raised SystemExit\\(5\\) on the 2 completions "
                                          "of prompt '1\\+1=' with answer '2'; a reward must return a number"):
        reward.score_group(Problem(0, "1+1=", "2"), ["2", "3"])


# ------------------------------------------------------------------------------------------ pools and forks
def test_a_pool_that_hangs_is_a_timeout_and_its_workers_are_killed(pids_file):
    reward = build_reward(f"{BAD}:pool_hangs", timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(RewardError, match=f"reward '{BAD}:pool_hangs' did not return within 1 s"):
        reward("a", "b")
    assert time.monotonic() - t0 < 4.0  # start-up + the limit, nothing waits for the pool
    pids = _pids(pids_file)
    assert len(pids) == 3  # the worker and its two pool processes
    _assert_gone(pids)


def test_a_pool_leftalive_after_the_call_is_one_error_and_is_killed(pids_file):
    reward = build_reward(f"{BAD}:pool_left_open", errors="skip")
    with pytest.raises(RewardError) as e:
        reward("a", "b")
    pids = _pids(pids_file)
    assert len(pids) == 2
    assert str(e.value).startswith(f"reward '{BAD}:pool_left_open' left 2 child process(es) running after it "
                                   f"returned (pid(s) {', '.join(map(str, sorted(pids)))}, now killed)")
    _assert_gone(pids, within_s=0.5)


def test_a_pool_closed_by_the_reward_is_fine():
    reward = build_reward(f"{BAD}:pool_closed")
    assert [reward("a", "b") for _ in range(3)] == [1.0, 1.0, 1.0]


def test_a_fork_whose_child_returns_is_one_error_and_never_runs_the_trainer(pids_file):
    reward = build_reward(f"{BAD}:fork_returns", errors="skip")
    with pytest.raises(RewardError) as e:
        reward("a", "b")
    (child,) = _pids(pids_file)
    assert str(e.value).startswith(f"reward '{BAD}:fork_returns' forked, and the child (pid(s) {child}) returned out "
                                   "of the reward instead of exiting")
    _assert_gone([child])


def test_a_forked_child_that_ignores_sigterm_is_killed(pids_file):
    reward = build_reward(f"{BAD}:fork_and_hang")
    with pytest.raises(RewardError, match="left 1 child process\\(es\\) running after it returned"):
        reward("a", "b")
    _assert_gone(_pids(pids_file), within_s=0.5)


def test_in_process_a_fork_whose_child_returns_exits_in_the_child(tmp_path, pids_file):
    """``isolation: none``: the forked child must not come back into the caller (here a script that prints once)."""
    script = ("from mutual_rl.rewards import build_reward\n"
              f"r = build_reward('{BAD}:fork_returns', isolation='none')\n"
              "print('after', r('a', 'b'), flush=True)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["after 1.0"]  # once: the child did not return into the script
    assert f"a forked child of reward '{BAD}:fork_returns' returned from the reward; it exits (code 70)" in out.stderr
    _assert_gone(_pids(pids_file))


# ------------------------------------------------------------------------------------------ working directory
@pytest.mark.parametrize("isolation", ["custom", "none"])
def test_a_reward_that_chdirs_does_not_move_the_trainer(tmp_path, monkeypatch, caplog, isolation):
    here, away = tmp_path / "here", tmp_path / "away"
    here.mkdir(), away.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("MUTUAL_RL_TEST_CHDIR", str(away))
    reward = build_reward(f"{BAD}:chdir_away", isolation=isolation)
    with caplog.at_level(logging.WARNING, logger="mutual_rl.rewards.guard"):
        assert [reward("a", "b") for _ in range(2)] == [1.0, 1.0]
    assert os.getcwd() == str(here)
    warned = [r.getMessage() for r in caplog.records if "changed the working directory" in r.getMessage()]
    if isolation == "none":  # put back, and said once
        assert warned == [f"reward '{BAD}:chdir_away' changed the working directory to {str(away)!r}; put back to "
                          f"{str(here)!r} after each call (a reward must not chdir: checkpoints and exports are "
                          "written relative to it)."]
    else:  # moot: the worker's directory is not the trainer's
        assert warned == []


# ------------------------------------------------------------------------------------------ the worker's life
def test_the_worker_is_its_own_process_group_and_is_killed_at_close(pids_file):
    reward = build_reward(f"{BAD}:parity")
    assert reward("ab", "x") == 1.0
    pid = _worker_pid(reward)
    assert os.getpgid(pid) == pid != os.getpgid(0)  # a group of its own: a SIGTERM to ours does not reach it
    reward.close()
    _assert_gone([pid], within_s=0.5)
    assert reward("abc", "x") == 0.0  # a later call starts a new one


def test_the_worker_dies_with_a_killed_trainer(tmp_path):
    """A trainer killed with SIGKILL (no atexit): the worker's watchdog kills its group, a hung call included."""
    script = ("import os, sys, threading\n"
              "from mutual_rl.rewards import build_reward\n"
              f"r = build_reward('{BAD}:sleep_forever', timeout_s=600)\n"
              "threading.Thread(target=r, args=('a', 'b'), daemon=True).start()\n"
              "print('started', flush=True)\n"
              "threading.Event().wait()\n")
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    assert trainer.stdout.readline() == "started\n"
    deadline = time.monotonic() + 30
    workers: list[int] = []
    while not workers and time.monotonic() < deadline:
        for tid in os.listdir(f"/proc/{trainer.pid}/task"):
            workers += [int(p) for p in Path(f"/proc/{trainer.pid}/task/{tid}/children").read_text().split()]
        time.sleep(0.05)
    assert workers
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(10)
    trainer.stdout.close()
    _assert_gone(workers, within_s=3.0)


def test_the_worker_imports_with_the_trainers_path_and_directory(tmp_path, monkeypatch):
    """A reward module that is a file in the working directory (not on ``sys.path`` by itself): found in the trainer
    as ``python -m`` would, and found again in the worker."""
    (tmp_path / "cwd_isolated_reward.py").write_text("import os\n\ndef where(completion, answer):\n"
                                                     "    return float(os.getpid())\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    reward = build_reward("cwd_isolated_reward:where")
    assert reward("a", "b") == float(_worker_pid(reward)) != float(os.getpid())


def test_a_reward_its_worker_cannot_import_is_one_error_naming_it(tmp_path, monkeypatch):
    """Importable in the trainer (found there first), gone when the worker starts: one error, with the fix."""
    (tmp_path / "vanishing_reward.py").write_text("def f(completion, answer):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = build_reward("vanishing_reward:f", errors="skip")
    (tmp_path / "vanishing_reward.py").unlink()
    with pytest.raises(RewardError) as e:
        reward("a", "b")
    assert str(e.value).startswith("reward 'vanishing_reward:f' could not be imported by its worker process "
                                   "(ModuleNotFoundError: No module named 'vanishing_reward') on completion 'a'")
    assert "with the trainer's sys.path and working directory" in str(e.value)


def test_an_interrupted_wait_kills_the_worker_so_no_stale_answer_is_read(monkeypatch):
    """Ctrl-C in the trainer while it waits: the worker is killed, the next call gets its own answer."""
    from mutual_rl.rewards import isolation

    reward = build_reward(f"{BAD}:parity")
    assert reward("ab", "x") == 1.0
    pid = _worker_pid(reward)

    def interrupted(self, timeout=None):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(isolation.Connection, "poll", interrupted)
        with pytest.raises(KeyboardInterrupt):
            reward("ab", "x")  # answered 1.0 in the worker, never read
    _assert_gone([pid], within_s=0.5)
    assert reward("abc", "x") == 0.0  # not the stale 1.0


def test_a_value_that_is_no_number_is_described_in_the_worker_and_an_ordinary_error_naming_its_type():
    reward = build_reward(f"{BAD}:returns_lock", errors="skip")
    assert reward("a", "b") == 0.0 and reward.counts.errors == 1  # counted, like any non-number
    with pytest.raises(RewardError, match=f"reward '{BAD}:returns_lock' returned <unlocked _thread.lock object at "
                                          "0x[0-9a-f]+> \\(lock\\), not a finite number"):
        build_reward(f"{BAD}:returns_lock")("a", "b")


# ------------------------------------------------------------------ the worker's start-up is not the call
@pytest.mark.parametrize("fn", ["exact", "exact_trl"])
def test_a_slow_module_import_is_not_counted_against_the_call(fn):
    """The first call starts the worker, which imports the module (1.5 s here; seconds for a module that imports
    torch): a 0.5 s limit per completion must not turn that start-up into a timeout."""
    reward = build_reward(f"tests.rewards.slow_import_reward:{fn}", timeout_s=0.5)  # TRL-style: 0.5 s x 2
    scored = reward.score_group(Problem(0, "1+1=", "2"), ["2", "3"])
    assert scored.total == [1.0, 0.0] and scored.timeouts == 0
