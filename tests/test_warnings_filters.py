"""What ``ignore_inapplicable_warnings`` silences when a fit starts: torch's LeafSpec deprecation (raised by
Lightning's own code) and transformers' padding false alarm, and nothing else of either; our own ``generate`` calls
drop the false alarm outside a fit too."""

from __future__ import annotations

import contextlib
import logging
import warnings

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from mutual_rl.warnings_filters import TRANSFORMERS_LOGGER, FinishedRowPadFilter, ignore_inapplicable_warnings

LEAFSPEC = "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec) and treespec.is_leaf()`"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def transformers_logger():
    """transformers' logger as a fit leaves it (an earlier fit in this process may have added the filter) is put
    back after the test; in it, no filter and the WARNING level, whatever earlier tests set."""
    logger = logging.getLogger(TRANSFORMERS_LOGGER)
    handler, filters, level = _Collect(), list(logger.filters), logger.level
    logger.filters[:] = [f for f in filters if not isinstance(f, FinishedRowPadFilter)]
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    yield logger, handler
    logger.removeHandler(handler)
    logger.filters[:] = filters
    logger.setLevel(level)


def _forward_with_a_finished_row(model) -> None:
    logging.Logger.warning_once.cache_clear()  # transformers says it once per process
    model(input_ids=torch.tensor([[3, 5, 2], [4, 2, 2]]))  # row 2 ended (pad = EOS = 2), no mask: as in generate


def test_padding_false_alarm_is_dropped_and_other_records_kept(transformers_logger):
    logger, seen = transformers_logger
    model = GPT2LMHeadModel(GPT2Config(vocab_size=8, n_embd=8, n_layer=1, n_head=2, n_positions=8,
                                       pad_token_id=2, eos_token_id=2, bos_token_id=2))
    _forward_with_a_finished_row(model)
    assert len(seen.messages) == 1 and seen.messages[0].startswith(FinishedRowPadFilter.MESSAGE)  # the real message
    seen.messages.clear()
    ignore_inapplicable_warnings()
    ignore_inapplicable_warnings()  # idempotent
    assert sum(isinstance(f, FinishedRowPadFilter) for f in logger.filters) == 1
    _forward_with_a_finished_row(model)
    logger.warning("another transformers warning")
    assert seen.messages == ["another transformers warning"]


def test_leafspec_deprecation_is_ignored_and_other_future_warnings_are_not():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ignore_inapplicable_warnings()
        warnings.warn(LEAFSPEC, FutureWarning, stacklevel=1)  # ignored
        with pytest.raises(FutureWarning, match="something else"):
            warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)


@pytest.mark.parametrize("sampler", ["generate", "static"])
def test_our_generate_drops_the_false_alarm_outside_a_fit(transformers_logger, monkeypatch, sampler):
    """An evaluation outside a fit (``scripts/preconditions.py``, a comparison's step 0): the HF engine installs
    the filter itself, around both of its samplers. Same-length prompts (both then drop the all-ones mask) and an
    EOS made likely, so rows finish early and are padded: without the filter the message is printed. ``generate``
    feeds every finished row's pad token back; the static loop drops finished rows from the batch once an eighth
    of those running have finished, so 64 rows are drawn and EOS is only somewhat likely (+2: at +4 eight or more
    finish on their first token and are dropped before any pad is fed): a row that finishes first is fed its pad
    at least once before enough others have."""
    from mutual_rl.data.task import ArithmeticTask
    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import SamplingSpec
    from mutual_rl.rollout import hf
    from mutual_rl.types import Problem
    from tests.module.helpers import TASK, spec

    logger, seen = transformers_logger
    policy = build_policy(spec("p", "tiny:gpt2-bpe"), task=ArithmeticTask(**TASK))
    eos = policy.tokenizer.eos_token_id

    def likely_eos(module, args, out):
        out = out.clone()
        out[..., eos] += 2.0
        return out

    head = policy.model.get_output_embeddings()
    handle = head.register_forward_hook(likely_eos)
    problems = [Problem(1, "3+4=", "7", "add"), Problem(2, "5+1=", "6", "add")]
    assert len({len(policy.encode_prompt(p.problem)) for p in problems}) == 1  # no padding: the mask is all ones

    engine = hf.HFRolloutEngine(sampler=sampler)
    assert engine.uses_static_sampler(policy) == (sampler == "static")  # the sampler under test runs

    def run() -> list:
        logging.Logger.warning_once.cache_clear()
        torch.manual_seed(0)
        return [r for g in engine.generate(policy, problems, SamplingSpec(n=32, max_new_tokens=6), step=0) for r in g]

    try:
        with monkeypatch.context() as m:  # the control: the engine without its filter prints the message
            m.setattr(hf, "finished_row_pad_alarm_silenced", contextlib.nullcontext)
            rows = run()
        assert any(r.finish_reason == "eos" and len(r.response_ids) < 6 for r in rows)  # a row finished early
        assert [x for x in seen.messages if x.startswith(FinishedRowPadFilter.MESSAGE)]
        seen.messages.clear()
        run()
        assert not [x for x in seen.messages if x.startswith(FinishedRowPadFilter.MESSAGE)]
        assert not any(isinstance(f, FinishedRowPadFilter) for f in logger.filters)  # for the call only
        pad = policy.tokenizer.pad_token_id
        logging.Logger.warning_once.cache_clear()
        policy.model(input_ids=torch.tensor([[3, 5, pad], [4, pad, pad]]))  # a user's mask-less call: still warned
        assert [x for x in seen.messages if x.startswith(FinishedRowPadFilter.MESSAGE)]
    finally:
        handle.remove()
