"""Configuration that cannot work: one clear error at construction, naming the setting (and the fix or the
choices). Each case is a line of the README's input -> behaviour catalogue."""

from __future__ import annotations

import pytest

from mutual_rl.model.spec import LoraSpec, OptimizerSpec, PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from mutual_rl.regimes import get_regime
from mutual_rl.rewards import get_reward
from mutual_rl.rollout import get_engine
from mutual_rl.update.config import GRPOConfig


def _p(name: str = "a", **kw) -> PolicySpec:
    return PolicySpec(name=name, model="tiny:gpt2-bpe", **kw)


CASES = {
    "no policies": (lambda: MutualRLModule([]), ["model.policies is empty"]),
    "two policies with one name": (lambda: MutualRLModule([_p(), _p()]), ["policy names must be unique", "'a'"]),
    "policy name with a slash": (lambda: _p("a/b"), ["policy name 'a/b'", "no '/'"]),
    "prompt template without {problem}": (lambda: _p(prompt_template="Q:"), ["prompt_template 'Q:'", "{problem}"]),
    "group size 0": (lambda: SamplingSpec(n=0), ["sampling.n must be >= 1"]),
    "sampling temperature 0": (lambda: SamplingSpec(temperature=0), ["sampling.temperature must be > 0"]),
    "top_p above 1": (lambda: SamplingSpec(top_p=1.5), ["sampling.top_p must be in (0, 1]"]),
    "negative top_k": (lambda: SamplingSpec(top_k=-1), ["sampling.top_k must be >= 0", "0 turns it off"]),
    "max_new_tokens 0": (lambda: SamplingSpec(max_new_tokens=0), ["sampling.max_new_tokens must be >= 1"]),
    "learning rate 0": (lambda: OptimizerSpec(lr=0), ["optimizer.lr must be > 0"]),
    "negative warm-up steps": (lambda: WarmStart(steps=-1), ["warmstart.steps must be >= 0"]),
    "LoRA rank 0": (lambda: LoraSpec(r=0), ["lora.r must be >= 1"]),
    "LoRA dropout 1": (lambda: LoraSpec(dropout=1.0), ["lora.dropout must be in [0, 1)"]),
    "unknown loss aggregation": (lambda: GRPOConfig(agg="mean"), ["algorithm.agg='mean'", "token-mean"]),
    "unknown advantage scale": (lambda: GRPOConfig(scale="x"), ["algorithm.scale='x'", "group, none"]),
    "unknown KL estimator": (lambda: GRPOConfig(kl_kind="k4"), ["algorithm.kl_kind='k4'", "k1, k2, k3"]),
    "unknown old_logp source": (lambda: GRPOConfig(old_logp="x"), ["algorithm.old_logp='x'", "recompute"]),
    "unknown non-finite action": (lambda: GRPOConfig(on_nonfinite="ignore"), ["algorithm.on_nonfinite", "skip"]),
    "zero mini-batches": (lambda: GRPOConfig(num_mini_batches=0), ["num_mini_batches must be >= 1"]),
    "unknown regime": (lambda: get_regime("grafft"), ["Unknown regime 'grafft'", "graft, hacpo"]),
    "unknown regime argument": (lambda: get_regime("sgt", lambda_=0.3), ["'sgt'", "['lambda_']", "coef, seed"]),
    "negative GRAFT delta": (lambda: get_regime("graft", delta=-1), ["graft: delta must be >= 0"]),
    "unknown GRAFT peer_last": (lambda: get_regime("graft", peer_last="first"), ["peer_last='first'", "in_batch"]),
    "unknown HACPO lower_schedule": (lambda: get_regime("hacpo", lower_schedule="epoch"),
                                     ["lower_schedule='epoch'", "update, step"]),
    "HACPO window 0": (lambda: get_regime("hacpo", window=0), ["hacpo: window must be >= 1"]),
    "unknown PRP denominator": (lambda: get_regime("prp", denominator="x"), ["denominator='x'", "peer_aligned"]),
    "unknown THL granularity": (lambda: get_regime("prp", granularity="char"), ["granularity='char'", "word, span"]),
    "negative SGT coef": (lambda: get_regime("sgt", coef=-1), ["sgt: coef must be >= 0"]),
    "negative XGRPO eps": (lambda: get_regime("xgrpo", eps=-1), ["xgrpo: eps must be >= 0"]),
    "unknown reward name": (lambda: get_reward("nope"), ["unknown reward 'nope'", "integer_match"]),
    "reward import path that does not import": (lambda: get_reward("nosuchpkg.mod:fn"),
                                                ["'nosuchpkg.mod:fn'", "No module named 'nosuchpkg'"]),
    "negative THL residual interval": (lambda: MutualRLModule([_p(), _p("b")], thl_residual_every_n_steps=-1),
                                       ["model.thl_residual_every_n_steps must be >= 0"]),
    "unknown rollout engine": (lambda: get_engine("sglang"), ["Unknown rollout engine 'sglang'", "hf, vllm"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_configuration_is_one_named_error(case):
    build, fragments = CASES[case]
    with pytest.raises(ValueError) as err:
        build()
    msg = str(err.value)
    for fragment in fragments:
        assert fragment in msg, (case, msg)
