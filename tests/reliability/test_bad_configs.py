"""Configuration that cannot work: one clear error at construction or parse time, naming the setting (and the fix or
the choices). Each case is a line of the README's input -> behaviour catalogue: construction errors, the CLI's
removed options, evaluation.temperature, regime configuration and the module's reward/prompt settings."""

from __future__ import annotations

import re
import sys
from types import SimpleNamespace

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

import mutual_rl.evaluation.validation as validation
from mutual_rl.cli import main
from mutual_rl.evaluation import EvalConfig, Evaluator
from mutual_rl.exchange import ExperienceExchange
from mutual_rl.model.spec import LoraSpec, OptimizerSpec, PolicySpec, SamplingSpec, WarmStart
from mutual_rl.module import MutualRLModule
from mutual_rl.regimes import get_regime
from mutual_rl.rewards import build_reward, get_reward, integer_match
from mutual_rl.rollout import get_engine
from mutual_rl.types import Problem
from mutual_rl.update.config import GRPOConfig
from tests.module.helpers import datamodule, pair, spec, trainer
from tests.reliability.one_glance import one_glance


def _p(name: str = "a", **kw) -> PolicySpec:
    return PolicySpec(name=name, model="tiny:gpt2-bpe", **kw)


CASES = {
    "no policies": (lambda: MutualRLModule([]), ["model.policies is empty"]),
    "two policies with one name": (lambda: MutualRLModule([_p(), _p()]), ["policy names must be unique", "'a'"]),
    "policy name with a slash": (lambda: _p("a/b"), ["policy name 'a/b'", "letters, digits", "'a_b'"]),
    "policy name with a dot": (lambda: _p("qwen2.5"), ["policy name 'qwen2.5'", "'.' and '/'", "'qwen2_5'"]),
    "policy name of 300 characters": (lambda: _p("x" * 300), ["1 to 64 letters", "export folder"]),
    "optimizer eps 0": (lambda: OptimizerSpec(eps=0), ["optimizer.eps must be > 0", "default is 1e-8"]),
    "negative gradient clip": (lambda: OptimizerSpec(grad_clip=-1), ["optimizer.grad_clip must be >= 0",
                                                                      "flip the gradient"]),
    "AdamW beta of 1": (lambda: OptimizerSpec(betas=(0.9, 1.0)), ["optimizer.betas must be two numbers in [0, 1)"]),
    "negative weight decay": (lambda: OptimizerSpec(weight_decay=-0.1), ["optimizer.weight_decay must be >= 0"]),
    "infinite learning rate": (lambda: OptimizerSpec(lr=float("inf")), ["optimizer.lr must be > 0"]),
    "negative advantage eps": (lambda: GRPOConfig(eps=-1), ["algorithm.eps must be > 0", "reward std"]),
    "advantage eps 0": (lambda: GRPOConfig(eps=0), ["algorithm.eps must be > 0"]),
    "negative KL coefficient": (lambda: GRPOConfig(kl_coef=-1), ["algorithm.kl_coef must be >= 0"]),
    "clip_low of 1": (lambda: GRPOConfig(clip_low=1.0), ["algorithm.clip_low must be in [0, 1)"]),
    "negative clip_high": (lambda: GRPOConfig(clip_high=-0.1), ["algorithm.clip_high must be >= 0"]),
    "dual clip of 1": (lambda: GRPOConfig(dual_clip=1.0), ["algorithm.dual_clip must be > 1 or null"]),
    "NaN success threshold": (lambda: GRPOConfig(success_threshold=float("nan")), ["success_threshold must be finite"]),
    "evaluation max_new_tokens 0": (lambda: EvalConfig(max_new_tokens=0), ["evaluation.max_new_tokens must be >= 1"]),
    "negative evaluation max_new_tokens": (lambda: EvalConfig(max_new_tokens=-3),
                                           ["evaluation.max_new_tokens must be >= 1 or null (got -3)"]),
    "reward terms all of weight 0": (lambda: build_reward([{"fn": "integer_match", "weight": 0.0},
                                                          {"fn": "boxed_format", "weight": 0}]),
                                     ["every term's weight is 0", "integer_match, boxed_format", "nothing trains"]),
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


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    """The CLI is driven with ``args``; pytest's own command line is not its concern."""
    monkeypatch.setattr(sys, "argv", ["mutual-rl"])


def _spec(name: str = "char", n: int = 2, max_new_tokens: int = 5) -> PolicySpec:
    return PolicySpec(name=name, model="tiny:llama-char", warmstart=WarmStart(steps=0),
                      sampling=SamplingSpec(n=n, max_new_tokens=max_new_tokens))


# ------------------------------------------------------------------------------ 1. no --optimizer / --lr_scheduler
@pytest.mark.slow
def test_optimizer_option_is_a_parse_error_naming_the_per_policy_setting(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--optimizer", "Adam", "--model.policies", "[{name: a, model: 'tiny:gpt2-bpe'}]"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--optimizer is not an option of mutual-rl" in err and "model.policies[i].optimizer" in err
    one_glance(err, "--optimizer", "model.policies[i].optimizer", head="mutual-rl: configuration error: ")


@pytest.mark.slow
def test_optimizer_key_in_a_config_file_is_a_parse_error(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"lr_scheduler": {"class_path": "torch.optim.lr_scheduler.StepLR"},
                                   "model": {"policies": [{"name": "a", "model": "tiny:gpt2-bpe"}]}}))
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(cfg)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"lr_scheduler (in {cfg}) is not an option of mutual-rl" in err and "model.policies[i].optimizer" in err
    one_glance(err, f"lr_scheduler (in {cfg})", head="mutual-rl: configuration error: ")


@pytest.mark.slow
def test_help_does_not_list_optimizer_or_lr_scheduler(capsys):
    with pytest.raises(SystemExit) as e:
        main(["fit", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--model.policies" in out
    assert "--optimizer" not in out and "--lr_scheduler" not in out


# ---------------------------------------------------------------------------- 5. evaluation.temperature: 0
class _NoSampling:
    def generate(self, *args, **kwargs):
        raise AssertionError("temperature 0 must not sample")


def test_eval_temperature_zero_is_greedy(monkeypatch):
    greedy = {1: "5", 2: "0"}  # right, wrong
    calls = []

    def fake_greedy(policy, problems, max_new, batch_size):
        calls.append(len(problems))
        return [greedy[p.prompt_id] for p in problems]

    monkeypatch.setattr(validation, "greedy_generate", fake_greedy)
    ev = Evaluator(EvalConfig(k=4, temperature=0), integer_match, _NoSampling())
    ev.start(0)
    policy = SimpleNamespace(name="A", spec=SimpleNamespace(sampling=SamplingSpec(max_new_tokens=5)),
                             device=torch.device("cpu"))
    ev.add(policy, [Problem(1, "2+3=", "5", "add"), Problem(2, "7-4=", "3", "sub")])
    out = ev.finish()["A"]
    assert out["pass@1"] == out["pass@4"] == out["maj@4"] == out["greedy"] == 0.5
    assert calls == [2]  # decoded once, reused for the greedy metric


def test_negative_eval_temperature_names_the_setting():
    with pytest.raises(ValueError, match=r"evaluation.temperature must be >= 0 \(got -0.5\); 0 decodes greedily"):
        EvalConfig(temperature=-0.5)


# ------------------------------------------------------------------------------------- 6. regime configuration
def test_regimes_are_typed_per_receiver_with_one_success_threshold():
    """model.regime and a policy's own regime are Regime objects (class_path/init_args in a config); every
    receiver gets its own instance; success_threshold comes from algorithm only."""
    from mutual_rl.regimes import GRAFT, SGT
    from mutual_rl.update.config import GRPOConfig

    specs = pair()
    specs[1].regime = GRAFT(delta=0.5)
    m = MutualRLModule(specs, regime=SGT(coef=0.3), algorithm=GRPOConfig(success_threshold=0.5))
    a, b = m.regimes["gpt2"], m.regimes["llama"]
    assert isinstance(a, SGT) and a.coef == 0.3 and isinstance(b, GRAFT) and b.delta == 0.5
    assert a.success_threshold == b.success_threshold == 0.5
    m2 = MutualRLModule(pair(), regime="hacpo")
    assert m2.regimes["gpt2"] is not m2.regimes["llama"]  # regimes keep state: one instance per receiver


@pytest.mark.slow
def test_removed_regime_args_key_is_a_parse_error_naming_it(tmp_path, capsys):
    cfg = tmp_path / "old.yaml"
    cfg.write_text("model:\n  policies: [{name: a, model: tiny:gpt2-bpe}, {name: b, model: tiny:llama-char}]\n"
                   "  regime: sgt\n  regime_args: {coef: 0.3}\n")
    with pytest.raises(SystemExit) as e:
        main(["fit", "--config", str(cfg), "--print_config"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "regime_args" in err
    one_glance(err, f"config {cfg}: model.regime_args is not a setting", "model.regime",
               head="mutual-rl: configuration error: ")


@pytest.mark.slow
@pytest.mark.parametrize("own", [False, True])
def test_sharing_regime_with_a_single_policy_is_an_error(tmp_path, own):
    s = spec("g", "tiny:gpt2-bpe")
    if own:
        s.regime = "xgrpo"
    m = MutualRLModule([s], regime="none" if own else "sgt", reward="test_parity")
    where, name = ("model.policies[0].regime", "xgrpo") if own else ("model.regime", "sgt")
    w = re.escape(where)
    with pytest.raises(ValueError, match=rf"{w} is '{name}', a sharing regime, but model.policies has the "
                                         rf"single policy 'g'.*set {w}: none"):
        trainer(tmp_path, max_steps=1).fit(m, datamodule=datamodule())


def test_sharing_regime_with_a_single_policy_and_a_replayed_peer_is_allowed(tmp_path):
    m = MutualRLModule([spec("g", "tiny:gpt2-bpe")], regime="sgt", reward="test_parity")
    (tmp_path / "rec").mkdir()
    ex = ExperienceExchange(replay_dir=str(tmp_path / "rec"), replay_policies=["peer"])
    m.trainer = trainer(tmp_path, max_steps=2, callbacks=[ex])
    m.setup("fit")  # no error: the replayed peer is the one to learn from
    m.trainer = trainer(tmp_path, max_steps=2)
    with pytest.raises(ValueError, match="a sharing regime"):  # the same without it
        m.setup("fit")


# ------------------------------------------------------------------- 8. the module's reward and prompt settings
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"reward_errors": "ignore"}, r"model.reward_errors must be one of raise, skip \(got 'ignore'\)"),
        ({"reward_timeout_s": -1}, r"model.reward_timeout_s must be a finite number of seconds > 0 \(got -1\)"),
        ({"prompt_overflow": "cut"}, r"model.prompt_overflow must be one of error, truncate \(got 'cut'\)"),
    ],
)
def test_settings_are_checked_when_the_module_is_built(kw, message):
    with pytest.raises(ValueError, match=message):
        MutualRLModule([_spec()], **kw)


class _CountSteps(Callback):
    def __init__(self):
        self.steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps += 1


@pytest.mark.parametrize("which", ["export_dir", "default_root_dir"])
def test_an_unwritable_output_folder_is_an_error_before_any_step(tmp_path, which):
    """A folder that cannot be created (its parent is a file): the export used to fail after all of training."""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    bad = blocker / "out"
    counter = _CountSteps()
    kw = {"export_dir": str(bad)} if which == "export_dir" else {}
    tr = trainer(tmp_path if which == "export_dir" else bad, max_steps=1, callbacks=[counter],
                 **({} if which == "export_dir" else {"enable_checkpointing": True}))
    what = "the export folder (model.export_dir)" if which == "export_dir" else "the log folder"
    with pytest.raises(OSError, match=re.escape(what) + r" '" + re.escape(str(bad)) + r".*' is not writable \(Not a "
                       r"directory\)"):
        tr.fit(MutualRLModule([spec("g", "tiny:gpt2-bpe")], reward="test_parity", log_samples_every_n_steps=0, **kw),
               datamodule=datamodule())
    assert counter.steps == 0
