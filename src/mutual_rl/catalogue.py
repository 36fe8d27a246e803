"""Everything a run logs, listed from where the names come from: docs/metrics.md is generated from this module.

Two sources, no third: the fields of the typed records a step reports (:class:`mutual_rl.step.report.PolicyStepReport`
and what it holds, each regime's statistics record), named the way :func:`mutual_rl.stats.flatten` names them and
described by the fields' own docstrings; and the families of :mod:`mutual_rl.names` (exchange flows, THL residuals,
the held-out evaluation, MWRA). Each entry is a template (``<policy>/self/approx_kl``, ``exchange/<source>-><receiver>/
dropped/<reason>``); :func:`find` says which entry a logged name is. Regenerate the page with::

    python -m mutual_rl.catalogue > docs/metrics.md
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import import_module

from mutual_rl.names import FAMILIES, RUN_REWARD

POLICY = "<policy>/"
EVERY_STEP = "every step"


@dataclass(frozen=True)
class Entry:
    """One logged name (a template), what it is, where it is defined and when it is logged."""

    name: str
    what: str
    producer: str
    when: str
    section: str

    @property
    def pattern(self) -> re.Pattern:
        """The regular expression of the names this template stands for (a placeholder: one path part)."""
        out, pos = [], 0
        for m in re.finditer(r"<[^<>]+>|\[[^\]]+\]", self.name):
            out.append(re.escape(self.name[pos:m.start()]))
            part = m.group()
            if part.startswith("["):  # [self/|peer/]: one of the alternatives or nothing
                out.append("(?:" + "|".join(re.escape(a) for a in part[1:-1].split("|")) + ")?")
            else:
                out.append(r"[^/]+")
            pos = m.end()
        out.append(re.escape(self.name[pos:]))
        return re.compile("".join(out) + r"\Z")


# ------------------------------------------------------------------------------------------- field docstrings
@cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}``: the string literal right after each annotated field in ``cls``'s source (the
    attribute docstring convention); a field without one is absent."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    out = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            out[node.target.id] = " ".join(nxt.value.value.split())
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _record_types(cls: type, f: dataclasses.Field) -> list[type]:
    """The record types a field holds: its annotation (``X | None`` unwrapped), or for an ``Any`` field the class its
    ``record`` metadata names (``module:Class``)."""
    if "record" in f.metadata:
        mod, _, name = f.metadata["record"].partition(":")
        return [getattr(import_module(mod), name)]
    hint = _annotation(cls, f)
    args = typing.get_args(hint) or (hint,)
    return [a for a in args if dataclasses.is_dataclass(a)]


def _annotation(cls: type, f: dataclasses.Field):
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__])).get(f.name)


def _is_mapping(cls: type, f: dataclasses.Field) -> bool:
    hint = _annotation(cls, f)
    return any(typing.get_origin(h) in (Mapping, dict) or h in (Mapping, dict)
               for h in (typing.get_args(hint) if typing.get_origin(hint) is types.UnionType else (hint,)))


def record_entries(cls: type, prefix: str, producer: str, when: str, section: str,
                   listed: frozenset[type] = frozenset()) -> Iterator[Entry]:
    """The entries of a record's logged fields and ``derived`` properties (names as :func:`stats.flatten` gives
    them). Several fields holding the same record type under different prefixes (``ObjectiveStats``' rows / own
    / peer) are one entry per inner field, written ``[self/|peer/]``. A nested record of a type in ``listed`` is
    left out (it is listed in its own section: GRAFT's cross rule holds SGT's or HACPO's record)."""
    docs = field_docs(cls)
    nested: dict[type, list[str]] = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("log") is False:
            continue
        name = prefix + f.metadata.get("prefix", f.name)
        inner = f.metadata.get("prefix", "")
        types = _record_types(cls, f)
        if types:
            for t in types:
                if t not in listed:
                    nested.setdefault(t, []).append(inner)
        elif f.metadata.get("prefix") == "" and _annotation(cls, f) is typing.Any:
            continue  # a record flattened in place whose type only the run knows (the step report's ``regime``)
        elif _is_mapping(cls, f):
            key = f.metadata.get("key", "<key>")
            yield Entry(name + key, _one_line(docs.get(f.name, "")), f"{cls.__module__}.{cls.__name__}."
                        f"{f.name}", when, section)
        else:
            yield Entry(name, _one_line(docs.get(f.name, "")), f"{cls.__module__}.{cls.__name__}.{f.name}",
                        when, section)
    for t, inners in nested.items():
        alt = inners[0] if len(inners) == 1 else "[" + "|".join(i for i in inners if i) + "]"
        yield from record_entries(t, prefix + alt, producer, when, section, listed)
    for name in getattr(cls, "derived", ()):
        doc = getattr(cls, name).__doc__ or ""
        yield Entry(prefix + name, _one_line(doc), f"{cls.__module__}.{cls.__name__}.{name}", when, section)


# -------------------------------------------------------------------------------------------------- the list
def regime_stats() -> dict[str, type]:
    """``{regime name: its statistics record}`` of every registered regime that logs one."""
    from mutual_rl.regimes import available_regimes, regime_class

    out = {}
    for name in available_regimes():
        cls = getattr(regime_class(name), "stats_type", None)
        if cls is not None:
            out[name] = cls
    return out


def _section(template: str) -> str:
    """The docs page's section of a :mod:`mutual_rl.names` family."""
    heads = {"exchange": "The exchange", "thl": "Tokenizer crossing (THL)", "alloc": "MWRA (ResourceAllocation)"}
    if template.split("/")[0] in heads:
        return heads[template.split("/")[0]]
    return "Every step, run level" if template == RUN_REWARD else "Evaluation"


@cache
def entries() -> tuple[Entry, ...]:
    """Every logged name: the step report's records, each regime's record, then the families of
    :mod:`mutual_rl.names`; in that order, each name once per section (SGT also logs ``all_fail_frac``, as the
    scoring does)."""
    from mutual_rl.step.report import PolicyStepReport

    out: list[Entry] = list(record_entries(PolicyStepReport, POLICY, "mutual_rl.step.report", EVERY_STEP,
                                           "Every step, per policy"))
    regimes = regime_stats()
    for regime, cls in regimes.items():
        out += record_entries(cls, POLICY, cls.__module__, f"every step, regime {regime}", f"Regime `{regime}`",
                              frozenset(regimes.values()) - {cls})
    out += [Entry(fam.template, fam.what, fam.producer, fam.when, _section(fam.template)) for fam in FAMILIES]
    seen: dict[tuple[str, str], Entry] = {}
    for e in out:
        seen.setdefault((e.section, e.name), e)
    return tuple(seen.values())


def find(name: str) -> Entry | None:
    """The entry a logged name is an instance of (the most specific: fewest placeholders), or None."""
    hits = [e for e in entries() if e.pattern.match(name)]
    return min(hits, key=lambda e: e.name.count("<") + e.name.count("["), default=None)


def markdown() -> str:
    """docs/metrics.md: every entry, by section."""
    lines = ["# What is logged", "",
             "Generated by `python -m mutual_rl.catalogue > docs/metrics.md` from the records the trainer logs and "
             "from `mutual_rl.names` (tests/test_catalogue.py checks that this page is current and that every name a "
             "run logs is listed here). `<policy>` is a policy's name, `<source>` / `<receiver>` a peer that sent / "
             "received responses, `<A>-><B>` an evaluation direction, `[self/|peer/]` one of those prefixes or none "
             "(all the rows of the update, the policy's own rows, the peers' rows; which are present depends on the "
             "objective). A name that has no value at a step is logged as NaN there (a count as 0), so a dashboard "
             "shows a gap instead of repeating the last value.", ""]
    by_section: dict[str, list[Entry]] = {}
    for e in entries():
        by_section.setdefault(e.section, []).append(e)
    for section, es in by_section.items():
        lines += [f"## {section}", "", "| name | what | defined in |", "|---|---|---|"]
        for e in es:
            what = e.what.replace("|", "\\|") or "(undocumented)"
            lines.append(f"| `{e.name}` | {what} | `{e.producer}` |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
