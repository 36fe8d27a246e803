"""Log-probs (and entropies) of target tokens straight from hidden states, in chunks of rows: the full
``[tokens, vocabulary]`` float32 logits are never built, in the forward or in the backward.

For one token with hidden state ``h``, output embedding ``W`` (``[V, H]``, bias ``b``) and temperature ``τ``::

    z = (h Wᵀ + b) / τ             (float32)
    logp(y) = z_y - logsumexp(z)
    entropy = logsumexp(z) - Σ_v softmax(z)_v z_v           (no gradient)
    ∂logp(y)/∂z = onehot(y) - softmax(z)

The backward recomputes each chunk's logits instead of keeping them, so the peak extra memory is one chunk of
``max_chunk_elements`` float32 logits (64 MiB at the default 2^24) plus the hidden states, however long the
responses and however large the vocabulary. On a 151k vocabulary a 128 x 32-token batch has 620 M logits
(2.5 GB in float32, more with the softmax and its gradient); here it is one chunk at a time.
Values and gradients equal the plain ``log_softmax`` of full logits up to float rounding (tested).
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_ELEMENTS = 1 << 24  # float32 logits per chunk (64 MiB)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float) -> torch.Tensor:
    logits = h @ weight.t() if bias is None else torch.addmm(bias, h, weight.t())  # the model's dtype, as its head
    return logits.float() / temperature


class _ChunkedTokenLogp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk, with_entropy):
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk):
            z = _chunk_logits(hidden[s:s + chunk], weight, bias, temperature)
            lse = torch.logsumexp(z, dim=-1)
            logp[s:s + chunk] = z.gather(-1, targets[s:s + chunk].unsqueeze(-1)).squeeze(-1) - lse
            if with_entropy:
                entropy[s:s + chunk] = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, targets = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            h, g = hidden[s:s + ctx.chunk], grad_logp[s:s + ctx.chunk].float()
            z = _chunk_logits(h, weight, bias, ctx.temperature)
            dz = torch.softmax(z, dim=-1).mul_(-g.unsqueeze(-1))  # d logp / d z = onehot - softmax
            dz.scatter_add_(-1, targets[s:s + ctx.chunk].unsqueeze(-1), g.unsqueeze(-1))
            dz.div_(ctx.temperature)
            if need_h:
                grad_h[s:s + ctx.chunk] = (dz.to(weight.dtype) @ weight).to(hidden.dtype)
            if need_w:
                grad_w += dz.t() @ h.float()
            if need_b:
                grad_b += dz.sum(0)
        return (grad_h, grad_w.to(weight.dtype) if need_w else None, grad_b.to(bias.dtype) if need_b else None,
                None, None, None, None)


def token_logp_from_hidden(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, temperature: float,
    *, with_entropy: bool = False, max_chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[...]`` of ``targets`` ``[...]`` under ``softmax((hidden Wᵀ + b) / temperature)``, and the
    entropies (no gradient) when ``with_entropy``; ``hidden`` is ``[..., H]``. Chunks of
    ``max_chunk_elements // V`` rows (at least one; default :data:`DEFAULT_CHUNK_ELEMENTS`)."""
    if max_chunk_elements is None:
        max_chunk_elements = DEFAULT_CHUNK_ELEMENTS
    if max_chunk_elements < 1:
        raise ValueError(f"max_chunk_elements must be >= 1 (got {max_chunk_elements})")
    shape = targets.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    chunk = max(1, max_chunk_elements // weight.shape[0])
    logp, entropy = _ChunkedTokenLogp.apply(flat_h, weight, bias, targets.reshape(-1), float(temperature), chunk,
                                            with_entropy)
    return logp.view(shape), (entropy.view(shape) if with_entropy else None)
