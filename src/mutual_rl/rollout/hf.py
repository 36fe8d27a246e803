"""Rollouts with the training model itself: the CPU engine and the GPU reference.

Two samplers draw the same tokens (``HFRolloutEngine(sampler=...)``): Hugging Face ``generate``, described here,
and the static-cache decode loop of ``rollout/static_decode.py``, which does what ``generate``'s sampling loop does
with this configuration -- same processors in the same order, same draws from the global generator -- over
preallocated key/value buffers, dropping finished rows from the batch, without ``generate``'s per-step machinery
(the same ids for the same generator state and the same records, tested); it is the default on the CPU.

Prompts are rendered in the policy's own format and left-padded (batched generation needs it). Sampling is
exactly as configured and nothing else: ``generate`` gets a fresh ``GenerationConfig`` holding only what the
``SamplingSpec`` and the tokenizer say (``do_sample``, ``temperature``, ``top_p``, ``top_k``, ``max_new_tokens``,
EOS / pad / BOS ids), and for the call the model's own ``generation_config`` is replaced by that
same config, because ``generate`` fills every field the passed config leaves unset from the model's (a checkpoint's
``generation_config.json``: ``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``, ``top_k``,
``typical_p``, ``bad_words_ids``, ``suppress_tokens``, ...), and each such field adds a logits processor that the
trainer's log-probs do not have. The remaining unset fields take transformers' neutral global defaults, except
``top_k``, which is passed explicitly (0 = off; transformers would otherwise apply 50). The log-prob of each sampled
token is read from the processed scores (temperature, top-k and top-p applied), i.e. the distribution the token was
drawn from, one step at a time (:class:`SampledLogProbs`), so the scores of the whole response are never kept.

Two shortcuts, for both samplers (the same tokens and log-probs up to float rounding, tested; each can be turned
off on the engine): rows with the same prompt prefill it once (:func:`shared_prompt_cache`; ``share_prefill``), and
on the CPU the one-token decoding steps attend with two ``bmm`` instead of ``sdpa``'s kernel
(``rollout/decode_attention.py``; ``decode_attention``).

Under FSDP with several processes (each rank generating for its own prompts) sampling always uses ``generate``
(the static loop does not run lockstep), and every rank runs the same number of ``generate`` calls -- missing ones
as one-prompt dummies whose output is discarded -- with ``synced_gpus=True``, so ranks whose sequences finish early
keep taking part in the others' forwards (``mutual_rl.distributed.padded``).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Literal

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from mutual_rl.distributed import in_lockstep, padded
from mutual_rl.interfaces import RolloutEngine
from mutual_rl.model.lm_head import base_model
from mutual_rl.model.spec import SamplingSpec
from mutual_rl.rollout.decode_attention import decode_attention
from mutual_rl.rollout.static_decode import sampling_warpers, static_sample, supports_static_sample
from mutual_rl.strategies import generation_params
from mutual_rl.thl.offsets import offsets_by_decoding
from mutual_rl.types import Problem, Rollout
from mutual_rl.warnings_filters import finished_row_pad_alarm_silenced


class NonFiniteLogitsError(FloatingPointError):
    """A policy's logits were inf/NaN while sampling although its weights are finite (they grew too large)."""


def nonfinite_logits_message(policy) -> str:
    """The error for :class:`NonFiniteLogitsError`: the policy, its learning rate and what to do."""
    return (f"policy {policy.name!r}: its logits are inf/NaN while sampling, although every weight is finite: the "
            f"weights have grown so large that the forward pass overflows (version {policy.version}, i.e. after "
            f"{policy.version} optimizer updates). The usual cause is a learning rate far too high: "
            f"optimizer.lr = {policy.spec.optimizer.lr:g} for this policy; lower it (and check optimizer.grad_clip), "
            "then restart from the last good checkpoint.")


SAMPLERS = ("auto", "static", "generate")


class HFRolloutEngine(RolloutEngine):
    """Samples with the training model itself; ``chunk_size`` bounds how many sequences are sampled at once.

    ``sampler`` chooses the decoding loop:

    - ``"static"``: the static-cache loop of ``rollout/static_decode.py`` (preallocated key/value buffers, none of
      ``generate``'s per-step machinery; the same tokens as ``generate`` for the same generator state, tested);
    - ``"generate"``: Hugging Face ``generate`` (module docstring);
    - ``"auto"`` (default): ``"static"`` on the CPU, where it was measured faster (``scripts/bench_engines.py
      --hf-samplers``), ``"generate"`` on accelerators, where it was not measured.

    Whatever is chosen, ``generate`` is used where the static loop cannot run: under FSDP lockstep (ranks must keep
    running forwards until the busiest one finishes: ``generate``'s ``synced_gpus``), for models whose cache is
    not plain key/value layers or whose ``forward`` takes no ``position_ids`` / ``logits_to_keep``
    (``static_decode.supports_static_sample``), and for the reference path that keeps ``generate``'s scores.
    """

    def __init__(self, chunk_size: int = 512, sampler: Literal["auto", "static", "generate"] = "auto"):
        if sampler not in SAMPLERS:
            raise ValueError(f"HFRolloutEngine sampler {sampler!r} is not one of {', '.join(SAMPLERS)}; use 'auto' "
                             "(the static-cache loop on the CPU), 'static' or 'generate' (Hugging Face generate).")
        self.chunk_size = chunk_size
        self.sampler = sampler
        # benchmarks only (scripts/bench_step.py): EOS suppressed for this many tokens; the trainer's log-probs do
        # not model it, so it is no training option
        self.benchmark_min_new_tokens = 0
        self._keep_scores = False  # True: the reference path (generate's output_scores, [B, T, V] kept; tests)
        # CPU decoding steps attend with two bmm's instead of sdpa's kernel (rollout/decode_attention.py); False:
        # transformers' sdpa throughout (the reference in tests and benchmarks)
        self.decode_attention = True
        # rows with the same prompt (a group's n samples) share one prefill of it (shared_prompt_cache); False: every
        # row prefills its own prompt inside generate (the reference in tests)
        self.share_prefill = True

    def place(self, name: str, placement: str | int) -> None:
        """Only ``"colocate"``: this engine generates with the training model itself, on the trainer's device."""
        if placement != "colocate":
            raise ValueError(f"placement of policy {name!r} is device {placement!r}, but rollout_engine 'hf' "
                             "generates with the training weights on the trainer's device; use placement "
                             "'colocate' (the vLLM engine runs in the training process too, bound to its device).")

    @torch.no_grad()
    def generate(
        self, policy, problems: Sequence[Problem], sampling: SamplingSpec, *, step: int, group_id_base: int = 0
    ) -> list[list[Rollout]]:
        prompts = [policy.render_prompt(p.problem) for p in problems]
        prompt_ids = [policy.encode_prompt(text) for text in prompts]
        flat = [(i, j) for i in range(len(problems)) for j in range(sampling.n)]
        out: list[list[Rollout]] = [[] for _ in problems]
        was_training = policy.model.training
        policy.model.eval()
        synced = in_lockstep(policy)
        # as many generate calls as the busiest rank, agreed before the first (each is collective)
        starts: list[int | None] = padded(policy, list(range(0, len(flat), self.chunk_size)))
        try:
            for start in starts:
                if start is None:  # lockstep dummy, output discarded
                    self._sample(policy, [policy.dummy_prompt_ids()], sampling, synced)
                    continue
                chunk = flat[start : start + self.chunk_size]
                ids, logps = self._sample(policy, [prompt_ids[i] for i, _ in chunk], sampling, synced)
                for (i, _), row_ids, row_logp in zip(chunk, ids, logps):
                    out[i].append(
                        self._record(policy, problems[i], prompts[i], prompt_ids[i], row_ids, row_logp, step,
                                     group_id_base + i)
                    )
        finally:
            policy.model.train(was_training)
        return out

    def _sample(self, policy, prompt_ids: list[list[int]], s: SamplingSpec, synced: bool = False):
        tok = policy.tokenizer
        width = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), width), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for r, p in enumerate(prompt_ids):  # left padding
            ids[r, width - len(p):] = torch.tensor(p)
            attn[r, width - len(p):] = 1
        ids, attn = ids.to(policy.device), attn.to(policy.device)
        # the mask is passed: transformers' padding warning is a false alarm
        with generation_params(policy.model) as model, decode_attention(model, self.decode_attention), \
                finished_row_pad_alarm_silenced():
            # under lockstep every rank must run the same forwards: no shared prefill, and generate (synced_gpus)
            prefix = shared_prompt_cache(model, ids, attn) if self.share_prefill and not synced else None
            try:
                if self.uses_static_sampler(policy, synced):
                    seq, logp = static_sample(model, ids, attn, s, eos_token_id=tok.eos_token_id,
                                              pad_token_id=tok.pad_token_id, prefix=prefix,
                                              min_new_tokens=self.benchmark_min_new_tokens)
                else:
                    seq, logp = self._generate(model, tok, ids, attn, s, synced, prefix)
            except RuntimeError as exc:
                if "probability tensor contains" in str(exc):  # torch.multinomial on inf/NaN scores
                    raise NonFiniteLogitsError(nonfinite_logits_message(policy)) from exc
                raise
        seq, logp = seq.cpu(), logp.cpu()
        is_eos = seq == tok.eos_token_id
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, seq.shape[1]).tolist()  # length incl. EOS
        return [seq[r, :n] for r, n in enumerate(first)], [logp[r, :n] for r, n in enumerate(first)]

    def uses_static_sampler(self, policy, synced: bool = False) -> bool:
        """Whether :meth:`generate` samples ``policy`` with the static-cache loop (class docstring)."""
        if self.sampler == "generate" or synced or self._keep_scores:
            return False
        if self.sampler == "auto" and torch.device(policy.device).type != "cpu":
            return False
        return supports_static_sample(policy.model)

    def _generate(self, model, tok, ids, attn, s: SamplingSpec, synced: bool, prefix):
        """``(tokens [B, T], logp [B, T])`` from ``model.generate`` (on the device; rows past EOS padded)."""
        width = ids.shape[1]
        # the sampling warpers run inside the recorder, because generate would apply its own after any custom
        # processor; the reference path (_keep_scores) lets generate apply them and keeps all its scores
        recorder = None if self._keep_scores else SampledLogProbs(s.temperature, s.top_k, s.top_p)
        warp = {"temperature": 1.0, "top_p": 1.0, "top_k": 0} if recorder else \
            {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k}
        cfg = GenerationConfig(
            do_sample=True, max_new_tokens=s.max_new_tokens, **warp,
            output_scores=recorder is None, return_dict_in_generate=True, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
            **({"min_new_tokens": self.benchmark_min_new_tokens} if self.benchmark_min_new_tokens else {}),
        )
        extra = {"synced_gpus": True} if synced else {}
        if recorder:
            extra.update(logits_processor=LogitsProcessorList([recorder]), streamer=recorder)
        if prefix is not None:
            extra["past_key_values"] = prefix
        with only_config(model, cfg):
            gen = model.generate(input_ids=ids, attention_mask=attn, generation_config=cfg, **extra)
        seq = gen.sequences[:, width:]  # [B, T]
        if recorder:
            return seq, recorder.logp(seq.shape[1])
        scores = torch.stack(gen.scores, dim=1).float()  # the reference: every step's processed scores, [B, T, V]
        return seq, torch.log_softmax(scores, dim=-1).gather(-1, seq.to(scores.device).unsqueeze(-1)).squeeze(-1)

    @staticmethod
    def _record(policy, problem, prompt_text, prompt_ids, ids, logp, step, group_id) -> Rollout:
        tok = policy.tokenizer
        stopped = len(ids) > 0 and int(ids[-1]) == tok.eos_token_id
        body = ids[:-1] if stopped else ids
        text = tok.decode(body.tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False)
        offsets = tuple(offsets_by_decoding(tok, body.tolist(), text))  # spans of the *sampled* ids
        if stopped:
            offsets = offsets + ((len(text), len(text)),)
        return Rollout(
            policy_id=policy.name, prompt_id=problem.prompt_id, group_id=group_id, step=step,
            policy_version=policy.version, prompt_text=prompt_text, response_text=text,
            prompt_ids=torch.tensor(prompt_ids, dtype=torch.long), response_ids=ids, logp=logp,
            offsets=offsets, finish_reason="eos" if stopped else "length",
        )


class SampledLogProbs(LogitsProcessor):
    """The log-prob of each sampled token under the processed scores, one decoding step at a time.

    Passed to ``generate`` both as its logits processor and as its streamer. As the processor it applies the
    sampling warpers itself -- temperature, top-k, top-p, with transformers' own classes in ``generate``'s order
    (``generate`` appends its warpers *after* any custom processor, so it is called with them off) -- and records
    the result; as the streamer it is handed each step's sampled tokens (the prompt first). Each step's
    ``log_softmax`` waits in a queue until its tokens arrive, so at most a step or two of ``[B, V]`` log-probs exist
    at a time, where ``output_scores`` would keep ``[B, T, V]`` to the end (5 GB for 128 responses of 64 tokens on a
    151k vocabulary). Same values as gathering from ``output_scores`` (tested).
    """

    def __init__(self, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
        self._warpers = sampling_warpers(temperature, top_k, top_p)
        self._pending: deque[torch.Tensor] = deque()
        self._steps: list[torch.Tensor] = []
        self._prompt_seen = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = self._warpers(input_ids, scores)
        self._pending.append(torch.log_softmax(scores.float(), dim=-1))
        return scores

    def put(self, value: torch.Tensor) -> None:  # streamer protocol
        if not self._prompt_seen:  # generate puts the prompt ids first
            self._prompt_seen = True
            return
        lsm = self._pending.popleft()
        self._steps.append(lsm.gather(-1, value.to(lsm.device).view(-1, 1)).squeeze(-1))  # on the device

    def end(self) -> None:  # streamer protocol
        self._pending.clear()

    def logp(self, steps: int) -> torch.Tensor:
        """``[B, steps]``: the recorded log-probs of the ``steps`` generated tokens."""
        if len(self._steps) != steps:
            raise RuntimeError(f"generate produced {steps} tokens per row but {len(self._steps)} were streamed")
        return torch.stack(self._steps, dim=1).cpu()


def shared_prompt_cache(model, ids: torch.Tensor, attn: torch.Tensor):
    """The key/value cache of every row's prompt but its last token, computed once per distinct prompt *(ours)*.

    ``ids``/``attn`` ``[B, W]`` (left-padded prompts). The distinct rows run one forward over their first ``W - 1``
    tokens and the cache is gathered per row, so a group's ``n`` samples prefill their prompt once instead of
    ``n`` times; ``generate`` then runs the last prompt token of every row on that cache and samples as before
    (same tokens and log-probs up to float rounding, tested). ``None`` -- ``generate`` prefills every row itself --
    when no two rows share a prompt, prompts are one token wide, the model's ``forward`` takes no ``position_ids``
    or ``logits_to_keep``, or its cache has layers other than plain (or sliding-window) key/value layers
    (linear-attention and hybrid layers keep states that are not gathered by rows).
    """
    if ids.shape[1] < 2 or ids.shape[0] < 2:
        return None
    target = base_model(model)
    params = inspect.signature(target.forward).parameters
    if "position_ids" not in params or "logits_to_keep" not in params:
        return None
    uniq, inverse = torch.unique(torch.cat([ids, attn], dim=1), dim=0, return_inverse=True)
    if len(uniq) == ids.shape[0]:
        return None
    width = ids.shape[1]
    u_ids, u_attn = uniq[:, : width - 1], uniq[:, width : 2 * width - 1]
    pos = (u_attn.long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=u_ids, attention_mask=u_attn, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache = getattr(out, "past_key_values", None)
    if not _rows_gatherable(cache):
        return None
    cache.batch_select_indices(inverse)
    return cache


def _rows_gatherable(cache) -> bool:
    """Whether ``cache.batch_select_indices`` gathers all of ``cache`` by rows: a cache of plain or sliding-window
    key/value layers only (exactly those types)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and hasattr(cache, "batch_select_indices") and \
        all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)


@contextmanager
def only_config(model, config: GenerationConfig):
    """Inside, the Hugging Face model's own ``generation_config`` is ``config`` (restored on exit), so ``generate``
    fills no unset field from the checkpoint's; ``model`` may be a peft wrapper (its base model's is replaced)."""
    target = base_model(model)
    own = target.generation_config
    target.generation_config = config
    try:
        yield
    finally:
        target.generation_config = own
