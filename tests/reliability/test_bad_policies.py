"""Policy inputs that cannot work fail (or warn) with messages that name the policy, the setting and the fix."""

from __future__ import annotations

import warnings

import pytest

from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import PolicySpec, SamplingSpec, WarmStart


@pytest.mark.parametrize("model", ["./no/such/dir", "../no/such/dir", "/tmp/mutual-rl-missing-xyz/model",
                                   "~/mutual-rl-missing-xyz", "tests/no-such-checkpoint"])
def test_missing_local_model_path_is_named(model):
    """Local-looking paths (prefix ``/ ./ ../ ~``, or a first part that exists here: ``tests/``) must exist; the
    message is ours, not transformers' "Repo id must be in the form ..."."""
    with pytest.raises(FileNotFoundError) as err:
        build_policy(PolicySpec(name="alice", model=model))
    msg = str(err.value)
    assert f"policy 'alice': model {model!r} was not found" in msg
    assert "does not exist" in msg and "Fix this policy's model:" in msg
    assert "Repo id must be" not in msg


def test_missing_local_tokenizer_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"policy 'bob': tokenizer '\./no/tok' was not found"):
        build_policy(PolicySpec(name="bob", model=str(tmp_path), tokenizer="./no/tok"))


def test_hub_ids_are_left_to_transformers():
    """``name`` and ``org/name`` whose ``org`` is no local folder are Hub ids, passed to transformers unchanged."""
    from mutual_rl.model.loading import _checked_path

    assert _checked_path("p", "model", "no-such-org-xyz/model") == "no-such-org-xyz/model"
    assert _checked_path("p", "model", "gpt2") == "gpt2"


def test_warmstart_on_a_non_preset_model_is_an_error():
    with pytest.raises(ValueError) as err:
        PolicySpec(name="carol", model="Qwen/Qwen3-0.6B", warmstart=WarmStart(steps=10))
    msg = str(err.value)
    assert "policy 'carol'" in msg and "warmstart is set" in msg and "'Qwen/Qwen3-0.6B' is not a tiny: preset" in msg
    assert "Remove warmstart from this policy" in msg
    PolicySpec(name="carol", model="tiny:gpt2-bpe", warmstart=WarmStart(steps=10))  # presets take it
    PolicySpec(name="carol", model="Qwen/Qwen3-0.6B")  # no warmstart: fine


def test_group_of_one_warns_that_grpo_gets_no_signal():
    with pytest.warns(UserWarning) as record:
        PolicySpec(name="dave", model="tiny:gpt2-bpe", sampling=SamplingSpec(n=1))
    (w,) = [w for w in record if "sampling.n is 1" in str(w.message)]
    msg = str(w.message)
    assert msg.startswith("policy 'dave': sampling.n is 1")
    assert "advantage is 0" in msg and "GRPO gets no signal" in msg and "Set sampling.n >= 2" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PolicySpec(name="dave", model="tiny:gpt2-bpe", sampling=SamplingSpec(n=2))
