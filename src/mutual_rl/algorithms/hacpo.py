"""HACPO's math as pure tensor functions (docs/methods.md §5.6; from the public HACPO code, arXiv 2603.02604).

``capability_ratio`` and ``lower_bound`` are scalars; ``hacpo_advantages`` is one pooled group's advantages;
``hacpo_sequence_terms`` the per-sequence surrogate; ``hacpo_sequence_loss`` the micro-batch loss
``HACPOObjective`` computes (sequence-level ratios, the capability-weighted peer term, KL on own rows by
default). The regime (``regimes/hacpo.py``) builds the batch; the objective (``update/objectives.py``) adapts it
to these.
"""

from __future__ import annotations

import torch

from mutual_rl.algorithms.kl import kl_penalty

__all__ = ["capability_ratio", "hacpo_advantages", "hacpo_sequence_loss", "hacpo_sequence_terms", "lower_bound"]


def capability_ratio(p_receiver: float, p_source: float, floor: float = 1e-8, lo: float = 0.1,
                     hi: float = 10.0) -> float:
    """``clip(max(P_R, floor) / max(P_S, floor), lo, hi)``."""
    return min(max(max(p_receiver, floor) / max(p_source, floor), lo), hi)


def lower_bound(m: int, start: float = 0.8, slope: float = 0.025) -> float:
    """``L_m = min(1, start + slope · m)``."""
    return min(1.0, start + slope * m)


def hacpo_advantages(rewards: torch.Tensor, ratio: torch.Tensor, is_own: torch.Tensor,
                     eps: float = 1e-6) -> torch.Tensor:
    """HACPO advantages ``[n]`` of one pooled group.

    rewards ``[n]``; ratio ``[n]`` = clipped ``P_R / P_src(j)`` (1 on own rows); is_own ``[n]`` bool.
    ``b = mean(r · ratio)`` (plain mean if all rewards are identical; own mean if ``b > 1``);
    ``Â = (r − b) / (std(r) + eps)``, ``std`` unbiased (0 for a single response).
    """
    r = rewards.double()
    if bool((r == r[0]).all()):
        b = r.mean()
    else:
        b = (r * ratio.double()).mean()
        if b > 1:
            b = r[is_own].mean()
    std = r.std() if r.numel() > 1 else torch.zeros((), dtype=torch.float64)
    return ((r - b) / (std + eps)).float()


def hacpo_sequence_terms(
    mean_logp: torch.Tensor, src_mean_logp: torch.Tensor, advantages: torch.Tensor, is_peer: torch.Tensor,
    cap_ratio: torch.Tensor, lower: float, alpha: float, self_clip_low: float, self_clip_high: float,
    log_ratio_clamp: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence surrogate terms (to maximise) and ratios ``s``; all args ``[B]`` (``mean_logp`` carries grad).

    Self: ``min(s Â, clip(s, 1 − self_clip_low, 1 + self_clip_high) Â)``; peer:
    ``clip(s, lower, 1) · sg(clip(s, lower, 1))^alpha · Â / cap_ratio``; ``s = exp(clamp(ℓ̄_R − ℓ̄_src, ±c))``.
    """
    s = torch.exp((mean_logp - src_mean_logp).clamp(-log_ratio_clamp, log_ratio_clamp))
    adv = advantages.to(s.dtype)
    self_term = torch.minimum(s * adv, s.clamp(1.0 - self_clip_low, 1.0 + self_clip_high) * adv)
    sc = s.clamp(lower, 1.0)
    peer_term = sc * sc.detach().pow(alpha) * adv / cap_ratio.to(s.dtype)
    return torch.where(is_peer, peer_term, self_term), s


def hacpo_sequence_loss(
    logp: torch.Tensor, mask: torch.Tensor, old_logp: torch.Tensor, src_mean_logp: torch.Tensor,
    advantages: torch.Tensor, is_peer: torch.Tensor, cap_ratio: torch.Tensor, *, lower: float,
    num_seqs: float | int | torch.Tensor | None = None, alpha: float, self_clip_low: float, self_clip_high: float,
    log_ratio_clamp: float, ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0, kl_kind: str = "k3",
    kl_peer_rows: bool,
    present: dict[str, bool] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """HACPO loss of a micro-batch and its metrics.

    ``logp``, ``mask``, ``old_logp``, ``ref_logp``: ``[B, T]``; ``src_mean_logp``, ``advantages``, ``is_peer``,
    ``cap_ratio``: ``[B]``. Per sequence ``ℓ̄_R`` = mean token log-prob under the current policy; the source mean
    is ``R``'s old mean (own rows) or ``src_mean_logp`` (peer rows). ``loss = −Σ_j term_j / num_seqs`` with the
    *mini-batch's* ``num_seqs`` (micro-batch invariant; default: this call's sequences with tokens), plus
    ``kl_coef · Σ_j tokenmean_t(kl_t) / num_seqs`` over own rows (every row with ``kl_peer_rows``).
    ``present``: whether own (``self``) and peer rows with tokens are in the micro-batch, known on the host (the
    ``self/…`` and ``peer/…`` metrics exist only then); ``None``: read from ``is_peer`` and ``mask``. HACPO's
    parameters have no defaults here: they live in one place, the regime (``regimes/hacpo.py``).
    """
    m = mask.to(logp.dtype)
    n_tok = m.sum(-1)
    den = n_tok.clamp(min=1.0)
    mean_logp = (logp * m).sum(-1) / den
    old_mean = (old_logp.to(logp.dtype) * m).sum(-1) / den
    is_peer = is_peer.to(logp.device)
    src = torch.where(is_peer, src_mean_logp.to(logp.dtype), old_mean)
    terms, s = hacpo_sequence_terms(mean_logp, src, advantages, is_peer, cap_ratio, lower, alpha,
                                    self_clip_low, self_clip_high, log_ratio_clamp)
    has = n_tok > 0
    n = float(num_seqs) if num_seqs is not None else float(has.sum())
    n = max(n, 1.0)
    pg = -(terms * has).sum() / n
    loss = pg
    metrics: dict[str, torch.Tensor] = {}
    if ref_logp is not None:
        kl_seq = (kl_penalty(logp, ref_logp, kl_kind) * m).sum(-1) / den
        kl_rows = has if kl_peer_rows else has & ~is_peer
        if kl_coef:
            loss = loss + kl_coef * (kl_seq * kl_rows).sum() / n
        w = n_tok * kl_rows
        metrics["kl"] = ((kl_seq * w).sum() / w.sum().clamp(min=1.0)).detach()
    with torch.no_grad():
        sd = s.detach()

        def tw(x, rows):  # token-weighted mean over the given sequences
            w = n_tok * rows
            return (x.to(w.dtype) * w).sum() / w.sum().clamp(min=1.0)

        every = torch.ones_like(is_peer)
        metrics["pg_loss"] = pg.detach()
        metrics["L_m"] = torch.tensor(lower, device=logp.device)
        metrics["seq_ratio_mean"] = tw(sd, every)
        for tag, rows in (("self", ~is_peer), ("peer", is_peer)):
            if not (present[tag] if present is not None else bool((rows & has).any())):
                continue
            metrics[f"{tag}/num_tokens"] = (n_tok * rows).sum()
            metrics[f"{tag}/seq_ratio_mean"] = tw(sd, rows)
            if tag == "self":
                clipped = (sd < 1 - self_clip_low) | (sd > 1 + self_clip_high)
                metrics["self/clip_frac"] = tw(clipped, rows)
            else:
                metrics["peer/clip_frac_low"] = tw(sd < lower, rows)
                metrics["peer/clip_frac_high"] = tw(sd > 1.0, rows)
    return loss, metrics
