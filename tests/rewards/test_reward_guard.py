"""GuardedReward: a time limit per call and a checked result, for registered and custom rewards alike."""

import math
import signal
import threading
import time

import pytest
import torch

from mutual_rl.rewards import GuardedReward, RewardError, check_reward_settings, get_reward, integer_match


def sleep_forever(completion: str, answer: str) -> float:
    while True:
        time.sleep(60)


def spin_forever(completion: str, answer: str) -> float:
    while True:
        pass


def swallow_everything(completion: str, answer: str) -> float:
    try:
        while True:
            time.sleep(60)
    except Exception:  # a reward that catches Exception still times out
        return 1.0


def raises(completion: str, answer: str) -> float:
    raise ZeroDivisionError("boom")


@pytest.mark.parametrize("fn", [sleep_forever, spin_forever, swallow_everything])
def test_never_returning_reward_times_out_in_the_main_thread(fn):
    before = signal.getsignal(signal.SIGALRM)
    guard = GuardedReward(fn, "my.rewards:slow", timeout_s=0.2)
    t0 = time.perf_counter()
    with pytest.raises(RewardError) as err:
        guard("the completion", "46")
    assert time.perf_counter() - t0 < 1.5
    msg = str(err.value)
    assert "reward 'my.rewards:slow' did not return within 0.2 s" in msg
    assert "'the completion'" in msg and "answer '46'" in msg
    assert "model.reward_timeout_s" in msg and "model.reward_errors: skip" in msg
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0  # no alarm left armed
    assert signal.getsignal(signal.SIGALRM) is before


def test_alarm_handler_is_restored_and_fast_rewards_are_unchanged():
    before = signal.getsignal(signal.SIGALRM)
    guard = GuardedReward(integer_match, "integer_match", timeout_s=0.2)
    assert [guard("46", "46"), guard("47", "46")] == [1.0, 0.0]
    assert signal.getsignal(signal.SIGALRM) is before
    time.sleep(0.3)  # the disarmed alarm does not fire later


def test_timeout_outside_the_main_thread_uses_a_waiting_thread():
    out = []
    guard = GuardedReward(sleep_forever, timeout_s=0.2, errors="skip")
    th = threading.Thread(target=lambda: out.append(guard.score("c", "a")))
    t0 = time.perf_counter()
    th.start()
    th.join(5)
    assert out == [(0.0, "timeout")]
    assert time.perf_counter() - t0 < 1.5
    assert (guard.counts.errors, guard.counts.timeouts) == (0, 1)


def test_errors_raised_outside_the_main_thread_are_reported():
    out = []

    def run():
        try:
            GuardedReward(raises, "r", timeout_s=1.0)("c", "a")
        except RewardError as exc:
            out.append(str(exc))

    th = threading.Thread(target=run)
    th.start()
    th.join(5)
    assert out and "reward 'r' raised ZeroDivisionError: boom" in out[0]


def test_an_armed_alarm_of_someone_else_is_left_alone():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.6)
        guard = GuardedReward(sleep_forever, timeout_s=0.2, errors="skip")
        assert guard.score("c", "a") == (0.0, "timeout")
        time.sleep(0.8)
        assert fired == [True]  # their alarm still fired, with their handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (raises, "raised ZeroDivisionError: boom"),
        (lambda c, a: None, "returned None, not a finite number"),
        (lambda c, a: float("nan"), "returned nan (float), not a finite number"),
        (lambda c, a: math.inf, "returned inf (float), not a finite number"),
        (lambda c, a: "abc", "returned 'abc' (str), not a finite number"),
        (lambda c, a: [1.0], "returned [1.0] (list), not a finite number"),
    ],
)
def test_bad_result_raises_one_named_error(fn, expected):
    guard = GuardedReward(fn, "pkg.mod:bad", timeout_s=1.0)
    with pytest.raises(RewardError) as err:
        guard.score("x" * 1000, "46", where="policy 'a', prompt 7")
    msg = str(err.value)
    assert msg.startswith(f"reward 'pkg.mod:bad' {expected} (policy 'a', prompt 7) on completion 'xxx")
    assert "... (1000 characters)" in msg  # long texts are cut
    assert "answer '46'" in msg
    assert "returns a finite float for every completion" in msg and "model.reward_errors: skip" in msg


@pytest.mark.parametrize("fn", [raises, lambda c, a: None, lambda c, a: float("nan"), lambda c, a: "abc"])
def test_skip_mode_scores_zero_and_counts(fn, caplog):
    guard = GuardedReward(fn, "bad", timeout_s=1.0, errors="skip")
    with caplog.at_level("WARNING", logger="mutual_rl.rewards.guard"):
        assert [guard.score("c", "a") for _ in range(3)] == [(0.0, "error")] * 3
    assert (guard.counts.errors, guard.counts.timeouts) == (3, 0)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "reward 'bad'" in warnings[0] and "reward_errors" in warnings[0]
    assert "model.reward_errors: skip" not in warnings[0]  # already skipping: not offered as the fix


@pytest.mark.parametrize(("value", "expected"), [(True, 1.0), (1, 1.0), (torch.tensor(0.5), 0.5)])
def test_numbers_of_other_types_are_accepted(value, expected):
    assert GuardedReward(lambda c, a: value, timeout_s=1.0)("c", "a") == expected


def test_wrapped_data_errors_keep_their_message_and_type():
    guard = GuardedReward(get_reward("integer_match"), "integer_match", timeout_s=1.0)
    with pytest.raises(ValueError, match=r"reward 'integer_match' raised ValueError: gold answer 'x' is not an "
                                         r"integer") as err:
        guard("46", "x")
    assert isinstance(err.value.__cause__, ValueError)


def test_guard_keeps_the_reward_name_for_answer_extraction():
    assert GuardedReward(integer_match, "integer_match").__name__ == "integer_match"


@pytest.mark.parametrize(
    ("timeout_s", "errors", "message"),
    [
        (0, "raise", r"model.reward_timeout_s must be a finite number of seconds > 0 \(got 0\)"),
        (math.inf, "raise", r"model.reward_timeout_s must be a finite number of seconds > 0 \(got inf\)"),
        ("5", "raise", r"model.reward_timeout_s must be a finite number of seconds > 0 \(got '5'\)"),
        (5.0, "ignore", r"model.reward_errors must be one of raise, skip \(got 'ignore'\)"),
    ],
)
def test_settings_are_validated(timeout_s, errors, message):
    with pytest.raises(ValueError, match=message):
        check_reward_settings(timeout_s, errors)
    with pytest.raises(ValueError, match=message):
        GuardedReward(integer_match, timeout_s=timeout_s, errors=errors)


def test_math_verify_uses_the_run_limit_and_counts_its_timeouts():
    pytest.importorskip("math_verify")
    from mutual_rl.rewards import math_verify
    from mutual_rl.rewards.verify import verifier_for

    guard = GuardedReward(math_verify, "math_verify", timeout_s=0.5)  # no alarm: the worker's own hard limit
    try:
        assert guard.score("\\boxed{1}", "1") == (1.0, "ok")  # the worker's start-up is not limited to 0.5 s
        t0 = time.perf_counter()
        assert guard.score("\\boxed{9^{9^{9^{9}}}}", "1") == (0.0, "timeout")  # raise mode too: a counted 0
        assert time.perf_counter() - t0 < 5.0
        assert (guard.counts.errors, guard.counts.timeouts) == (0, 1)
        assert verifier_for(0.5).timeout_s == 0.5
    finally:
        verifier_for(0.5).close()


def test_a_reward_that_cancels_the_alarm_still_counts_as_a_timeout():
    """A reward (or a library it calls) that uses SIGALRM itself cancels our timer; the late return still counts."""
    import signal
    import time

    from mutual_rl.rewards.guard import GuardedReward

    def resets_alarm(completion, answer):
        signal.alarm(0)  # e.g. a timeout decorator of its own
        time.sleep(0.5)
        return 1.0

    guard = GuardedReward(resets_alarm, "resets_alarm", timeout_s=0.2, errors="skip")
    assert guard.score("x", "1") == (0.0, "timeout") and guard.counts.timeouts == 1
