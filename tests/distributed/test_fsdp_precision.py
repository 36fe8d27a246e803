"""FSDP precision and the chunked output head under FSDP, on two CPU ranks (gloo): see fsdp_precision.py.

* ``mixed_precision: bf16`` keeps buffers and the gradient reduction in float32: the rotary ``inv_freq`` (base 1e6,
  head dim 128) the sharded forward uses is float32, and the sharded bf16 model's log-probs of a 3,000-token
  sequence equal the unsharded bf16-mixed model's within bf16 noise (the gap between bf16-mixed and float32), where
  the old setting (bf16 buffers) is an order of magnitude further off, most at late positions.
* The KL reference, sharded by ``shard_reference`` and held in bf16, computes exactly the policy's step-0 log-probs,
  at a quarter of the unsharded float32 copy's bytes per rank on two ranks.
* The chunked head runs under FSDP: a 151,936-token vocabulary policy's update on two ranks peaks at most half the
  resident memory of the full-logits update, with the same loss and gradient norm.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.distributed.test_fsdp_cpu import HERE, _free_port, _run

pytestmark = pytest.mark.slow  # two torchrun processes


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_precision") / "r.json"
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port()),
          str(HERE / "fsdp_precision.py"), str(out)], timeout=480, MALLOC_MMAP_THRESHOLD_="65536")
    return json.loads(out.read_text())


def test_bf16_fsdp_keeps_float32_buffers_and_reduction(result):
    r = result["precision"]
    assert r["head_dim"] == 128 and r["inv_freq_min"] == pytest.approx(1e6 ** (-126 / 128), rel=1e-5)  # base 1e6
    new, old, noise = r["fsdp_bf16"], r["fsdp_bf16_buffers"], r["mixed_vs_fp32"]
    assert new["inv_freq_dtype"] == "torch.float32" and new["reduce_dtype"] == "torch.float32"
    assert old["inv_freq_dtype"] == "torch.bfloat16"  # the control really has bf16 rotary frequencies
    # measured: new 0.031 nats mean (0.033 past position 2000), bf16 noise 0.024 / 0.026, old 0.47 / 0.69
    assert new["mean_vs_mixed"] < 2 * noise["mean"]
    assert new["tail_mean_vs_mixed"] < 2 * noise["tail_mean"]
    assert old["tail_mean_vs_mixed"] > 10 * new["tail_mean_vs_mixed"]
    assert old["tail_mean_vs_mixed"] > 1.5 * old["head_mean_vs_mixed"]  # the error grows with the position


def test_chunked_head_under_fsdp_halves_the_peak_with_the_same_loss(result):
    for rank in result["head"]["per_rank"]:
        chunked, full = rank["chunked"], rank["full"]
        # measured: 0.35 GB vs 1.26 GB per rank (4 rows x 108 tokens, 151,936-token vocabulary)
        assert chunked["peak_bytes"] <= 0.5 * full["peak_bytes"], rank
        assert chunked["loss"] == pytest.approx(full["loss"], rel=1e-5, abs=1e-7)
        assert abs(full["loss"]) > 1e-3  # a real loss, not a zero one
        assert chunked["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-5)
        assert full["grad_norm"] > 1e-3


def test_reference_is_sharded_in_the_compute_dtype(result):
    r = result["precision"]["reference"]
    assert r["dtypes"] == ["torch.bfloat16"] and not r["requires_grad"]
    # FSDP pads each flat parameter to a multiple of the world size: a few elements over a quarter
    assert r["shard_bytes"] == pytest.approx(r["full_fp32_bytes"] / (2 * r["world"]), rel=1e-3)
    assert r["max_diff"] == 0.0  # the same bf16 rounding of the same weights as the policy's gathered parameters
