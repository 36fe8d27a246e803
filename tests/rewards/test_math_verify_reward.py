import threading
import time

import pytest

from mutual_rl.rewards import MathVerifier, math_verify, math_verify_with_info

pytest.importorskip("math_verify")


@pytest.fixture(scope="module")
def verifier():
    v = MathVerifier(timeout_s=10.0)
    yield v
    v.close()


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("The answer is $\\frac{1}{2}$.", "\\frac{1}{2}", 1.0),
        ("\\boxed{46}", "46", 1.0),
        ("\\boxed{47}", "46", 0.0),
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
        ("%%% ??? garbage", "3", 0.0),
        ("", "3", 0.0),
    ],
)
def test_verdicts(verifier, completion, answer, expected):
    assert verifier(completion, answer) == expected


def test_no_answer_info(verifier):
    assert verifier.verify_with_info("", "3").info == "no answer found"


def test_registered_function_from_non_main_thread():
    out = []
    th = threading.Thread(target=lambda: out.append(math_verify("\\boxed{\\frac{1}{2}}", "0.5")))
    th.start()
    th.join(60)
    assert out == [1.0]
    assert math_verify_with_info("\\boxed{2}", "3").value == 0.0


@pytest.mark.slow
def test_timeout_kills_worker_and_recovers():
    v = MathVerifier(timeout_s=0.5)
    try:
        assert v("\\boxed{1}", "1") == 1.0  # worker started, so the limit below is the call's alone
        t0 = time.perf_counter()
        r = v.verify_with_info("\\boxed{9^{9^{9^{9}}}}", "1")  # sympy hangs on this
        elapsed = time.perf_counter() - t0
        assert (r.value, r.info) == (0.0, "timeout")
        assert 0.5 <= elapsed < 5.0
        assert v.restarts == 1
        assert v("\\boxed{2}", "2") == 1.0  # a fresh worker answers
    finally:
        v.close()


def test_bad_timeout():
    with pytest.raises(ValueError, match="timeouts must be > 0"):
        MathVerifier(timeout_s=0)


@pytest.mark.slow
def test_dead_worker_is_restarted():
    v = MathVerifier(timeout_s=10.0)
    try:
        assert v("\\boxed{1}", "1") == 1.0
        v._proc.kill()
        v._proc.join()
        assert v("\\boxed{1}", "1") == 1.0
        assert v.restarts == 1
    finally:
        v.close()
