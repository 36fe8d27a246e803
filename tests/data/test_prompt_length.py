"""Prompts longer than a policy's context: one error at set-up naming policy, rows and lengths, or truncation."""

import time
from types import SimpleNamespace

import pytest

from mutual_rl.data.prompt_length import (
    check_prompt_lengths,
    check_prompt_overflow_mode,
    context_length,
    count_prompt_tokens,
)
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart
from mutual_rl.types import Problem


def _policy(name: str, model: str, max_new_tokens: int = 6):
    spec = PolicySpec(name=name, model=model, warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=2, max_new_tokens=max_new_tokens))
    return build_policy(spec, task=ArithmeticTask(num_train=100, num_heldout=10))


@pytest.fixture(scope="module")
def policies(preset_cache):
    return [_policy("char", "tiny:llama-char"), _policy("bpe", "tiny:gpt2-bpe")]


OK = Problem(1, "12+34=", "46")
LONG = Problem(2, "1" * 300 + "+1=", "2")  # > 250 tokens for both tokenizers (one token per digit)


def test_context_length_comes_from_the_model_config(policies):
    assert context_length(policies[0]) == (256, "model config max_position_embeddings")
    assert context_length(policies[1]) == (256, "model config max_position_embeddings")  # GPT-2: n_positions alias
    tok = SimpleNamespace(model_max_length=512)
    assert context_length(SimpleNamespace(model=SimpleNamespace(config=None), tokenizer=tok)) == (
        512, "tokenizer model_max_length")
    tok.model_max_length = int(1e30)  # "no limit" sentinel
    assert context_length(SimpleNamespace(model=SimpleNamespace(config=None), tokenizer=tok)) is None


def test_too_long_prompt_names_policy_row_and_both_lengths(policies):
    with pytest.raises(ValueError) as err:
        check_prompt_lengths(policies, [OK, LONG])
    msg = str(err.value)
    assert ("policy 'char' (tiny:llama-char): 1 of 2 prompts do not fit its context length 256 (model config "
            "max_position_embeddings) with sampling.max_new_tokens 6, i.e. at most 250 prompt tokens") in msg
    assert "prompt 2 '1111" in msg and "(303 characters)" in msg
    assert "304 prompt tokens + 6 (sampling.max_new_tokens) = 310 > 256" in msg  # BOS + 303 characters
    assert "policy 'bpe' (tiny:gpt2-bpe)" in msg and "303 prompt tokens + 6 (sampling.max_new_tokens) = 309" in msg
    assert "model.prompt_overflow: truncate" in msg and "lower max_new_tokens" in msg


def test_exactly_full_context_fits(policies):
    char = policies[0]
    fits = Problem(3, "1" * 249, "1")  # BOS + 249 = 250 prompt tokens, + 6 new = 256
    assert check_prompt_lengths([char], [fits]) == {"char": 0}
    with pytest.raises(ValueError, match="251 prompt tokens"):
        check_prompt_lengths([char], [Problem(3, "1" * 250, "1")])


def test_held_out_prompts_are_checked_against_evaluation_max_new_tokens(policies):
    long = Problem(3, "1" * 200, "1")
    with pytest.raises(ValueError, match=r"with evaluation.max_new_tokens 100, i.e. at most 156 prompt tokens"):
        check_prompt_lengths(policies[:1], [], val_problems=[long], eval_max_new_tokens=100)
    # a training prompt only needs room for the training budget (sampling.max_new_tokens), not evaluation's
    assert check_prompt_lengths(policies[:1], [long], eval_max_new_tokens=100) == {policies[0].name: 0}


def test_max_new_tokens_filling_the_context_is_refused_in_both_modes(preset_cache):
    greedy = _policy("greedy", "tiny:llama-char", max_new_tokens=256)
    for mode in ("error", "truncate"):
        with pytest.raises(ValueError, match=r"policy 'greedy' \(tiny:llama-char\): sampling.max_new_tokens 256 "
                                             r"leaves no room for a prompt in its context length 256"):
            check_prompt_lengths([greedy], [OK], mode=mode)


def test_20_mb_prompt_fails_in_seconds(policies):
    huge = Problem(9, "12+34= " * (20 * 2**20 // 7), "46")
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as err:
        check_prompt_lengths(policies, [OK, huge])
    assert time.perf_counter() - t0 < 5.0
    msg = str(err.value)
    assert "prompt 9 '12+34= 12+34=" in msg and f"({len(huge.problem)} characters)" in msg
    assert "more than 250 prompt tokens (" in msg and "in its first" in msg


def test_window_count_is_exact_for_short_prompts_and_a_lower_bound_otherwise(policies):
    encode = policies[0].encode_prompt
    assert count_prompt_tokens(encode, "1" * 100, 250) == (101, None)
    n, read = count_prompt_tokens(encode, "1" * 10_000, 250)
    assert n > 258 and read is not None and read < 10_000 and n <= len(encode("1" * 10_000))


def test_truncate_mode_keeps_the_last_tokens_and_the_bos(preset_cache, caplog):
    char, bpe = _policy("char", "tiny:llama-char"), _policy("bpe", "tiny:gpt2-bpe")
    full_char = char.encode_prompt(char.render_prompt(LONG.problem))
    with caplog.at_level("WARNING", logger="mutual_rl.data.prompt_length"):
        assert check_prompt_lengths([char, bpe], [OK, LONG], mode="truncate") == {"char": 1, "bpe": 1}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and "policy 'char' (tiny:llama-char): 1 of 2 prompts" in logged[0]
    assert "cut to its last 250 prompt tokens" in logged[0]
    ids = char.encode_prompt(char.render_prompt(LONG.problem))
    assert len(ids) == 250 and ids[0] == char.tokenizer.bos_token_id and ids[1:] == full_char[-249:]
    assert char.encode_prompt("12+34=") == type(char).encode_prompt(char, "12+34=")  # short: unchanged
    assert len(bpe.encode_prompt(bpe.render_prompt(LONG.problem))) == 250
    t0 = time.perf_counter()
    huge_ids = bpe.encode_prompt("12+34= " * (20 * 2**20 // 7))
    assert time.perf_counter() - t0 < 2.0 and len(huge_ids) == 250


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match=r"model.prompt_overflow must be one of error, truncate \(got 'cut'\)"):
        check_prompt_overflow_mode("cut")
