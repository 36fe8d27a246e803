"""The objective records (``update/objectives.py``) against the keyword functions they replaced (issue 36 item 3):
the same loss, gradient and statistics, to exact equality, on random micro-batches, for every objective, under
every aggregation, with and without KL, dual clip, given or missing normalisers. The reference is the old code,
copied below unchanged (only its registry decorators dropped)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mutual_rl.algorithms import kl_penalty, masked_mean, policy_loss
from mutual_rl.algorithms.ftis import ftis_loss
from mutual_rl.algorithms.hacpo import hacpo_sequence_loss, lower_bound
from mutual_rl.algorithms.importance import truncated_is_loss
from mutual_rl.stats import ObjectiveStats
from mutual_rl.types import PolicyBatch
from mutual_rl.update.config import GRPOConfig
from mutual_rl.update.objectives import DAPO, FTISObjective, HACPOObjective, Norms, PRPTruncatedIS, resolve


# --------------------------------------------------------------------------------- the old functions, verbatim
def dapo_terms(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs,
               max_len, ref_logp, with_kl: bool = True):
    """``policy_loss`` on a micro-batch (``with_kl=False``: no KL term, for metrics computed without the
    reference)."""
    return policy_loss(
        logp, sub.old_logp, sub.advantages, sub.response_mask, clip_low=clip_low, clip_high=clip_high, agg=agg,
        weights=sub.weights, dual_clip=dual_clip, max_len=max_len, token_count=token_count, num_seqs=num_seqs,
        ref_logp=ref_logp if with_kl else None, kl_coef=kl_coef if with_kl else 0.0, kl_kind=kl_kind,
    )


def split_metrics(logp, sub, max_len, **loss) -> dict[str, torch.Tensor]:
    """Clip fractions, ratio and approx. KL of self and peer tokens separately (``self/...``, ``peer/...``)."""
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for tag, rows in (("self", ~sub.is_peer), ("peer", sub.is_peer)):
            if rows.any():
                part = sub.select(rows.nonzero().squeeze(-1))
                _, m = dapo_terms(logp.detach()[rows], part, **loss, token_count=None, num_seqs=None,
                                  max_len=max_len, ref_logp=None, with_kl=False)
                for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl"):
                    out[f"{tag}/{k}"] = m[k]
                out[f"{tag}/num_tokens"] = m["num_tokens"]
    return out


def split_own_peer(sub, token_count, num_seqs):
    """``(token_count, num_seqs, own_rows, peer_rows)`` of a micro-batch (peer rows: ``sub.is_peer``); missing
    normalisers become this call's own counts over all its rows."""
    mask = sub.response_mask
    if token_count is None:
        token_count = mask.sum()
    if num_seqs is None:
        num_seqs = int((mask.sum(-1) > 0).sum())
    peer = sub.is_peer
    return token_count, num_seqs, (~peer).nonzero().squeeze(-1), peer.nonzero().squeeze(-1)


def dapo(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs, max_len,
         ref_logp=None, update_index: int = 0):
    """DAPO token-level clipped surrogate (docs/methods.md §1) with per-sequence weights; self/peer metrics split.

    The KL penalty (``kl_coef``) covers every row of the batch, peer rows included: they are trained as the
    receiver's tokens, and ``ref_logp`` is the reference on those tokens."""
    loss_kw = dict(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, agg=agg, kl_coef=kl_coef,
                   kl_kind=kl_kind)
    loss, metrics = dapo_terms(logp, sub, **loss_kw, token_count=token_count, num_seqs=num_seqs, max_len=max_len,
                               ref_logp=ref_logp)
    if sub.is_peer.any():
        metrics.update(split_metrics(logp, sub, max_len, **loss_kw))
    else:  # every row is own: ``self/approx_kl`` (logged by every objective, comparable across regimes) is approx_kl
        metrics["self/approx_kl"], metrics["self/num_tokens"] = metrics["approx_kl"], metrics["num_tokens"]
    return loss, ObjectiveStats.from_algorithm(metrics)


def prp_tis(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs, max_len,
            ref_logp=None, update_index: int = 0, is_cap: float = 2.0):
    """PRP ``objective: tis`` (docs/methods.md §5.2): DAPO on own rows + truncated IS
    (:func:`~mutual_rl.algorithms.importance.truncated_is_loss`) on peer rows.

    Peer rows (``sub.is_peer``) use their ``old_logp`` as behaviour log-probs: the aligned peer trace
    (``denominator: peer_aligned``) or ``π_R,old`` recomputed before the update (``learner_snapshot``);
    the two parts share the global normalisers, so the sum is micro-batch invariant.
    """
    token_count, num_seqs, own_rows, peer_rows = split_own_peer(sub, token_count, num_seqs)
    mask = sub.response_mask
    loss = logp.sum() * 0.0
    metrics: dict[str, torch.Tensor] = {}
    if len(own_rows):
        part = sub.select(own_rows)
        own_loss, m = dapo_terms(logp[own_rows], part, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
                                 agg=agg, kl_coef=kl_coef, kl_kind=kl_kind, token_count=token_count,
                                 num_seqs=num_seqs, max_len=max_len,
                                 ref_logp=ref_logp[own_rows] if ref_logp is not None else None)
        loss = loss + own_loss
        for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "num_tokens"):
            metrics[f"self/{k}"] = m[k]
    if len(peer_rows):
        part = sub.select(peer_rows)
        peer_loss, m = truncated_is_loss(
            logp[peer_rows], part.old_logp, part.advantages, part.response_mask, is_cap, agg,
            part.weights, max_len, token_count, num_seqs,
            ref_logp[peer_rows] if kl_coef else None, kl_coef, kl_kind,
        )
        loss = loss + peer_loss
        metrics.update(m)
    with torch.no_grad():
        k3 = kl_penalty(sub.old_logp, logp.detach(), "k3")
        metrics["approx_kl"] = masked_mean(k3, mask)  # all rows: peer tokens against their denominator
        for tag, rows in (("self", own_rows), ("peer", peer_rows)):  # own rows: against R's old policy
            if len(rows):
                metrics[f"{tag}/approx_kl"] = masked_mean(k3[rows], mask[rows])
        if ref_logp is not None:
            metrics["kl"] = masked_mean(kl_penalty(logp.detach(), ref_logp, kl_kind), mask)
        metrics["num_tokens"] = mask.sum()
    return loss, ObjectiveStats.from_algorithm(metrics)


def hacpo(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs, max_len,
          ref_logp=None, update_index: int = 0,
          lower: float | None = None, lower_start: float = 0.8, lower_slope: float = 0.025, lower_m0: int = 0,
          lower_per_update: int = 1, alpha: float = 1.0, self_clip_low: float = 3e-4, self_clip_high: float = 4e-4,
          log_ratio_clamp: float = 10.0, kl_peer_rows: bool = False):
    """HACPO's sequence-level objective (docs/methods.md §5.6,
    :func:`~mutual_rl.algorithms.hacpo.hacpo_sequence_loss`); needs the batch's ``source_mean_logp`` and ``cap_ratio``.
    ``num_seqs`` is the mini-batch's sequence count (micro-batch invariant). The DAPO clip bounds, ``agg``,
    ``token_count`` and ``max_len`` do not apply (HACPO clips sequence ratios with its own bounds and takes a
    sequence mean).

    The peer clip's lower bound is ``L_m = min(1, lower_start + lower_slope · m)`` with
    ``m = lower_m0 + lower_per_update · update_index``; ``lower`` given fixes ``L_m`` instead. The KL term covers
    own rows only unless ``kl_peer_rows``. Adds ``self/approx_kl`` (per-token k3 to ``R``'s old policy on own
    rows, as every objective logs it)."""
    if lower is None:
        lower = lower_bound(lower_m0 + lower_per_update * update_index, lower_start, lower_slope)
    loss, metrics = hacpo_sequence_loss(
        logp, sub.response_mask, sub.old_logp, sub.source_mean_logp, sub.advantages, sub.is_peer,
        sub.cap_ratio, lower=lower, num_seqs=num_seqs, alpha=alpha, self_clip_low=self_clip_low,
        self_clip_high=self_clip_high, log_ratio_clamp=log_ratio_clamp, ref_logp=ref_logp, kl_coef=kl_coef,
        kl_kind=kl_kind, kl_peer_rows=kl_peer_rows,
    )
    if "self/num_tokens" in metrics:  # own rows with tokens (their old_logp is R's behaviour policy)
        with torch.no_grad():
            own = sub.response_mask * (~sub.is_peer).to(sub.response_mask.device).unsqueeze(-1)
            metrics["self/approx_kl"] = masked_mean(kl_penalty(sub.old_logp, logp.detach(), "k3"), own)
    return loss, ObjectiveStats.from_algorithm(metrics)


def ftis(logp, sub, *, clip_low, clip_high, dual_clip, agg, kl_coef, kl_kind, token_count, num_seqs, max_len,
         ref_logp=None, update_index: int = 0, is_cap: float = 2.0):
    """F-TIS (docs/methods.md §5.7): DAPO on own rows + the truncated-IS-weighted clipped surrogate
    (:func:`~mutual_rl.algorithms.ftis.ftis_loss`) on peer rows.

    Peer rows (``sub.is_peer``): their ``old_logp`` is the receiver's ``π_R,old`` and ``sub.gen_logp``
    (``[b, T]``) the generator's trace; the weight is ``min(π_R,old / π_gen, is_cap)``.
    Both parts share the global normalisers (this call's own counts over *all* its rows when none are given), so
    the sum is micro-batch invariant. The KL penalty covers every row. ``approx_kl`` (all rows) and its parts
    ``self/approx_kl`` / ``peer/approx_kl`` are k3 to ``π_R,old``.
    """
    token_count, num_seqs, own_rows, peer_rows = split_own_peer(sub, token_count, num_seqs)
    mask = sub.response_mask
    loss = logp.sum() * 0.0
    metrics: dict[str, torch.Tensor] = {}
    clip = dict(clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, agg=agg, kl_coef=kl_coef,
                kl_kind=kl_kind)
    if len(own_rows):
        own_loss, m = dapo_terms(logp[own_rows], sub.select(own_rows), **clip, token_count=token_count,
                                 num_seqs=num_seqs, max_len=max_len,
                                 ref_logp=ref_logp[own_rows] if ref_logp is not None else None)
        loss = loss + own_loss
        for k in ("clip_frac_low", "clip_frac_high", "ratio_mean", "approx_kl", "num_tokens"):
            metrics[f"self/{k}"] = m[k]
    if len(peer_rows):
        part = sub.select(peer_rows)
        peer_loss, m = ftis_loss(
            logp[peer_rows], part.old_logp, part.gen_logp, part.advantages, part.response_mask,
            is_cap=is_cap, **clip, weights=part.weights, max_len=max_len, token_count=token_count,
            num_seqs=num_seqs, ref_logp=ref_logp[peer_rows] if ref_logp is not None else None,
        )
        loss = loss + peer_loss
        metrics.update(m)
    with torch.no_grad():
        metrics["approx_kl"] = masked_mean(kl_penalty(sub.old_logp, logp.detach(), "k3"), mask)
        if ref_logp is not None:
            metrics["kl"] = masked_mean(kl_penalty(logp.detach(), ref_logp, kl_kind), mask)
        metrics["num_tokens"] = mask.sum()
    return loss, ObjectiveStats.from_algorithm(metrics)


# ------------------------------------------------------------------------------------------------ comparison
def _scalars(cfg: GRPOConfig) -> dict:
    """The old ``GRPOConfig.loss_kwargs()``."""
    return {"clip_low": cfg.clip_low, "clip_high": cfg.clip_high, "dual_clip": cfg.dual_clip, "agg": cfg.agg,
            "kl_coef": cfg.kl_coef, "kl_kind": cfg.kl_kind}


def _batch(seed: int, is_peer: list[bool]) -> tuple[PolicyBatch, torch.Tensor, torch.Tensor]:
    """A random micro-batch with every optional input, its current log-probs and the reference's."""
    g = torch.Generator().manual_seed(seed)
    b, t = len(is_peer), 7
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).float()
    old = -torch.rand(b, t, generator=g) * 3 * mask
    logp = (old + 0.4 * torch.randn(b, t, generator=g)) * mask
    ref = (old + 0.3 * torch.randn(b, t, generator=g)) * mask
    batch = PolicyBatch(
        input_ids=torch.zeros(b, t + 2, dtype=torch.long), attention_mask=torch.ones(b, t + 2, dtype=torch.long),
        response_mask=mask, old_logp=old, advantages=torch.randn(b, generator=g),
        weights=torch.rand(b, generator=g) + 0.5, is_peer=torch.tensor(is_peer), prompt_ids=list(range(b)),
        gen_logp=(old + 0.5 * torch.randn(b, t, generator=g)) * mask,
        source_mean_logp=-torch.rand(b, generator=g) * 2, cap_ratio=torch.rand(b, generator=g) * 2 + 0.1,
    )
    return batch, logp, ref


def _same_stats(a: ObjectiveStats, b: ObjectiveStats) -> None:
    for part in ("rows", "own", "peer"):
        x, y = getattr(a, part), getattr(b, part)
        assert (x is None) == (y is None), part
        if x is None:
            continue
        for f in dataclasses.fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            assert type(u) is type(v), (part, f.name, u, v)
            if isinstance(u, torch.Tensor):
                assert u.dtype == v.dtype and torch.equal(u, v), (part, f.name, u, v)
            else:
                assert u == v, (part, f.name, u, v)


def _compare(old_fn, old_kw: dict, objective, cfg: GRPOConfig, seed: int, is_peer, given: bool, kl: bool,
             update_index: int = 0):
    batch, logp0, ref = _batch(seed, is_peer)
    mask = batch.response_mask
    token_count, num_seqs = (mask.sum(), int((mask.sum(-1) > 0).sum()) + 1) if given else (None, None)
    ref = ref if kl else None
    a = logp0.clone().requires_grad_(True)
    loss_a, stats_a = old_fn(a, batch, **_scalars(cfg), token_count=token_count, num_seqs=num_seqs, max_len=9,
                             ref_logp=ref, update_index=update_index, **old_kw)
    loss_a.backward()
    b = logp0.clone().requires_grad_(True)
    loss_b, stats_b = resolve(objective, cfg.dapo()).loss(b, batch, Norms(token_count, num_seqs, 9), ref,
                                                           update_index)
    loss_b.backward()
    assert loss_a.dtype == loss_b.dtype and torch.equal(loss_a.detach(), loss_b.detach())
    assert torch.equal(a.grad, b.grad)
    _same_stats(stats_a, stats_b)


CONFIGS = [
    GRPOConfig(),
    GRPOConfig(agg="seq-mean-token-mean", dual_clip=3.0, kl_coef=1e-3, kl_kind="k3"),
    GRPOConfig(agg="seq-mean-token-sum-norm", clip_low=0.1, clip_high=0.2, kl_coef=0.05, kl_kind="k1"),
    GRPOConfig(kl_coef=0.01, kl_kind="k2"),
]
PEERS = [[False] * 5, [False, True, False, True, True], [True] * 4]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "seq_mean_dual_k3", "sum_norm_k1", "k2"])
@pytest.mark.parametrize("is_peer", PEERS, ids=["own", "mixed", "peer"])
@pytest.mark.parametrize("given", [True, False], ids=["norms", "own_counts"])
@pytest.mark.parametrize("seed", [0, 1])
def test_dapo_prp_tis_ftis_bit_identical(cfg, is_peer, given, seed):
    kl = bool(cfg.kl_coef)
    _compare(dapo, {}, None, cfg, seed, is_peer, given, kl)
    _compare(dapo, {}, cfg.dapo(), cfg, seed, is_peer, given, kl)
    for cap in (2.0, 0.7):
        _compare(prp_tis, {"is_cap": cap}, PRPTruncatedIS(is_cap=cap), cfg, seed, is_peer, given, kl)
        _compare(ftis, {"is_cap": cap}, FTISObjective(is_cap=cap), cfg, seed, is_peer, given, kl)


@pytest.mark.parametrize("cfg", CONFIGS[:2] + CONFIGS[3:], ids=["default", "k3", "k2"])
@pytest.mark.parametrize("is_peer", PEERS, ids=["own", "mixed", "peer"])
@pytest.mark.parametrize("schedule", [(0, 1), (6, 0)], ids=["per_update", "per_step"])
@pytest.mark.parametrize("update_index", [0, 3])
@pytest.mark.parametrize("kl_peer_rows", [False, True])
def test_hacpo_bit_identical(cfg, is_peer, schedule, update_index, kl_peer_rows):
    m0, per_update = schedule
    kw = {"lower_start": 0.8, "lower_slope": 0.025, "lower_m0": m0, "lower_per_update": per_update, "alpha": 1.5,
          "self_clip_low": 3e-4, "self_clip_high": 4e-4, "log_ratio_clamp": 10.0, "kl_peer_rows": kl_peer_rows}
    for seed in (0, 1):
        for given in (True, False):
            _compare(hacpo, kw, HACPOObjective(**kw), cfg, seed, is_peer, given, bool(cfg.kl_coef), update_index)


def test_a_regime_objective_keeps_what_it_sets_and_takes_the_rest_from_the_algorithm():
    assert GRPOConfig(dual_clip=3.0, agg="seq-mean-token-mean").dapo() == DAPO(
        clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg="seq-mean-token-mean", kl_coef=0.0, kl_kind="k3")
    base, other = GRPOConfig(kl_coef=1e-3).dapo(), GRPOConfig(clip_low=0.1, kl_kind="k1").dapo()
    assert resolve(None, base) is base and resolve(other, base) is other
    assert resolve(PRPTruncatedIS(is_cap=2.0), base) == PRPTruncatedIS(is_cap=2.0, dapo=base)
    assert resolve(FTISObjective(is_cap=2.0, dapo=other), base).dapo is other
    kw = {"lower_start": 0.8, "lower_slope": 0.025, "lower_m0": 0, "lower_per_update": 1, "alpha": 1.0,
          "self_clip_low": 3e-4, "self_clip_high": 4e-4, "log_ratio_clamp": 10.0, "kl_peer_rows": False}
    hacpo_obj = resolve(HACPOObjective(**kw), base)
    assert (hacpo_obj.kl_coef, hacpo_obj.kl_kind) == (1e-3, "k3")
    assert resolve(HACPOObjective(**kw, kl_coef=0.0), base).kl_coef == 0.0
    batch, logp, _ = _batch(0, PEERS[1])
    with pytest.raises(ValueError, match="with_algorithm"):
        PRPTruncatedIS(is_cap=2.0).loss(logp, batch, Norms(None, None, 9))
