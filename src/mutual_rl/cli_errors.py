"""How ``mutual-rl`` reports an error: one short paragraph, no traceback (``MUTUAL_RL_DEBUG=1`` shows it).

:func:`report_errors` runs the CLI and sorts what it raises:

* a **configuration error** -- raised while the command line and config files are parsed and the classes built
  (before fitting starts: :func:`start_running` marks that point): a ``ValueError``, ``TypeError``,
  ``FileNotFoundError``, ``IsADirectoryError``, ``KeyError`` or a YAML error, or a ``SystemExit`` carrying a message
  (the config files' YAML and ``base:`` checks) -- prints ``mutual-rl: configuration error`` with the message (and
  the config files given) and exits **2**;
* an error mutual-rl raises **on purpose at run time** (its class is defined in ``mutual_rl``, or the innermost
  frame that raised it is mutual-rl code: a reward that failed, a store in use, a refused checkpoint, a non-finite
  stop) prints ``mutual-rl: error`` with the message and exits **1**;
* anything else (a bug, a library's own failure) keeps its traceback, as does every error with
  ``MUTUAL_RL_DEBUG=1``; any other ``SystemExit`` (argument parse errors: exit 2; SIGTERM: 143) passes through.

The message is printed as it is (its own line breaks); one of more than :data:`MAX_LINES` lines is cut there,
ending with how to see all of it (``MUTUAL_RL_DEBUG=1``).

jsonargparse's own parse errors are rewritten by :mod:`mutual_rl.cli_parse_errors`.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

EXIT_CONFIG = 2
EXIT_ERROR = 1
MAX_LINES = 6
_CONFIG_TYPES = (ValueError, TypeError, FileNotFoundError, IsADirectoryError, KeyError)
_state = {"running": False}


def start_running() -> None:
    """Mark the end of configuration: errors from here on are run-time errors."""
    _state["running"] = True


def _is_ours(exc: BaseException) -> bool:
    if type(exc).__module__.startswith("mutual_rl"):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and f"{os.sep}mutual_rl{os.sep}" in frames[-1].filename


def _is_yaml_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("yaml")


def config_files(argv: list[str]) -> list[str]:
    """The ``--config`` files of a command line, in order."""
    files = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")]
    return files + [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]


def _configs(argv: list[str]) -> str:
    files = config_files(argv)
    return f" (configuration: {', '.join(files)})" if files else ""


def paragraph(head: str, exc: BaseException, where: str = "") -> str:
    """``head: <message><where>``, at most :data:`MAX_LINES` lines."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    lines = f"{head}: {text.strip() or type(exc).__name__}{where}".splitlines()
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES - 1] + ["... (cut; MUTUAL_RL_DEBUG=1 shows all of it and the traceback)"]
    return "\n".join(lines)


def report_errors(run: Callable[[], None], argv: list[str]) -> None:
    """``run()``, reporting its errors as the module docstring says (exits 1 or 2 for a reported error)."""
    _state["running"] = False
    try:
        run()
    except SystemExit as exc:  # a message (the config files' YAML and base: checks) is a configuration error
        if isinstance(exc.code, str) and not _state["running"]:
            print(paragraph("mutual-rl: configuration error", ValueError(exc.code)), file=sys.stderr, flush=True)
            raise SystemExit(EXIT_CONFIG) from None
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if os.environ.get("MUTUAL_RL_DEBUG") == "1":
            raise
        if not _state["running"] and (isinstance(exc, _CONFIG_TYPES) or _is_yaml_error(exc)):
            print(paragraph("mutual-rl: configuration error", exc, _configs(argv)), file=sys.stderr, flush=True)
            raise SystemExit(EXIT_CONFIG) from None
        if _is_ours(exc):
            print(paragraph("mutual-rl: error", exc), file=sys.stderr, flush=True)
            raise SystemExit(EXIT_ERROR) from None
        raise


# ------------------------------------------------------------------------------ jsonargparse's parse errors


__all__ = ["EXIT_CONFIG", "EXIT_ERROR", "MAX_LINES", "config_files", "paragraph", "report_errors", "start_running"]
