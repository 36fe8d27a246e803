"""Rewards run in a worker process of their own: :class:`IsolatedReward` (``model.reward_isolation``).

A reward is the user's code, run thousands of times in the trainer's process: a ``sys.exit``, a fork whose child
returns, a ``multiprocessing.Pool`` left behind or an ``os.chdir`` would take the trainer with it. An isolated reward
is called in a **worker process** (:mod:`mutual_rl.rewards.reward_worker`):

* a fresh interpreter (``subprocess``, not ``fork``: none of the trainer's state, threads or signal handlers, Lightning's
  SIGTERM handler included), in a **session and process group of its own**, started on the reward's first call and
  shared by every guard of the same ``module:function`` in this process; it imports the function with the trainer's
  ``sys.path`` and working directory;
* each call sends the arguments over a socket pair (standard ``pickle``) and waits at most the guard's time limit; the
  reward's value is converted to a plain ``float`` (or ``None``, a description of a non-number, or for a TRL-style
  reward a list of those) *in the worker* (:mod:`mutual_rl.rewards.reward_values`), so a torch tensor or NumPy
  value never crosses; a failed hand-off raises :class:`RewardWorkerError`, the worker's error, never the
  reward's; past the time limit, the worker's
  whole process group (the worker, its pools, its forks) is killed with ``SIGKILL`` and reaped, the call is a
  timeout, and the next call starts a new worker (paying the start-up again: Python, plus the reward module's
  imports);
* a worker **killed by a signal** during a call (``SIGKILL`` from the out-of-memory killer or an operator) is
  restarted and the call sent again, once per call, with a warning line on stderr; the call's result is then that
  of the new worker (the step goes on with it);
* a ``SystemExit``/``KeyboardInterrupt`` in the reward, a worker that ends itself during a call (or is killed again
  during the call sent again), or child processes still
  running after the call returned (killed at once) raise :class:`RewardFatal`, which the guards turn into a
  :class:`~mutual_rl.rewards.guard.RewardError` naming the reward in **both** error modes: such a reward is broken,
  not a wrong completion;
* the worker's process group is killed with ``SIGKILL`` at :func:`close_workers` and at the trainer's exit; if the
  trainer dies without exiting cleanly (``kill -9``), the worker's watchdog kills its own group within 0.2 s.

The cost, measured by ``scripts/bench_reward_isolation.py`` (2 busy CPUs): one round trip per call, 0.2-0.5 ms
against 0.02-0.08 ms in process (5-14x), 13-27 ms per 64 completions; the worker's start-up ~0.1 s plus the reward
module's imports (seconds for a module that imports torch: keep a reward module light). The function itself is imported in the trainer too (to check that it is a Python function and read its
signature), but only called in the worker.
"""

from __future__ import annotations

import atexit
import inspect
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path

from mutual_rl.rewards.base import RewardFn
from mutual_rl.rewards.reward_values import Described, from_wire

ISOLATION_MODES = ("custom", "all", "none")
"""``model.reward_isolation``: custom (``package.module:function`` rewards in a worker, registered names in process),
all (every reward in a worker, but ``math_verify``, which has its own), none (every reward in process)."""
STARTUP_TIMEOUT_S = 120.0
WORKER_SCRIPT = Path(__file__).with_name("reward_worker.py")


class RewardFatal(Exception):
    """A reward tried to end its process, left processes behind, or its worker could not import it (module
    docstring): never skipped. ``fix``: what to do, when it is not the guards' default advice."""

    def __init__(self, what: str, fix: str | None = None):
        super().__init__(what)
        self.fix = fix


IMPORT_FIX = ("the worker imports the reward's module afresh, with the trainer's sys.path and working directory: "
              "make it importable there, with no top-level code that needs the trainer's state, or set "
              "model.reward_isolation: none to call it in the trainer's process")


KILLED_FIX = ("a worker killed by a signal is restarted once per call; killed twice in one call, the run stops: find "
              "what kills it (the out-of-memory killer: see `dmesg`; a reward that uses much memory or kills its own "
              "process), or set model.reward_isolation: none to call the reward in the trainer's process")


class RewardWorkerError(RuntimeError):
    """The hand-off between the trainer and a reward's worker failed (arguments or answer not transferable): the
    worker's fault, never the reward's; the guards raise it in both error modes."""


class RewardRaised(Exception):
    """A reward raised ``type_name: text`` in its worker process; ``traceback`` is the worker's."""

    def __init__(self, type_name: str, text: str, traceback: str):
        super().__init__(text)
        self.type_name, self.traceback = type_name, traceback
        self.add_note(f"in the reward's worker process:\n{traceback.rstrip()}")


def check_isolation(mode: str) -> None:
    if mode not in ISOLATION_MODES:
        raise ValueError(f"model.reward_isolation must be one of {', '.join(ISOLATION_MODES)} (got {mode!r}): "
                         "custom runs package.module:function rewards in a worker process and registered rewards in "
                         "the trainer, all runs every reward in a worker, none runs every reward in the trainer.")


class _Worker:
    """One worker process running ``module:attr`` (module docstring)."""

    def __init__(self, module: str, attr: str):
        self.module, self.attr = module, attr
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.lock = threading.Lock()
        self.starts = 0
        self.exit_code = 0

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen([sys.executable, str(WORKER_SCRIPT), str(theirs.fileno())],
                                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        self.proc, self.conn, self.starts = proc, Connection(ours.detach()), self.starts + 1
        try:
            self.conn.send((self.module, self.attr, list(sys.path), os.getcwd()))
            ready = self.conn.poll(STARTUP_TIMEOUT_S)
            status, text = self.conn.recv() if ready else ("error", "")
        except (EOFError, OSError):
            raise RewardFatal(f"ended its worker process ({self.kill()}) while it was imported", IMPORT_FIX) from None
        except BaseException:  # e.g. Ctrl-C while it starts
            self.kill()
            raise
        if not ready:
            self.kill()
            raise RewardFatal(f"was not imported by its worker process within {STARTUP_TIMEOUT_S:g} s", IMPORT_FIX)
        if status != "ready":
            self.kill()
            raise RewardFatal(text, IMPORT_FIX)

    def kill(self) -> str:
        """SIGKILL the worker's process group and reap the worker; how it ended, in words (its exit status, negative
        for a signal, in ``exit_code``)."""
        proc, conn, self.proc, self.conn = self.proc, self.conn, None, None
        if conn is not None:
            conn.close()
        if proc is None:
            return "not started"
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = self.exit_code = proc.wait()
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"

    def call(self, args: tuple, kwargs: dict, timeout_s: float | None, want="number"):
        with self.lock:
            try:
                request = pickle.dumps((args, kwargs, want))
            except Exception as exc:  # noqa: BLE001 - the trainer's side of the hand-off
                raise RewardWorkerError(self._handoff(f"could not pickle the call's arguments for it "
                                                      f"({type(exc).__name__}: {exc})")) from exc
            raw = self._round_trip(request, timeout_s)
            try:
                reply = pickle.loads(raw)
            except Exception as exc:  # noqa: BLE001 - the worker sends plain values only: a hand-off fault
                self.kill()
                raise RewardWorkerError(self._handoff(f"sent an answer the trainer could not unpickle "
                                                      f"({type(exc).__name__}: {exc})")) from exc
            status = reply[0]
            if status == "fatal":
                self.kill()  # start afresh: nothing of the broken call survives
                raise RewardFatal(reply[1])
            if status == "handoff":
                raise RewardWorkerError(self._handoff(reply[1]))
        if status == "ok":
            return from_wire(reply[1])
        raise RewardRaised(*reply[1:])

    def _round_trip(self, request: bytes, timeout_s: float | None) -> bytes:
        """Send ``request`` to the worker (started if it is not running) and return its answer. A worker killed by
        a signal during the call (``SIGKILL``: the out-of-memory killer, an operator) is restarted and the call sent
        again, once (a line on stderr says so); killed again, or ended in any other way, :class:`RewardFatal`."""
        killed = None
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                self.kill()
            if self.proc is None:
                self._start()
            try:
                self.conn.send_bytes(request)
                done = self.conn.poll(timeout_s)
                raw = self.conn.recv_bytes() if done else None
            except (EOFError, OSError):
                how = self.kill()
                if self.exit_code < 0 and killed is None:
                    killed = how
                    print(f"mutual-rl: warning: the worker process of reward {self.module}:{self.attr} was {how} "
                          "during a call; started a new one and sent the call again (once per call).",
                          file=sys.stderr, flush=True)
                    continue
                if killed is not None:
                    raise RewardFatal(f"had its worker process {killed} during the call, and the new worker {how} "
                                      "during the call sent again", KILLED_FIX) from None
                raise RewardFatal(f"ended its worker process ({how}) during the call") from None
            except BaseException:  # e.g. Ctrl-C while waiting: the worker's answer would answer the next call
                self.kill()
                raise
            if not done:
                self.kill()  # the whole process group, hard: a hung reward, its pools and its forks
                raise TimeoutError(f"no result within {timeout_s:g} s")
            return raw

    def _handoff(self, what: str) -> str:
        return (f"the worker process of reward {self.module}:{self.attr} {what}. This is a failure of mutual-rl's "
                "hand-off between the trainer and the reward's worker, not of the reward; the reward's values "
                "cross as plain numbers (float, None), and its arguments must pickle with the standard pickle "
                "module. Set model.reward_isolation: none to call the reward in the trainer's process.")


def type_name(value) -> str:
    """The type name of a reward's value (the original type, for one the worker described)."""
    return value.type_name if isinstance(value, Described) else type(value).__name__


_WORKERS: dict[tuple[str, str], _Worker] = {}
_WORKERS_PID = os.getpid()
_WORKERS_LOCK = threading.Lock()


def _worker(module: str, attr: str) -> _Worker:
    global _WORKERS_PID
    with _WORKERS_LOCK:
        if _WORKERS_PID != os.getpid():  # a forked trainer process: the parent's workers are not ours
            _WORKERS.clear()
            _WORKERS_PID = os.getpid()
        return _WORKERS.setdefault((module, attr), _Worker(module, attr))


def close_workers() -> None:
    """Kill every reward worker of this process (their process groups, with SIGKILL); later calls start new ones."""
    with _WORKERS_LOCK:
        workers = list(_WORKERS.values()) if _WORKERS_PID == os.getpid() else []
    for w in workers:
        with w.lock:
            w.kill()


atexit.register(close_workers)


class IsolatedReward:
    """``fn``, called in a worker process (module docstring); same ``__name__`` and signature as ``fn``.

    Args:
        fn: a Python function, importable as ``fn.__module__:fn.__qualname__`` (or as ``spec``).
        spec: ``"package.module:function"`` (default: from ``fn``).
    """

    def __init__(self, fn: RewardFn, spec: str | None = None):
        if spec is None:
            spec = f"{fn.__module__}:{fn.__qualname__}"
        module, _, attr = spec.partition(":")
        self.fn, self.spec, self.module, self.attr = fn, spec, module, attr
        self.__name__ = getattr(fn, "__name__", attr)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__signature__ = inspect.signature(fn)

    def call(self, args: tuple, kwargs: dict, timeout_s: float | None, want="number"):
        """``fn(*args, **kwargs)`` in the worker: its value made plain there (``want``: ``"number"`` or ``n``,
        :func:`~mutual_rl.rewards.reward_values.plain`); ``TimeoutError`` past ``timeout_s``; :class:`RewardRaised`
        for its exception; :class:`RewardFatal` (module docstring); :class:`RewardWorkerError` for a failed
        hand-off."""
        return _worker(self.module, self.attr).call(args, kwargs, timeout_s, want)

    def __call__(self, *args, **kwargs):
        return self.call(args, kwargs, None)

    def close(self) -> None:
        """Kill this reward's worker (a later call starts a new one)."""
        w = _worker(self.module, self.attr)
        with w.lock:
            w.kill()

    def __repr__(self) -> str:
        return f"IsolatedReward({self.spec!r})"


__all__ = ["ISOLATION_MODES", "IsolatedReward", "RewardFatal", "RewardRaised", "RewardWorkerError", "check_isolation",
           "close_workers"]
