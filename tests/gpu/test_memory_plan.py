"""The memory plan before step 0 (mutual_rl/memory): its arithmetic by hand, the shipped configs/gpu/* on a
simulated 80 GB and 141 GB card (the device's properties monkeypatched: torch.cuda.mem_get_info and
get_device_properties), a pair that cannot fit, and the plan applied to a real module (token budgets, the engines'
gpu_memory_utilization and dtype)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from mutual_rl.memory.footprint import (
    count_parameters,
    dimensions,
    max_len_of,
    meta_model,
    settings_from_config,
)
from mutual_rl.memory.plan import GB, HEAD_CHUNK_BYTES, Footprint, MemoryPlanError, Settings, plan

ROOT = Path(__file__).resolve().parents[2]
CARDS = {"80GB": int(79.2 * 2**30), "141GB": int(139.8 * 2**30)}  # total_memory torch reports on an H100 80GB / an H200

# the architectures of configs/gpu (their config.json on the Hub; built on the meta device: nothing downloaded)
ARCH = {
    "Qwen/Qwen3-1.7B-Base": ("Qwen3Config", dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768)),
    "HuggingFaceTB/SmolLM3-3B-Base": ("SmolLM3Config", dict(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=65536)),
}


def _unit(**kw) -> Footprint:
    base = dict(name="a", params=10**9, trainable=10**9, layers=10, layer_params=8 * 10**7, hidden=1000,
                intermediate=3000, vocab=50000, kv_width=500, max_len=1000)
    return Footprint(**{**base, **kw})


def test_plan_arithmetic_by_hand():
    s = Settings(world=1, fsdp=False, master_bytes=4, compute_bytes=2, engine="vllm", engine_bytes=2)
    p = plan([_unit()], s, free=100e9, total=100e9)
    row = p.rows["a"]
    # params 4 B x 1e9, bf16 autocast copy 2 B x 1e9, grads 4 B, AdamW 2 x 4 B, no reference
    assert (row["params"], row["compute"], row["grads"], row["optimizer"], row["reference"]) == (4e9, 2e9, 4e9, 8e9, 0)
    # a_token = 10 layers x (2 x (8*1000 + 4*3000) + 8*1000) + 8*1000 (chunked head) = 488,000 bytes
    assert p.per_token["a"] == 488_000
    # usable = 100 - (1 + 5 % of 100) = 94 GB; engine floor = 2 B x 1e9 + (2*10*500*2 B) x 1000 tokens + 1 GB = 3.02 GB
    # one row of activations = 488,000 x 1000 + 3 x 4 x 2^24; rest = 94 - 18 - 3.02 - 0.689... = 72.2907 GB, half
    # each, but the engine's share stops at 256 more sequences' key/value cache (20,000 B x 1000 x 256 = 5.12 GB):
    # engine 8.14 GB, the activations get the rest, 72.2907 - 5.12 = 67.1707 GB more than one row
    assert p.usable == 94e9
    assert row["engine"] == pytest.approx(8.14e9) and p.utilization["a"] == pytest.approx(0.0814)
    assert p.token_budget["a"] == 138644  # (488,000 x 1000 + 67,170,673,408) // 488,000
    assert row["activations"] == 138644 * 488_000 + HEAD_CHUNK_BYTES
    assert p.need() <= p.usable < p.need() + 488_000 + 1  # auto hands out what is left, to the token


def test_sharding_checkpointing_reference_and_lora():
    s = Settings(world=4, fsdp=True, master_bytes=4, compute_bytes=2)
    f = _unit(reference=True, checkpointing=True, trainable=10**7)  # LoRA-like trainable share
    row = plan([f], s, free=100e9, total=100e9).rows["a"]
    assert row["params"] == 1e9 and row["grads"] == 1e7 and row["optimizer"] == 2e7  # / 4 ranks
    assert row["compute"] == 2 * (10**9 - 10 * 8 * 10**7 + 2 * 8 * 10**7)  # root unit + 2 gathered layers in bf16
    assert row["reference"] == 2 * 10**9 / 4  # sharded, in the compute dtype
    # checkpointing: 10 layer inputs (2 x 1000 B) + one layer recomputed (48,000) + head 8,000
    assert plan([f], s, free=100e9, total=100e9).per_token["a"] == 10 * 2000 + 48_000 + 8_000
    unsharded = plan([_unit(reference=True)], Settings(compute_bytes=2), free=100e9, total=100e9).rows["a"]
    assert unsharded["reference"] == 4e9  # an unsharded float32 copy


def _footprints(cfg: dict, checkpointing: bool) -> list[Footprint]:
    import transformers

    engine = cfg["model"]["rollout_engine"].get("init_args", {})
    out = []
    for p in cfg["model"]["policies"]:
        cls, kw = ARCH[p["model"]]
        config = getattr(transformers, cls)(**kw)
        counts = count_parameters(meta_model(config, p.get("lora")))
        out.append(Footprint(name=p["name"], **counts, **dimensions(config), max_len=max_len_of(p, engine),
                             checkpointing=checkpointing))
    return out


def _config(name: str) -> dict:
    return yaml.safe_load((ROOT / "configs" / "gpu" / name).read_text())


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize("name", ["graft_qwen3_smollm3_full.yaml", "graft_qwen3_smollm3_lora.yaml"])
def test_shipped_gpu_configs_fit_as_shipped(name, card, capsys):
    cfg = _config(name)
    s = settings_from_config(cfg)
    assert (s.world, s.fsdp, s.master_bytes, s.compute_bytes, s.engine, s.engine_bytes) == (8, True, 4, 2, "vllm", 2)
    assert s.utilization == {"qwen3": None, "smollm3": None} and s.token_budget is None  # auto, the shipped default
    fps = _footprints(cfg, cfg["trainer"]["strategy"]["init_args"]["activation_checkpointing"])
    lora = "lora" in name  # r 32 adapters on every linear layer: +35 M and +50 M parameters, the only trainable ones
    assert fps[0].params == pytest.approx(1.72e9 + lora * 35e6, rel=0.01)
    assert fps[1].params == pytest.approx(3.08e9 + lora * 50e6, rel=0.01)
    assert all((f.trainable < 0.03 * f.params) if lora else f.trainable == f.params for f in fps)
    total = CARDS[card]
    p = plan(fps, s, free=total - 0.5e9, total=total)
    print(f"\n{name} on a {card} card (8 GPUs)\n{p.table()}")
    assert len(p.table().splitlines()) == 2 + len(fps) + 1  # title, header, one line per policy, the card
    assert p.need() <= p.usable
    assert sum(p.utilization.values()) < 0.6 and all(u > 0.1 for u in p.utilization.values())
    assert all(p.token_budget[f.name] >= f.max_len for f in fps)  # at least one whole 4,096-token row


def test_one_card_full_pair_fits_141_not_80():
    cfg = _config("graft_qwen3_smollm3_full.yaml")
    s = settings_from_config(cfg, world=1)
    fps = _footprints(cfg, True)
    big = plan(fps, s, free=CARDS["141GB"] - 0.5e9, total=CARDS["141GB"])
    # float32 master + grads + AdamW of 4.8 B parameters: 16 B each = 77.3 GB before engines and activations
    trainer = sum(r[k] for r in big.rows.values() for k in ("params", "grads", "optimizer"))
    assert trainer == pytest.approx(16 * sum(f.params for f in fps))
    with pytest.raises(MemoryPlanError) as err:
        plan(fps, s, free=CARDS["80GB"] - 0.5e9, total=CARDS["80GB"])
    msg = str(err.value)
    print("\n" + msg)
    assert "the policies need 92.2 GB per card" in msg and "79.3 GB usable of 85.0" in msg
    assert "lora" in msg and "trainer.devices" in msg and "max_model_len" in msg


def test_explicit_engine_below_its_floor_is_refused():
    s = Settings(compute_bytes=2, engine="vllm", utilization={"a": 0.01})
    with pytest.raises(MemoryPlanError, match=r"gpu_memory_utilization of a \(0.010\) is below the engine's floor"):
        plan([_unit()], s, free=100e9, total=100e9)


def test_tiny_vllm_config_plan():
    from mutual_rl.model.policy import build_policy
    from mutual_rl.model.spec import PolicySpec, WarmStart

    cfg = _config("grpo_tiny_vllm.yaml")
    s = settings_from_config(cfg)
    assert (s.world, s.compute_bytes, s.engine_bytes, s.utilization) == (1, 4, 4, {"gpt2": None, "llama": None})
    fps = []
    for p in cfg["model"]["policies"]:
        policy = build_policy(PolicySpec(name=p["name"], model=p["model"], warmstart=WarmStart(steps=20)))
        fps.append(Footprint(name=p["name"], **count_parameters(policy.model), **dimensions(policy.model.config),
                             max_len=max_len_of(p, {})))
    for card, total in CARDS.items():
        p = plan(fps, s, free=total - 0.5e9, total=total)
        print(f"\ngrpo_tiny_vllm.yaml on a {card} card\n{p.table()}")
        assert all(r["params"] < 0.01 * GB for r in p.rows.values())


def _module(engine):
    from lightning.pytorch import Trainer

    from tests.module.helpers import module, pair

    m = module(pair())
    m.engine = engine
    m.trainer = Trainer(accelerator="cpu", precision="bf16-mixed", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False)
    m.configure_model()
    return m


def _simulate(monkeypatch, total: float, free: float) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free), int(total)))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=int(total)))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)


def test_plan_before_fit_sets_budgets_utilization_and_engine_dtype(monkeypatch, capsys):
    import mutual_rl.rollout.vllm as V
    from mutual_rl.memory.fit import plan_before_fit

    monkeypatch.setattr(V, "import_vllm", lambda: None)  # the engine object only; no engine is built here
    engine = V.VLLMRolloutEngine(per_policy={"llama": {"gpu_memory_utilization": 0.05}})
    m = _module(engine)
    _simulate(monkeypatch, CARDS["80GB"], CARDS["80GB"] - 1e9)
    p = plan_before_fit(m, device="cuda")
    assert "memory plan" in capsys.readouterr().out
    for name, policy in m.policies.items():
        assert policy.autocast_dtype == torch.bfloat16 and policy.token_budget == p.token_budget[name] > 1000
        assert engine.resolved_args(policy)["dtype"] == "bfloat16"  # bf16-mixed: a bf16 engine by default
    # the tiny gpt2 engine: its floor plus 256 sequences' key/value cache, the rest of the card to the activations
    assert engine.resolved_args(m.policies["gpt2"])["gpu_memory_utilization"] == p.utilization["gpt2"] > 0.01
    assert 0 <= p.usable - p.need() < max(p.per_token.values())  # all of it, to the token
    assert engine.resolved_args(m.policies["llama"])["gpu_memory_utilization"] == 0.05  # explicit: kept
    assert p.rows["llama"]["engine"] == 0.05 * CARDS["80GB"]
    _simulate(monkeypatch, CARDS["80GB"], 2e9)  # a card another process has filled
    with pytest.raises(MemoryPlanError, match="the card has"):
        plan_before_fit(_module(engine), device="cuda")


def test_no_plan_off_cuda():
    from mutual_rl.memory.fit import plan_before_fit
    from mutual_rl.rollout.hf import HFRolloutEngine

    m = _module(HFRolloutEngine())
    assert plan_before_fit(m) is None
    assert all(p.autocast_dtype == torch.bfloat16 and p.token_budget is None for p in m.policies.values())
