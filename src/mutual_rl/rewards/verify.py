"""``math_verify`` reward: math-verify's parse + verify in a worker process with a hard time limit.

math-verify's own timeouts use ``signal.alarm``, which works only in the main thread, and sympy can hang on
inputs such as ``\\boxed{9^{9^{9^{9}}}}``. So :class:`MathVerifier` runs ``parse``/``verify`` in one persistent
worker process (``spawn`` start method, started lazily on first use, math-verify imported only there):

* each call sends ``(completion, answer)`` and waits at most ``timeout_s`` seconds for the verdict;
* on timeout the worker is killed and 0.0 is returned with info ``"timeout"``; the next call starts a new
  worker (paying the start-up, ~1 s, again);
* any exception inside parse/verify gives 0.0 with info ``"error: ..."``; a dead worker is restarted;
* calls may come from any thread (a lock serialises them) and from forked children (which start their own).

The registered ``math_verify`` uses a 5 s limit when called directly; in a run, the reward guard
(:mod:`mutual_rl.rewards.guard`) calls ``math_verify.with_time_limit(model.reward_timeout_s)`` instead, so the
run's limit is this worker's (no second alarm), and each ``"timeout"`` is counted in ``<policy>/reward_timeouts``.

Rule, exactly: the gold ``answer`` is parsed as ``\\boxed{answer}`` unless it already contains ``\\boxed`` or
``$`` (then as is); the completion is parsed with math-verify's defaults (LaTeX and plain expressions; a
``\\boxed{}`` has priority). Reward 1.0 iff both parses are non-empty and ``verify(gold, pred)`` is true.
An unparsable gold gives 0.0 with info ``"gold answer unparsable"``.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
from multiprocessing.connection import Connection

from mutual_rl.rewards.base import RewardResult, register_reward


def _gold_text(answer: str) -> str:
    return answer if ("\\boxed" in answer or "$" in answer) else "\\boxed{" + answer + "}"


def _worker_main(conn: Connection) -> None:  # pragma: no cover - runs in the child process
    """Child loop: import math-verify, say ready, then answer ``(completion, answer)`` requests until EOF."""
    try:
        import logging

        from math_verify import parse, verify

        logging.getLogger("math_verify").setLevel(logging.ERROR)  # silence "timeout disabled" warnings
    except Exception as exc:  # noqa: BLE001
        conn.send(("error", f"cannot import math_verify: {exc!r}"))
        return
    conn.send(("ready", ""))
    while True:
        try:
            completion, answer = conn.recv()
        except (EOFError, OSError):
            return
        try:
            gold = parse(_gold_text(answer), parsing_timeout=None)
            if not gold:
                conn.send((0.0, "gold answer unparsable"))
                continue
            pred = parse(completion, parsing_timeout=None)
            if not pred:
                conn.send((0.0, "no answer found"))
                continue
            ok = verify(gold, pred, timeout_seconds=None)
            conn.send((1.0 if ok else 0.0, ""))
        except Exception as exc:  # noqa: BLE001
            conn.send((0.0, f"error: {type(exc).__name__}"))


class MathVerifier:
    """Callable ``(completion, answer) -> float`` backed by a math-verify worker process.

    Args:
        timeout_s: hard limit in seconds for one parse + verify (the worker is killed beyond it).
        startup_timeout_s: limit for starting the worker and importing math-verify; exceeding it, or the
            worker failing to import math-verify, raises ``RuntimeError`` (a broken install should stop the
            run, not silently score 0).
    """

    def __init__(self, timeout_s: float = 5.0, startup_timeout_s: float = 120.0) -> None:
        if timeout_s <= 0 or startup_timeout_s <= 0:
            raise ValueError(
                f"timeouts must be > 0, got timeout_s={timeout_s}, startup_timeout_s={startup_timeout_s}"
            )
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self._lock = threading.Lock()
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._pid = os.getpid()
        self.restarts = 0  # workers killed or found dead (for logging)

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="math-verify-worker")
        proc.start()
        child.close()
        if not parent.poll(self.startup_timeout_s):
            proc.kill()
            proc.join()
            raise RuntimeError(f"math-verify worker did not start within {self.startup_timeout_s} s")
        try:
            status, msg = parent.recv()
        except EOFError:
            status, msg = "error", f"worker exited with code {proc.join(1) or proc.exitcode}"
        if status != "ready":
            proc.join(1)
            raise RuntimeError(f"math-verify worker failed: {msg}")
        self._proc, self._conn = proc, parent

    def _stop(self) -> None:
        if self._proc is not None and self._pid == os.getpid():
            self._proc.kill()
            self._proc.join()
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        """Stop the worker (a later call starts a new one)."""
        with self._lock:
            self._stop()

    def verify_with_info(self, completion: str, answer: str) -> RewardResult:
        """The reward with a reason: ``""``, ``"timeout"``, ``"no answer found"``, ``"error: ..."``."""
        with self._lock:
            if self._pid != os.getpid():  # forked child: the parent's worker and pipe are not ours
                self._proc = self._conn = None
                self._pid = os.getpid()
            if self._proc is None or not self._proc.is_alive():
                if self._proc is not None:
                    self.restarts += 1
                    self._stop()
                self._start()
            assert self._conn is not None
            try:
                self._conn.send((str(completion), str(answer)))
                if not self._conn.poll(self.timeout_s):
                    self.restarts += 1
                    self._stop()
                    return RewardResult(0.0, "timeout")
                value, info = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError) as exc:
                self.restarts += 1
                self._stop()
                return RewardResult(0.0, f"error: worker died ({type(exc).__name__})")
            return RewardResult(float(value), info)

    def __call__(self, completion: str, answer: str) -> float:
        return self.verify_with_info(completion, answer).value

    def with_time_limit(self, timeout_s: float | None):
        """This verifier's ``verify_with_info``: an instance keeps the ``timeout_s`` it was built with (the
        reward guard calls this instead of adding an alarm; see :mod:`mutual_rl.rewards.guard`)."""
        del timeout_s
        return self.verify_with_info


DEFAULT_TIMEOUT_S = 5.0
_VERIFIERS: dict[float, MathVerifier] = {}
_DEFAULT_LOCK = threading.Lock()


def verifier_for(timeout_s: float | None = None) -> MathVerifier:
    """The process-wide verifier with limit ``timeout_s`` seconds (``None``: 5 s); one worker per distinct limit,
    each started on first use and stopped at exit."""
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    with _DEFAULT_LOCK:
        if timeout_s not in _VERIFIERS:
            _VERIFIERS[timeout_s] = MathVerifier(timeout_s=timeout_s)
            atexit.register(_VERIFIERS[timeout_s].close)
        return _VERIFIERS[timeout_s]


def default_verifier() -> MathVerifier:
    """The process-wide verifier used by the registered ``math_verify`` reward called directly (5 s limit)."""
    return verifier_for(DEFAULT_TIMEOUT_S)


def math_verify_with_info(completion: str, answer: str) -> RewardResult:
    """``math_verify`` with the reason for its verdict."""
    return default_verifier().verify_with_info(completion, answer)


@register_reward("math_verify")
def math_verify(completion: str, answer: str) -> float:
    """1.0 iff math-verify judges the completion's answer equal to the gold (module docstring), else 0.0."""
    return default_verifier().verify_with_info(completion, answer).value


def _math_verify_with_time_limit(timeout_s: float | None):
    """``math_verify_with_info`` under limit ``timeout_s`` (the run's ``model.reward_timeout_s``)."""
    return verifier_for(timeout_s).verify_with_info


math_verify.with_time_limit = _math_verify_with_time_limit  # type: ignore[attr-defined]
