"""How ``mutual-rl`` reports a command line or config file that does not parse, in one paragraph.

jsonargparse's own parse errors (an unknown key, a value of the wrong type, a missing or folder ``--config``, an
unset required setting) are rewritten by :func:`parse_error_paragraph` (the CLI's parser calls it instead of
printing its usage and message): the file (or the command line) and the full key path, with list positions
(``model.policies[1].sampling.n``), what the key accepts (the settings beside it, with the nearest spelling; the
type), and the fix.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import inspect
import os
import re
import textwrap
import types
import typing
from pathlib import Path

from mutual_rl.cli_errors import config_files as _config_files
from mutual_rl.cli_errors import paragraph

_HEAD = "mutual-rl: configuration error"
_NOT_SETTINGS = ("help", "config", "print_config")


@dataclasses.dataclass
class _Finding:
    """What a jsonargparse message says, read by :func:`_read`: ``kind`` is ``unknown`` (a key no setting has),
    ``type`` (a value of the wrong type), ``class`` (a class_path that does not import), ``file`` (a config file
    that is missing or a folder), ``subconfig`` (a sub-config that does not load) or ``other``; ``parts`` the key
    (from the top, no list positions); ``cls``/``at`` the class the keys from ``parts[at:]`` belong to (a
    dataclass or class_path value), if any."""

    kind: str
    parts: list[str]
    cls: type | None = None
    at: int = 0
    got: str | None = None
    text: str = ""


def _import(path: str):
    module, _, name = path.rpartition(".")
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except Exception:  # noqa: BLE001 (only a better message is lost)
        return None


def _bullets(text: str) -> list[str]:
    """The ``- ...`` items of a union's message (under its ``Errors:``, if it has one), each dedented."""
    body = text.split("Errors:", 1)[1] if "Errors:" in text else text
    body = re.split(r"\n\s*Given value", body)[0]
    items, current = [], None
    indent = None
    for line in body.splitlines():
        m = re.match(r"^(\s*)- (.*)$", line)
        if m and (indent is None or len(m.group(1)) == indent):
            indent = len(m.group(1))
            current = [m.group(2)]
            items.append(current)
        elif current is not None:
            current.append(line[indent + 2:] if indent is not None else line)
    return ["\n".join(item) for item in items]


def _read(text: str, parts: list[str], cls: type | None = None, at: int = 0) -> _Finding:
    """The finding of jsonargparse's message ``text`` (nested ``Parser key`` / ``class_path`` / union levels
    followed down to the innermost one)."""
    text = textwrap.dedent(text).strip()
    if m := re.match(r'Parser key "([^"]+)":[ \t]*\n?(.*)\Z', text, re.S):
        key = m.group(1).split(".")
        if not parts and cls is None and key[0] in ("fit", "validate"):
            key = key[1:]
        return _read(m.group(2), parts + key, cls, at)
    if m := re.match(r"Problem with given class_path '([^']+)':[ \t]*\n?(.*)\Z", text, re.S):
        found = _import(m.group(1))
        return _read(m.group(2), parts, found if isinstance(found, type) else None, len(parts))
    if text.startswith(("Does not validate against any of the Union subtypes", "- ")):
        items = _bullets(text)
        got = re.search(r"Given value: (.*)", text)
        for prefer in ("Problem with given class_path", "Expected a dot import path string", "Unable to load"):
            for item in items:
                if item.startswith(prefer):
                    return _read(item, parts, cls, at)
        return _Finding("type", parts, cls, at, got.group(1).strip() if got else None, text)
    if m := re.match(r"Subcommand '[^']+' does not accept option '([^']+)'", text):
        return _Finding("unknown", parts + m.group(1).split("."), cls, at, text=text)
    if m := re.match(r"Group '([^']+)' does not accept option '([^']+)'", text):
        return _Finding("unknown", parts + m.group(1).split(".") + m.group(2).split("."), cls, at, text=text)
    if m := re.match(r"Option '([^']+)' is not accepted", text):
        return _Finding("unknown", parts + m.group(1).split("."), cls, at, text=text)
    if m := re.match(r"Expected a dot import path string: (.*)", text):
        return _Finding("class", parts, cls, at, m.group(1).strip(), text)
    if m := re.match(r"Expected a (.*?)\. Got value: (.*)", text, re.S):
        return _Finding("type", parts, cls, at, m.group(2).strip(), text)
    if text.startswith("Expected a "):
        return _Finding("type", parts, cls, at, None, text)
    if m := re.match(r"(File does not exist|Path is not a file): '(.*)'", text) if parts == ["config"] else None:
        return _Finding("file", parts, got=m.group(2), text=m.group(1))
    if m := re.match(r"Unable to load config ['\"]([^'\"]+)['\"]", text):
        return _Finding("subconfig", parts, cls, at, m.group(1), text)
    return _Finding("other", parts, cls, at, text=text)


def _subparser(parser, argv: list[str]):
    """The parser of the subcommand in ``argv`` (``fit``, ``validate``), or ``parser`` itself."""
    action = getattr(parser, "_subcommands_action", None)
    choices = getattr(action, "_name_parser_map", None) or {}
    return next((choices[a] for a in argv if a in choices), parser)


def _settings(parser) -> dict:
    """``{dotted key: action}`` of every setting of ``parser``."""
    out = {}
    for action in getattr(parser, "_actions", []):
        dest = getattr(action, "dest", None)
        if dest and dest not in _NOT_SETTINGS and not dest.endswith(".help") and dest != "==SUPPRESS==":
            out[dest] = action
    return out


def _unwrap(hint):
    """The class a type hint holds settings of (``Optional[X]``, ``list[X]`` -> X), or None."""
    if dataclasses.is_dataclass(hint) or (isinstance(hint, type) and hint.__module__ not in ("builtins", "typing")
                                          and not issubclass(hint, (Path, str))):
        return hint
    for arg in typing.get_args(hint):
        found = _unwrap(arg)
        if found is not None:
            return found
    return None


def _fields(cls) -> dict:
    """``{name: type hint}`` of the settings of ``cls`` (a dataclass's fields, or ``__init__``'s parameters)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001
        hints = {}
    if dataclasses.is_dataclass(cls):
        return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(cls) if f.init}
    try:
        params = inspect.signature(cls.__init__).parameters.values()
        init_hints = typing.get_type_hints(cls.__init__)
    except (TypeError, ValueError, NameError):
        return {}
    return {p.name: init_hints.get(p.name) for p in params
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _describe(hint) -> str:
    """A type hint in words: ``a whole number``, ``one of raise, skip``, ``a number or null``, ..."""
    if hint is None or hint is type(None):
        return "null"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        words = [_describe(a) for a in args if a is not type(None)]
        return " or ".join(words + (["null"] if type(None) in args else []))
    if origin in (list, tuple, collections.abc.Sequence, collections.abc.Iterable):
        if not args or args[0] is Ellipsis:
            return "a list"
        item = args[0]
        if dataclasses.is_dataclass(item):
            return f"a list of {item.__name__} mappings"
        return f"a list of {item.__name__}s (class_path: ...)" if isinstance(item, type) and _unwrap(item) else \
            f"a list, each item {_describe(item)}"
    if origin is dict:
        return "a mapping"
    words = {bool: "true or false", int: "a whole number (int)", float: "a number (float)", str: "a string",
             Path: "a path"}
    if hint in words:
        return words[hint]
    if dataclasses.is_dataclass(hint):
        return f"a mapping of {hint.__name__} settings"
    if isinstance(hint, type):
        return f"a {hint.__name__} (class_path: ..., init_args: {{...}})"
    return str(hint)


def _load_yaml(path: Path):
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 (a file that does not load holds no key)
        return None


def _yaml_value(text: str):
    import yaml

    try:
        return yaml.safe_load(text)
    except Exception:  # noqa: BLE001
        return None


def _walk(node, parts: list[str], file: Path, shown: list[str]):
    """Every ``(file, shown key, value)`` where ``parts`` is in ``node`` (list items tried in turn, a class_path's
    ``init_args`` looked into, a sub-config file followed)."""
    if not parts:
        yield file, ".".join(shown), node
        return
    head, rest = parts[0], parts[1:]
    if isinstance(node, str) and node.endswith((".yaml", ".yml")) and (file.parent / node).is_file():
        sub = file.parent / node
        yield from _walk(_load_yaml(sub), parts, sub, shown)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, parts, file, shown[:-1] + [f"{shown[-1]}[{i}]"] if shown else [f"[{i}]"])
    elif isinstance(node, dict):
        if head in node:
            yield from _walk(node[head], rest, file, shown + [head])
        elif isinstance(node.get("init_args"), dict) and head in node["init_args"]:
            yield from _walk(node["init_args"][head], rest, file, shown + ["init_args", head])


def _locate(parts: list[str], argv: list[str], got: str | None = None) -> tuple[str, str, object]:
    """Where the key ``parts`` was given last (a later argument overrides an earlier one): ``(where, shown key,
    value)``, ``config FILE`` (with ``got``, the place in it whose value reads so) or ``command line --FLAG``; when
    neither has it, the config files given."""
    key = ".".join(parts)
    for i in range(len(argv) - 1, -1, -1):
        token = argv[i]
        name = argv[i + 1] if token in ("--config", "-c") and i + 1 < len(argv) else \
            token.split("=", 1)[1] if token.startswith("--config=") else None
        if name is not None:
            path = Path(name)
            hits = list(_walk(_load_yaml(path), parts, path, [])) if path.is_file() else []
            if hits:
                hit = next((h for h in hits if got is not None and str(h[2]) == got), hits[0])
                return f"config {hit[0] if hit[0] != path else name}", hit[1], hit[2]
        elif token.startswith("--") and not (i > 0 and argv[i - 1] in ("--config", "-c")):
            flag, eq, value = token.partition("=")
            flag = flag[2:]
            if flag and (key == flag or key.startswith(flag + ".") or flag.startswith(key + ".")):
                if key.startswith(flag + ".") and (eq or i + 1 < len(argv)):  # a value given whole: the key in it
                    hits = list(_walk(_yaml_value(value if eq else argv[i + 1]), parts[flag.count(".") + 1:],
                                      Path(), [flag]))
                    hit = next((h for h in hits if got is not None and str(h[2]) == got), hits[0] if hits else None)
                    if hit is not None:
                        return f"command line --{flag}", hit[1], hit[2]
                return f"command line --{flag}", key, None
    files = _config_files(argv)
    return (f"configuration {', '.join(files)}" if files else "command line"), key, None


def _nearest(key: str, word: str, choices) -> str:
    """``; did you mean <key with the nearest accepted spelling>?`` or ``.``"""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {key.rsplit('.', 1)[0] + '.' if '.' in key else ''}{close[0]}?" if close else "."


def _help(argv: list[str]) -> str:
    command = next((a for a in argv if a in ("fit", "validate")), "fit")
    return f"mutual-rl {command} --help lists every setting with its type and default"


def _unknown(found: _Finding, settings: dict, argv: list[str]) -> str:
    parts = found.parts
    if found.cls is not None:  # keys inside a class_path or dataclass value: the class's own settings
        fields, owner, j = _fields(found.cls), found.cls.__name__, found.at
        while j < len(parts) and parts[j] in fields and _unwrap(fields[parts[j]]) is not None:
            nested = _unwrap(fields[parts[j]])
            fields, owner, j = _fields(nested), nested.__name__, j + 1
        accepted = list(fields)
    else:
        j = 0
        while j < len(parts) and any(k == ".".join(parts[:j + 1]) or k.startswith(".".join(parts[:j + 1]) + ".")
                                     for k in settings):
            j += 1
        prefix = ".".join(parts[:j])
        accepted = list(dict.fromkeys(k[len(prefix) + 1 if prefix else 0:].split(".")[0] for k in settings
                                      if not prefix or k.startswith(prefix + ".")))
        owner = prefix or "the top level"
    j = min(j, len(parts) - 1) if accepted else len(parts) - 1  # no settings known: the whole key
    where, key, _ = _locate(parts[:j + 1], argv)
    return (f"{where}: {key} is not a setting{_nearest(key, parts[j], accepted)}\n"
            + (f"  Accepted under {owner}: {', '.join(accepted)}.\n" if accepted else "")
            + f"  Fix: correct the spelling or remove {key} ({_help(argv)}).")


def _hint(found: _Finding, settings: dict, parser):
    """The type hint of the key ``found.parts`` and its default (``...`` when not known)."""
    if found.cls is not None:
        hint, j, default = found.cls, found.at, ...
        while j < len(found.parts):
            fields = _fields(_unwrap(hint)) if _unwrap(hint) is not None else {}
            if found.parts[j] not in fields:
                return None, ...
            hint, j = fields[found.parts[j]], j + 1
        return hint, default
    key = ".".join(found.parts)
    action = settings.get(key)
    try:
        default = parser.get_default(key)
    except Exception:  # noqa: BLE001
        default = ...
    return getattr(action, "_typehint", None), default


def parse_error_paragraph(message: str, parser=None, argv: list[str] | None = None) -> str:
    """jsonargparse's parse error ``message`` as one paragraph (module docstring): ``parser`` is the CLI's parser
    (its settings and types), ``argv`` the parsed command line (its ``--config`` files)."""
    argv = [str(a) for a in (argv or [])]
    try:
        return _parse_error_paragraph(message, parser, argv)
    except Exception:  # noqa: BLE001 (a message this reading does not know: jsonargparse's own, as one paragraph)
        files = _config_files(argv)
        return paragraph(_HEAD, ValueError(message.strip() + (f" (configuration: {', '.join(files)})" if files else "")))


def _wrong_type(found: _Finding, settings: dict, sub, argv: list[str]) -> str:
    """A value of the wrong type, or a class_path that does not import: where, the key, what it takes, the fix."""
    hint, default = _hint(found, settings, sub)
    parts = found.parts + (["class_path"] if found.kind == "class" else [])
    where, key, value = _locate(parts, argv, found.got)
    got = repr(value) if value is not None else repr(found.got) if found.got is not None else None
    got = got if got is None or len(got) <= 80 else got[:72] + " ..."
    wanted = _describe(hint) if hint is not None else "another type"
    if found.kind == "class":
        base = _unwrap(hint) if hint is not None else None
        kind = f"a {base.__name__} subclass" if base is not None else "the class"
        return (f"{where}: {key} {got} is not a class that imports.\n  Fix: name {kind} by its name or its full "
                f"import path (package.module.Class) ({_help(argv)}).")
    return (f"{where}: {key} must be {wanted}" + (f", got {got}." if got is not None else ".")
            + f"\n  Fix: set {key} to {wanted}"
            + (f" (default: {default!r})" if default is not ... and default is not None else "")
            + f"; {_help(argv)}.")


def _parse_error_paragraph(message: str, parser, argv: list[str]) -> str:
    sub = _subparser(parser, argv) if parser is not None else None
    settings = _settings(sub) if sub is not None else {}
    found = _read(message, [])
    if found.kind == "unknown":
        text = _unknown(found, settings, argv)
    elif found.kind in ("type", "class"):
        text = _wrong_type(found, settings, sub, argv)
    elif found.kind == "file":
        name = next((f for f in _config_files(argv) if Path(f).resolve() == Path(found.got).resolve()), found.got)
        what = "is a folder, not a config file" if found.text.startswith("Path is not") else "does not exist"
        text = (f"config {name} {what} ({found.got}).\n  Fix: give --config the path of a YAML config file "
                f"(a relative path starts from the folder mutual-rl runs in, {os.getcwd()}).")
    elif found.kind == "subconfig":
        where, key, _ = _locate(found.parts, argv, found.got)
        text = (f"{where}: {key}: {found.got} does not load as a config file (no such file, relative to the config "
                f"that names it).\n  Fix: give {key} a mapping of its settings, or the path of a YAML file relative "
                "to the config that names it.")
    elif m := re.match(r"the following arguments are required: (.*)", message):
        keys = [k.split(".", 1)[1] if k.split(".")[0] in ("fit", "validate") else k for k in m.group(1).split(", ")]
        hint = getattr(settings.get(keys[0]), "_typehint", None)
        files = _config_files(argv)
        text = (f"{', '.join(keys)} must be set and is not" + (f" ({_describe(hint)})" if hint is not None else "")
                + (f" (configuration: {', '.join(files)})" if files else "")
                + f".\n  Fix: set {keys[0]} in a config file (configs/base.yaml shows one) or with --{keys[0]}.")
    elif message.startswith("Unexpected config"):
        files = [f for f in _config_files(argv) if Path(f).is_file() and not isinstance(_load_yaml(Path(f)), dict)]
        text = (f"config {files[0] if files else ', '.join(_config_files(argv))} is not a mapping of settings "
                f"(it is empty or a list).\n  Fix: write the settings as keys: trainer:, model:, data: ({_help(argv)}).")
    elif m := re.match(r"argument subcommand: invalid choice: '([^']*)' \(choose from (.*)\)", message):
        text = (f"{m.group(1)} is not a subcommand of mutual-rl; accepted: {m.group(2).replace(chr(39), '')}, "
                "compare.\n  Fix: mutual-rl fit --config <file.yaml> (mutual-rl --help lists the subcommands).")
    elif m := re.match(r"unrecognized arguments: (.*)", message):
        flags = [a for a in m.group(1).split() if a.startswith("--")]
        if flags:
            flag = flags[0][2:].split("=")[0]
            return _HEAD + ": " + _unknown(_Finding("unknown", flag.split(".")), settings, argv)
        text = f"{message} ({_help(argv)})."
    elif found.parts and found.parts != ["config"]:  # another message about one key: that key, where it was given
        where, key, _ = _locate(found.parts, argv)
        text = f"{where}: {key}: {found.text} ({_help(argv)})."
    else:
        text = message.strip()
        if (files := _config_files(argv)) and not any(f in text for f in files):
            text += f" (configuration: {', '.join(files)})"
    return paragraph(_HEAD, ValueError(text))


__all__ = ["parse_error_paragraph"]
