"""The catalogue's one-glance check (issue 37 item 3), shared by every test of ``tests/reliability`` that runs the
CLI as a command and expects an error: the report is one paragraph, from its head (``mutual-rl: configuration
error: `` or ``mutual-rl: error: ``) to the end of stderr, at most :data:`~mutual_rl.cli_errors.MAX_LINES` lines
and not cut to fit, with no traceback anywhere, and it names the key or the thing (the fragments a test gives).

Unit-level cases (an error raised by the Python API) use :func:`raises`: ``pytest.raises`` that then checks the
report the command would print for that exception. Three ways to reach the report, cheapest first: :func:`command` runs ``mutual-rl ARGV`` in-process as the console
command does (``sys.argv`` set, ``main()``: :func:`~mutual_rl.cli_errors.report_errors` reports); :func:`reported`
gives what the command prints and exits with for an exception an in-process ``main([...])`` raised (the test keeps
its checks on the exception itself); a subprocess's stderr goes straight to :func:`one_glance`."""

from __future__ import annotations

import contextlib
import io
import sys

import pytest

from mutual_rl.cli_errors import MAX_LINES, report_errors, start_running

HEADS = ("mutual-rl: configuration error: ", "mutual-rl: error: ")


def one_glance(stderr: str, *names: str, head: str | tuple[str, ...] = HEADS) -> str:
    """The report at the end of ``stderr`` (module docstring), checked; each of ``names`` must be in it."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(head)), None)
    assert start is not None, f"no line starts with {head!r}:\n{stderr[-3000:]}"
    report = "\n".join(lines[start:])
    assert len(lines) - start <= MAX_LINES, f"{len(lines) - start} lines:\n{report}"
    assert "MUTUAL_RL_DEBUG=1 shows all of it" not in report, f"cut to fit:\n{report}"
    for name in names:
        assert name in report, (name, report)
    return report


def command(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    """``mutual-rl ARGV`` in-process as the console command: ``(exit status, stderr)``."""
    from mutual_rl.cli import main

    monkeypatch.setattr(sys, "argv", ["mutual-rl", *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err


def reported(exc: BaseException, *, running: bool, argv: tuple[str, ...] = ()) -> tuple[int, str]:
    """What the ``mutual-rl`` command prints and exits with for ``exc``, raised by an in-process ``main([...])``:
    ``running`` says whether it was raised after configuration ended (in ``fit``) or before (parsing, the
    ``--ckpt_path`` checks, building the classes)."""

    def run():
        if running:
            start_running()
        raise exc

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        report_errors(run, list(argv))
    return exit_.value.code, err.getvalue()


@contextlib.contextmanager
def raises(expected, *names: str, match: str | None = None, running: bool = True):
    """``pytest.raises(expected, match=match)``, then the one-glance check of what the ``mutual-rl`` command would
    print for the exception (:func:`reported`; ``running``: raised during the run, exit 1; else configuration,
    exit 2), naming each of ``names``."""
    with pytest.raises(expected, match=match) as info:
        yield info
    code, err = reported(info.value, running=running)
    assert code == (1 if running else 2), (code, err)
    one_glance(err, *names)
