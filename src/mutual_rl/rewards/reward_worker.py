"""The reward worker process: runs one reward function for :mod:`mutual_rl.rewards.isolation`.

Started as ``python reward_worker.py <fd>`` (never imported by the trainer; standard library only, so that nothing of
the trainer's is loaded here), in a session and process group of its own. ``<fd>`` is one end of a socket pair. The
first message is ``(module, attribute, sys_path, cwd)``: the worker takes that ``sys.path`` and working directory,
imports the function and answers ``("ready", "")`` or ``("error", text)``. Then each request, a plain ``pickle`` of
``(args, kwargs, want)`` sent as bytes (never ``multiprocessing``'s pickler, whose torch reductions hand tensors over
through shared memory and an authenticated connection the two processes do not share), is answered, the same way, by
one of

* ``("ok", value)``: the function returned; ``value`` is what it returned made plain *here*
  (:func:`reward_values.plain`, as :func:`reward_values.to_wire`: a ``float``, ``None``, a description of a value
  that is not a number, or for ``want = n`` a list of those or a refusal), so only plain Python values cross;
* ``("handoff", text)``: the request could not be unpickled here (a fault of the hand-off, not of the reward);
* ``("raised", type name, text, traceback)``: it raised an ``Exception``;
* ``("fatal", text)``: it raised ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException`` (it tried to end
  the process), or it left child processes running after it returned (a pool not closed, a fork whose child came
  back out of the function); those children are killed with ``SIGKILL`` first.

After each call the working directory is put back. A forked child that returns out of the function exits at once
(code 70) instead of answering. A watchdog thread kills the whole process group when the trainer (the parent) dies,
so that a hung reward or its children never outlive the run.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

if __package__:  # imported by the trainer (for FORKED_CHILD_EXIT)
    from mutual_rl.rewards.reward_values import plain, to_wire
else:  # run as a script: its own folder is sys.path[0] until the trainer's sys.path replaces it
    from reward_values import plain, to_wire

FORKED_CHILD_EXIT = 70


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.2)
        if os.getppid() != parent:
            os.killpg(0, signal.SIGKILL)  # this worker, its pools and its forks: the trainer is gone


def alive(pid: int) -> bool:
    """Process ``pid`` exists and is not a zombie (``/proc``; False where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _reap() -> list[int]:
    """Reap the children that exited (the reward did not wait for them); the pids of those that were forks of the
    reward which returned out of it (exit code ``FORKED_CHILD_EXIT``)."""
    forked: list[int] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return forked
        if pid == 0:
            return forked
        if os.waitstatus_to_exitcode(status) == FORKED_CHILD_EXIT:
            forked.append(pid)


def _children() -> list[int]:
    """This process's live (non-zombie) child pids, from ``/proc`` (empty where ``/proc`` does not list them)."""
    me = os.getpid()
    pids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        return []
    return sorted(p for p in set(pids) if alive(p))


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass


def main(fd: int) -> None:
    conn = Connection(fd)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True, name="parent-watchdog").start()
    module, attr, sys_path, cwd = conn.recv()
    sys.path[:] = sys_path
    os.chdir(cwd)
    try:
        fn = getattr(importlib.import_module(module), attr)
    except BaseException as exc:  # noqa: BLE001 - reported to the trainer, which names the reward
        conn.send(("error", f"could not be imported by its worker process ({type(exc).__name__}: {exc})"))
        return
    conn.send(("ready", ""))
    me = os.getpid()
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            args, kwargs, want = pickle.loads(request)
        except Exception as exc:  # noqa: BLE001 - reported as the hand-off's failure, never the reward's
            conn.send_bytes(pickle.dumps(("handoff", f"could not unpickle the call's arguments "
                                                     f"({type(exc).__name__}: {exc})")))
            continue
        try:
            reply = ("ok", to_wire(plain(fn(*args, **kwargs), want)))
        except Exception as exc:  # noqa: BLE001 - the reward's own error, reported by name
            reply = ("raised", type(exc).__name__, str(exc), traceback.format_exc())
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: the reward ended its process
            code = f"({exc.code!r})" if isinstance(exc, SystemExit) else ""
            reply = ("fatal", f"raised {type(exc).__name__}{code}")
        if os.getpid() != me:  # a fork of the reward came back out of it: it must not answer, nor live on
            os._exit(FORKED_CHILD_EXIT)
        if os.getcwd() != cwd:
            os.chdir(cwd)
        forked, left = _reap(), _children()
        if left:
            _kill(left)
            reply = ("fatal", f"left {len(left)} child process(es) running after it returned (pid(s) "
                              f"{', '.join(map(str, left))}, now killed)")
        elif forked:
            reply = ("fatal", f"forked, and the child (pid(s) {', '.join(map(str, forked))}) returned out of the "
                              "reward instead of exiting")
        conn.send_bytes(pickle.dumps(reply))  # plain values only: str, float, None, tuples and lists of them


if __name__ == "__main__":
    main(int(sys.argv[1]))
