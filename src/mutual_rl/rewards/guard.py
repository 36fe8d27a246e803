"""Run a reward under a time limit and check what it returns: :class:`GuardedReward`.

Every call ``fn(completion, answer)`` of a guarded reward ends in one of three ways:

* ``ok``: ``fn`` returned a finite real number (``int``, ``float``, ``bool``, a NumPy scalar, a 0-d tensor with or
  without grad: anything ``float()`` accepts except ``str``/``bytes``;
  :func:`~mutual_rl.rewards.reward_values.plain_number`) within ``timeout_s``; the reward is that ``float``.
* ``timeout``: ``fn`` did not return within ``timeout_s`` seconds.
* ``error``: ``fn`` raised, or returned ``None``, NaN/inf, or something that is not a number.

With ``errors="raise"`` a timeout or an error raises :class:`RewardError`, naming the reward, where it happened
(policy and prompt, when given), the completion and the gold answer (each cut to 200 characters), and the fix.
With ``errors="skip"`` the reward is 0.0 and the call is counted (:attr:`GuardedReward.counts`); the first
error and the first timeout of each guard are logged at WARNING with the full message.

Never skipped either: a failed hand-off between the trainer and a reward's worker raises
:class:`~mutual_rl.rewards.isolation.RewardWorkerError`, the worker's error (the reward is not blamed). And a reward that tries to end its process (``SystemExit``, ``KeyboardInterrupt``,
``os._exit`` in its worker), or leaves child processes running after it returned, raises :class:`RewardError` in
both modes (:func:`call_reward`; :mod:`mutual_rl.rewards.isolation`).

Where ``fn`` runs: an :class:`~mutual_rl.rewards.isolation.IsolatedReward` (``package.module:function`` rewards,
by default) in its worker process, whose whole process group is killed with ``SIGKILL`` past ``timeout_s``; any
other function in this process, as follows.

The time limit, in process, in the main thread where ``SIGALRM`` exists: a ``setitimer`` alarm whose handler raises inside
``fn`` (it interrupts Python code and sleeps; a C call that never returns to Python is interrupted only when it
does). If another alarm is already armed (``getitimer`` non-zero), or in any other thread, ``fn`` runs in a daemon
thread that is waited for at most ``timeout_s``: on timeout that thread is abandoned, still running (Python
cannot stop a thread), so a reward that never returns keeps one idle thread per timed-out call.

Rewards with their own hard limit (the registered ``math_verify``, and :class:`~mutual_rl.rewards.verify.MathVerifier`
instances) expose ``with_time_limit(timeout_s) -> fn(completion, answer) -> RewardResult``; the guard calls that
instead of adding an alarm of its own, and a ``RewardResult`` with info ``"timeout"`` is a counted timeout that
scores 0.0 in both modes (an expression that hangs sympy is a wrong completion, not a broken reward). Its other
verdicts (including ``"error: ..."`` infos, which math-verify reports for unparsable input) are ordinary rewards.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from mutual_rl.rewards.base import RewardFn, RewardResult
from mutual_rl.rewards.isolation import (
    IsolatedReward,
    RewardFatal,
    RewardRaised,
    RewardWorkerError,
    type_name,
)
from mutual_rl.rewards.reward_values import plain_number
from mutual_rl.rewards.reward_worker import FORKED_CHILD_EXIT

log = logging.getLogger(__name__)

REWARD_ERROR_MODES = ("raise", "skip")
DEFAULT_TIMEOUT_S = 5.0
PREVIEW_CHARS = 200


FATAL_FIX = ("a reward must return a number: it may not end its process (sys.exit, os._exit, KeyboardInterrupt) "
             "and must end the processes it starts before it returns (e.g. `with multiprocessing.Pool() as pool:`; "
             "no fork whose child returns); this stops the run whatever model.reward_errors says")


class RewardError(ValueError):
    """A reward function failed on one completion: it raised, timed out, or returned a non-finite/non-number."""


class _RewardTimeout(BaseException):
    """Raised inside a reward by the alarm; a ``BaseException`` so that a reward's ``except Exception`` keeps it."""


def check_reward_settings(timeout_s: float, errors: str) -> None:
    """``timeout_s`` must be a finite number > 0 and ``errors`` one of ``raise``/``skip``; else ``ValueError``."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < timeout_s < math.inf:
        raise ValueError(f"model.reward_timeout_s must be a finite number of seconds > 0 (got {timeout_s!r}); "
                         f"the default is {DEFAULT_TIMEOUT_S}.")
    if errors not in REWARD_ERROR_MODES:
        raise ValueError(f"model.reward_errors must be one of {', '.join(REWARD_ERROR_MODES)} (got {errors!r}): "
                         "'raise' stops the run at the first failing reward call, 'skip' scores it 0.0 and counts "
                         "it in <policy>/reward_errors and <policy>/reward_timeouts.")


def preview(text: object, limit: int = PREVIEW_CHARS) -> str:
    """``repr`` of ``text`` cut to its first ``limit`` characters, with the full length when cut."""
    s = text if isinstance(text, str) else str(text)
    if len(s) <= limit:
        return repr(s)
    return f"{s[:limit]!r}... ({len(s)} characters)"


def _in_alarm_context() -> bool:
    """True iff this thread may use ``SIGALRM``: the main thread, the signal exists, and no alarm is armed."""
    return (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
            and signal.getitimer(signal.ITIMER_REAL)[0] == 0)


def _call_with_alarm(fn: Callable, args: tuple, timeout_s: float):
    armed = [True]

    def on_alarm(signum, frame):
        if armed[0]:
            raise _RewardTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return fn(*args)
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def _call_in_thread(fn: Callable, args: tuple, timeout_s: float):
    out: dict = {}

    def target():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name=f"reward-{getattr(fn, '__name__', 'fn')}")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _RewardTimeout
    if "error" in out:
        raise out["error"]
    return out["value"]


def call_with_time_limit(fn: Callable, args: tuple, timeout_s: float | None):
    """``fn(*args)``, raising ``TimeoutError`` if it has not returned after ``timeout_s`` seconds (``None``: no
    limit); the mechanism (alarm or waiting thread) is the module docstring's."""
    if timeout_s is None:
        return fn(*args)
    try:
        if _in_alarm_context():
            return _call_with_alarm(fn, args, timeout_s)
        return _call_in_thread(fn, args, timeout_s)
    except _RewardTimeout:
        raise TimeoutError(f"no result within {timeout_s:g} s") from None


_cwd_warned: set[str] = set()


def call_reward(fn: Callable, args: tuple, kwargs: dict, timeout_s: float | None, name: str = "", want="number"):
    """``fn(*args, **kwargs)`` under ``timeout_s`` (``TimeoutError`` past it), where the reward runs: in its worker
    process for an :class:`~mutual_rl.rewards.isolation.IsolatedReward` (its value made plain there, ``want``:
    ``"number"`` or the number of completions), else in this process, its value as returned (module docstring).

    A reward may not take the trainer with it. In process: a ``SystemExit``, ``KeyboardInterrupt`` or other
    ``BaseException`` raises :class:`~mutual_rl.rewards.isolation.RewardFatal`; a working directory changed by the
    call is put back (warned once per reward); a forked child that returns out of the reward exits at once
    (code 70), so that it never runs the trainer. In a worker: :mod:`mutual_rl.rewards.isolation`.
    """
    if isinstance(fn, IsolatedReward):
        return fn.call(args, kwargs, timeout_s, want)
    pid = os.getpid()
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    try:
        return call_with_time_limit(partial(fn, **kwargs) if kwargs else fn, args, timeout_s)
    except (Exception, _RewardTimeout):
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: the reward would end the run
        code = f"({exc.code!r})" if isinstance(exc, SystemExit) else ""
        also = " (or Ctrl-C was pressed during the call)" if isinstance(exc, KeyboardInterrupt) else ""
        raise RewardFatal(f"raised {type(exc).__name__}{code}{also}") from exc
    finally:
        if os.getpid() != pid:  # a fork of the reward came back out of it: it must not run the trainer
            os.write(2, f"mutual-rl: a forked child of reward {name!r} returned from the reward; it exits "
                        f"(code {FORKED_CHILD_EXIT}).\n".encode())
            os._exit(FORKED_CHILD_EXIT)
        if cwd is not None and _cwd_changed(cwd):
            moved = _getcwd()
            os.chdir(cwd)
            if name not in _cwd_warned:
                _cwd_warned.add(name)
                log.warning("reward %r changed the working directory to %r; put back to %r after each call (a "
                            "reward must not chdir: checkpoints and exports are written relative to it).",
                            name, moved, cwd)


def _getcwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


def _cwd_changed(cwd: str) -> bool:
    return _getcwd() != cwd


def _exc_name(exc: BaseException) -> str:
    """The type name of a reward's exception (the worker's, for one raised there)."""
    return exc.type_name if isinstance(exc, RewardRaised) else type(exc).__name__


def _finite_number(value) -> float | None:
    """``float(value)`` if ``value`` is a finite real number (module docstring), else ``None``."""
    number = plain_number(value)
    return number if isinstance(number, float) else None


@dataclass
class RewardCounts:
    """Calls a guard scored 0.0 instead of raising (``errors="skip"``; timeouts of self-limited rewards always)."""

    errors: int = 0
    timeouts: int = 0


class GuardedReward:
    """``fn(completion, answer) -> float`` under a time limit, with its result checked (module docstring).

    Args:
        fn: the reward function.
        name: how errors name it (default: the function's ``__name__``).
        timeout_s: seconds one call may take (``None``: no limit).
        errors: ``raise`` (default) or ``skip``.
    """

    def __init__(self, fn: RewardFn, name: str | None = None, *, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 errors: str = "raise"):
        if timeout_s is not None:
            check_reward_settings(timeout_s, errors)
        elif errors not in REWARD_ERROR_MODES:
            check_reward_settings(DEFAULT_TIMEOUT_S, errors)
        self.fn = fn
        self.name = name or getattr(fn, "__name__", repr(fn))
        self.__name__ = getattr(fn, "__name__", self.name)  # answer extraction picks the reward's rule by name
        self.timeout_s = timeout_s
        self.errors = errors
        self.counts = RewardCounts()
        self._warned: set[str] = set()
        limited = getattr(fn, "with_time_limit", None)
        self._self_limited = limited(timeout_s) if callable(limited) else None

    def score(self, completion: str, answer: str, *, where: str = "") -> tuple[float, str]:
        """``(reward, status)`` with status ``"ok"``, ``"error"`` or ``"timeout"``; ``where`` (e.g. ``"policy
        'a', prompt 7"``) goes into the error message. Raises :class:`RewardError` in ``raise`` mode."""
        if self._self_limited is not None:
            result: RewardResult = self._self_limited(completion, answer)
            if result.info == "timeout":
                self._count("timeout", self._message(
                    "timeout", f"took longer than its limit of {self.timeout_s} s", completion, answer, where))
                return 0.0, "timeout"
            return float(result.value), "ok"
        t0 = time.monotonic()
        try:
            value = call_reward(self.fn, (completion, answer), {}, self.timeout_s, self.name)
        except TimeoutError:
            return self._fail("timeout", f"did not return within {self.timeout_s:g} s", completion, answer, where)
        except RewardFatal as exc:  # never skipped: the reward tried to end its process or left processes behind
            raise RewardError(self._message("fatal", str(exc), completion, answer, where, exc.fix)) from exc
        except RewardWorkerError:  # the hand-off failed, not the reward: never blamed on it, never skipped
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of user code becomes one named error
            return self._fail("error", f"raised {_exc_name(exc)}: {exc}", completion, answer, where, exc)
        elapsed = time.monotonic() - t0
        # in process: the call returned, but late: it (or a library it uses) replaced or cancelled our SIGALRM
        # timer. A worker's own wait enforces the limit on the call; its start-up (the module's imports) is not
        # the call and has its own limit.
        if self.timeout_s is not None and elapsed > self.timeout_s and not isinstance(self.fn, IsolatedReward):
            return self._fail("timeout", f"returned after {elapsed:.1f} s, past its limit of {self.timeout_s:g} s "
                              "(it disarmed the time limit, e.g. with its own signal.alarm)", completion, answer, where)
        number = _finite_number(value)
        if number is None:
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
            kind = "" if value is None else f" ({type_name(value)})"
            return self._fail("error", f"returned {shown}{kind}, not a finite number", completion, answer, where)
        return number, "ok"

    def __call__(self, completion: str, answer: str) -> float:
        return self.score(completion, answer)[0]

    # ------------------------------------------------------------------------------------------ internals
    def _fail(self, kind: str, what: str, completion, answer, where, cause: BaseException | None = None):
        message = self._message(kind, what, completion, answer, where)
        if self.errors == "raise":
            raise RewardError(message) from cause
        self._count(kind, message)
        return 0.0, kind

    def _count(self, kind: str, message: str) -> None:
        if kind == "timeout":
            self.counts.timeouts += 1
        else:
            self.counts.errors += 1
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("%s Scored 0.0 and counted in <policy>/reward_%ss (only the first such call is logged).",
                        message, kind)

    def _message(self, kind: str, what: str, completion, answer, where: str, fix: str | None = None) -> str:
        counter = "reward_timeouts" if kind == "timeout" else "reward_errors"
        if kind == "fatal":
            return (f"reward {self.name!r} {what}{f' ({where})' if where else ''} on completion "
                    f"{preview(completion)} with answer {preview(answer)}; {fix or FATAL_FIX}.")
        if self._self_limited is not None:
            fix = "raise model.reward_timeout_s if correct answers take this long to verify"
        elif kind == "timeout":
            fix = f"make the reward faster or raise model.reward_timeout_s (now {self.timeout_s:g} s)"
        else:
            fix = ("fix the reward so that it returns a finite float for every completion "
                   "(fn(completion: str, answer: str) -> float)")
        if self.errors == "raise" and self._self_limited is None:
            fix += f", or set model.reward_errors: skip to score such calls 0.0 and count them in <policy>/{counter}"
        at = f" ({where})" if where else ""
        return (f"reward {self.name!r} {what}{at} on completion {preview(completion)} with answer "
                f"{preview(answer)}; {fix}.")
