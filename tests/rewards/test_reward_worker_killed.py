"""A reward's worker process killed by a signal mid-call (issue 37 item 5): ``SIGKILL`` from outside (the
out-of-memory killer, an operator) restarts the worker and sends the call again, once, with a warning line; killed
again during that call, one error naming the reward and both kills. Real workers, real ``SIGKILL``."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from mutual_rl.rewards import RewardError, build_reward
from tests.rewards.test_reward_isolation import BAD, _assert_gone, _pids, pids_file  # noqa: F401 (autouse fixture)


def test_a_worker_killed_mid_call_is_restarted_once_and_the_call_answered(pids_file, capfd):  # noqa: F811 (the imported fixture)
    reward = build_reward(f"{BAD}:waits_to_be_killed_once", timeout_s=30.0, errors="raise")
    results = []
    call = threading.Thread(target=lambda: results.append(reward("ab", "x")))
    call.start()
    deadline = time.monotonic() + 60
    while not _pids(pids_file):  # the worker is in the call, waiting
        assert time.monotonic() < deadline and call.is_alive()
        time.sleep(0.02)
    (first,) = _pids(pids_file)
    os.kill(first, signal.SIGKILL)
    call.join(60)
    assert results == [1.0]  # the call sent again to a new worker: "ab" has an even length
    assert reward("abc", "x") == 0.0  # the new worker serves the next calls
    err = capfd.readouterr().err
    assert (f"mutual-rl: warning: the worker process of reward {BAD}:waits_to_be_killed_once was killed by SIGKILL "
            "during a call; started a new one and sent the call again (once per call).") in err
    _assert_gone([first])


def test_a_worker_killed_again_during_the_retried_call_is_one_error_naming_the_reward(pids_file):  # noqa: F811 (the imported fixture)
    reward = build_reward(f"{BAD}:sigkills_itself", timeout_s=30.0, errors="skip")  # never skipped either
    with pytest.raises(RewardError) as e:
        reward("a", "b")
    msg = str(e.value)
    assert msg.startswith(f"reward '{BAD}:sigkills_itself' had its worker process killed by SIGKILL during the "
                          "call, and the new worker killed by SIGKILL during the call sent again on completion 'a'")
    assert "restarted once per call" in msg and "dmesg" in msg
    first, second = _pids(pids_file)
    assert first != second  # two workers, each killed
    _assert_gone([first, second])
