"""Prompts that do not fit a policy's context: one error at set-up, or left-truncation.

A policy's context length is, in this order, its model config's ``max_position_embeddings`` or ``n_positions``
(of the text config for multimodal models), else its tokenizer's ``model_max_length`` when that is at most
10,000,000 (tokenizers without a limit report ~1e30); with none of these a policy is not checked. A prompt
fits iff ``prompt tokens + max_new_tokens <= context length``, where prompt tokens are those the policy
samples from (``policy.encode_prompt(policy.render_prompt(problem))``: template, chat template and BOS
included) and ``max_new_tokens`` is the policy's ``sampling.max_new_tokens`` for training prompts and
``evaluation.max_new_tokens`` for held-out prompts. A prompt whose rendered text has at most ``limit - overhead - 8``
UTF-8 bytes (``overhead`` = the tokens of the policy's prompt format around an empty problem, a bound on the special
tokens a chat template or BOS adds) fits without being tokenized: every token of the text covers at least one byte.

Counting never tokenizes more than it needs to decide: a prompt of more than ``8 * (limit + 8)`` characters
(``limit`` = context length - max_new_tokens) is first judged on that many leading characters, cut after the last
whitespace of their second half; if those alone have more than ``limit + 8`` tokens the prompt is too long (a
cut at a word boundary moves a count by a token or two, not 8), otherwise the window doubles, up to the whole
prompt. So a 20 MB prompt is refused after tokenizing a few thousand characters.

``prompt_overflow="truncate"`` keeps each prompt's last ``limit`` tokens instead (a leading BOS token is kept as
the first of them), for every prompt the policy encodes from then on; the same window rule reads only the
prompt's tail. The number of prompts this cuts is logged once per policy at WARNING.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from mutual_rl.types import Problem

log = logging.getLogger(__name__)

PROMPT_OVERFLOW_MODES = ("error", "truncate")
MAX_SANE_MODEL_MAX_LENGTH = 10_000_000
CHARS_PER_TOKEN_WINDOW = 8
MARGIN_TOKENS = 8
SHOWN_ROWS = 3


def check_prompt_overflow_mode(mode: str) -> None:
    """``mode`` must be ``error`` or ``truncate``; else ``ValueError`` naming the setting."""
    if mode not in PROMPT_OVERFLOW_MODES:
        raise ValueError(f"model.prompt_overflow must be one of {', '.join(PROMPT_OVERFLOW_MODES)} (got {mode!r}): "
                         "'error' stops at set-up when a prompt does not fit a policy's context, 'truncate' keeps "
                         "the prompt's last tokens.")


def context_length(policy) -> tuple[int, str] | None:
    """``(length, where it came from)`` of ``policy``'s context (module docstring), or ``None`` if unknown."""
    config = getattr(policy.model, "config", None)
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config):
        try:
            config = get_text_config()
        except Exception:  # noqa: BLE001 - an unusual config: read the top-level one
            pass
    for key in ("max_position_embeddings", "n_positions"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, f"model config {key}"
    value = getattr(policy.tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value <= MAX_SANE_MODEL_MAX_LENGTH:
        return value, "tokenizer model_max_length"
    return None


def _encoder(policy) -> Callable[[str], list[int]]:
    """The policy's own prompt encoding without truncation."""
    return getattr(policy, "encode_full_prompt", None) or policy.encode_prompt


def _head(text: str, size: int) -> str:
    head = text[:size]
    cut = max(head.rfind(" "), head.rfind("\n"))
    return head[:cut] if cut >= size // 2 else head


def _tail(text: str, size: int) -> str:
    tail = text[-size:]
    cut = min((i for i in (tail.find(" "), tail.find("\n")) if i >= 0), default=-1)
    return tail[cut + 1:] if 0 <= cut <= size // 2 else tail


def count_prompt_tokens(encode: Callable[[str], list[int]], text: str, limit: int) -> tuple[int, int | None]:
    """``(tokens, characters read)``: the exact count of ``text`` with ``None``, or, for a prompt judged on its
    first characters (module docstring), their count (more than ``limit + 8``) and how many were read."""
    window = CHARS_PER_TOKEN_WINDOW * (limit + MARGIN_TOKENS)
    while len(text) > window:
        head = _head(text, window)
        n = len(encode(head))
        if n > limit + MARGIN_TOKENS:
            return n, len(head)
        window *= 2
    return len(encode(text)), None


def truncated_prompt_ids(encode: Callable[[str], list[int]], text: str, limit: int,
                         bos_token_id: int | None) -> list[int]:
    """``encode(text)`` cut to its last ``limit`` tokens, a leading BOS kept (module docstring)."""
    window = CHARS_PER_TOKEN_WINDOW * (limit + MARGIN_TOKENS)
    while True:
        if len(text) <= window:
            ids = encode(text)
            break
        ids = encode(_tail(text, window))
        if len(ids) > limit + MARGIN_TOKENS:
            break
        window *= 2
    if len(ids) <= limit:
        return ids
    if bos_token_id is not None and ids[0] == bos_token_id and limit > 1:
        return ids[:1] + ids[len(ids) - limit + 1:]
    return ids[len(ids) - limit:]


def install_prompt_truncation(policy, limit: int) -> None:
    """From now on ``policy.encode_prompt`` returns at most ``limit`` tokens (its last ones, BOS kept)."""
    policy.max_prompt_tokens = int(limit)


def _preview(text: str, limit: int = 80) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def _overflow_report(policy, over, n_rows: int, ctx: int, source: str, max_new: int, label: str) -> str:
    limit = ctx - max_new
    rows = []
    for p, n, read in over[:SHOWN_ROWS]:
        total = (f"{n} prompt tokens + {max_new} ({label}) = {n + max_new}" if read is None else
                 f"more than {limit} prompt tokens ({n} in its first {read} characters) + {max_new} ({label})")
        rows.append(f"  prompt {p.prompt_id} {_preview(p.problem)}: {total} > {ctx}")
    if len(over) > SHOWN_ROWS:
        rows.append(f"  ... and {len(over) - SHOWN_ROWS} more (prompt ids "
                    f"{', '.join(str(p.prompt_id) for p, _, _ in over[SHOWN_ROWS:SHOWN_ROWS + 10])}"
                    f"{', ...' if len(over) > SHOWN_ROWS + 10 else ''})")
    return (f"policy {policy.name!r} ({policy.spec.model}): {len(over)} of {n_rows} prompts do not fit its context "
            f"length {ctx} ({source}) with {label} {max_new}, i.e. at most {limit} prompt tokens:\n"
            + "\n".join(rows))


def check_prompt_lengths(policies: Sequence, problems: Sequence[Problem], *, mode: str = "error",
                         eval_max_new_tokens: int | None = None,
                         val_problems: Sequence[Problem] = ()) -> dict[str, int]:
    """How many prompts do not fit each policy (``{policy name: count}``; module docstring).

    ``problems`` (training prompts) are checked against the policy's ``sampling.max_new_tokens``,
    ``val_problems`` (held-out prompts) against ``eval_max_new_tokens`` (default: the same). ``mode="error"``:
    any such prompt raises one ``ValueError`` naming, per policy, the first rows (prompt id and text preview) with
    their token counts, the context length and its source, and the fixes. ``mode="truncate"``: each policy with a
    known context gets :func:`install_prompt_truncation` with one limit for every prompt it encodes (context
    length minus the larger budget of the two sets, so training prompts may be cut a little more than their own
    budget needs) and a count over 0 is logged once. A budget that leaves no room for a prompt raises in both modes.
    """
    check_prompt_overflow_mode(mode)
    counts: dict[str, int] = {}
    reports: list[str] = []
    for policy in policies:
        found = context_length(policy)
        if found is None:
            log.info("policy %r: context length unknown (no max_position_embeddings, n_positions or "
                     "model_max_length); prompt lengths are not checked", policy.name)
            continue
        ctx, source = found
        train_new = policy.spec.sampling.max_new_tokens
        sets = [(problems, train_new, "sampling.max_new_tokens")]
        if val_problems:
            eval_new = eval_max_new_tokens if eval_max_new_tokens is not None else train_new
            sets.append((val_problems, eval_new, "evaluation.max_new_tokens"))
        for _, max_new, label in sets:
            if ctx - max_new < 1:
                raise ValueError(f"policy {policy.name!r} ({policy.spec.model}): {label} {max_new} leaves no room "
                                 f"for a prompt in its context length {ctx} ({source}); set {label} below {ctx}.")
        encode, seen = _encoder(policy), {}
        overhead = len(encode(policy.render_prompt("")))  # template, chat template and special tokens
        over_all, total = [], 0
        for rows, max_new, label in sets:
            limit = ctx - max_new
            over = []
            for p in rows:
                text = policy.render_prompt(p.problem)
                if len(text.encode("utf-8")) + overhead + MARGIN_TOKENS <= limit:
                    continue  # fits without tokenizing: every token of the text covers at least one byte
                if text not in seen:
                    seen[text] = count_prompt_tokens(encode, text, ctx)
                n, read = seen[text]
                if n > limit:
                    over.append((p, n, read))
            total += len(rows)
            over_all += over
            if over and mode == "error":
                reports.append(_overflow_report(policy, over, len(rows), ctx, source, max_new, label))
        counts[policy.name] = len({id(p) for p, _, _ in over_all})
        if mode == "truncate":
            max_new = max(m for _, m, _ in sets)
            install_prompt_truncation(policy, ctx - max_new)
            if over_all:
                log.warning("policy %r (%s): %d of %d prompts do not fit its context length %d (%s) with "
                            "max_new_tokens %d; each is cut to its last %d prompt tokens (model.prompt_overflow: "
                            "truncate)", policy.name, policy.spec.model, len(over_all), total, ctx, source, max_new,
                            ctx - max_new)
    if reports:
        raise ValueError("\n".join(reports) + "\nShorten or drop these prompts, lower max_new_tokens, use a "
                         "model with a longer context, or set model.prompt_overflow: truncate to keep each prompt's "
                         "last tokens.")
    return counts
