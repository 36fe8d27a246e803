"""A policy at run time: its model (optionally with LoRA adapters), tokenizer and prompt format."""

from __future__ import annotations

import contextlib
import copy
import re

import torch
from torch import nn

from mutual_rl.algorithms.token_logp import token_logp_from_hidden
from mutual_rl.distributed import compute_device
from mutual_rl.model.compiled import check_compiler, training_model
from mutual_rl.model.dropout import disable_dropout, restored_dropout
from mutual_rl.model.lm_head import hidden_states_out, in_root_forward, plain_head
from mutual_rl.model.loading import load_model_and_tokenizer
from mutual_rl.model.spec import PolicySpec
from mutual_rl.thl.retokenize import prompt_ids


class Policy(nn.Module):
    """Holds one policy's model and tokenizer; computes log-probs of response tokens.

    ``version`` counts this policy's optimizer steps (records carry it as ``policy_version``).
    """

    def __init__(self, spec: PolicySpec, model: nn.Module, tokenizer, *, needs_reference: bool = False):
        super().__init__()
        self.spec = spec
        self.tokenizer = tokenizer
        self.version = 0
        self.share_prompts = True  # one prompt forward per group in response_logp (see its docstring)
        self.chunked_head = True  # log-probs from hidden states in chunks where exact (see response_logp)
        self.max_prompt_tokens: int | None = None  # prompt_overflow: truncate sets it (see encode_prompt)
        self.autocast_dtype: torch.dtype | None = None  # the run's autocast dtype (memory/fit.py sets it)
        self.token_budget: int | None = None  # tokens per micro-batch the memory plan chose (None: not planned)
        self.param_counts: dict[str, int] | None = None  # sizes for the memory plan, counted before any sharding
        if spec.compile:
            check_compiler()
        # before LoRA: the adapters' dropout is lora.dropout, as configured; exports put the config values back
        self._config_dropout = disable_dropout(model) if spec.disable_dropout else []
        if spec.gradient_checkpointing:
            _enable_gradient_checkpointing(spec, model)
            self.share_prompts = False  # see _response_logits
        if spec.lora is not None:
            model = _add_lora(model, spec)
        self.model = model
        self.model.train()  # from_pretrained returns eval mode
        from mutual_rl.memory.footprint import count_parameters

        self.param_counts = {**count_parameters(model), "dtype_bytes": next(model.parameters()).element_size()}
        # Without LoRA a KL reference needs a frozen copy; with LoRA it is the base model, adapters disabled.
        self._reference = None
        if needs_reference and spec.lora is None:
            self._reference = [copy.deepcopy(model).eval().requires_grad_(False)]  # list: not a submodule

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def device(self) -> torch.device:
        """Where this policy computes: its forwards' inputs are moved there, its log-probs come back there. The
        parameters' device, or under FSDP the unit's compute device (``distributed.compute_device``)."""
        return compute_device(self.model)

    def render_prompt(self, problem: str) -> str:
        return self.spec.render_prompt(problem)

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt ids in this policy's format (chat template if configured; BOS as its tokenizer adds it), cut to
        their last ``max_prompt_tokens`` (a leading BOS kept) when that is set (``model.prompt_overflow:
        truncate``)."""
        if self.max_prompt_tokens is None:
            return self.encode_full_prompt(text)
        from mutual_rl.data.prompt_length import truncated_prompt_ids

        return truncated_prompt_ids(self.encode_full_prompt, text, self.max_prompt_tokens,
                                    getattr(self.tokenizer, "bos_token_id", None))

    def encode_full_prompt(self, text: str) -> list[int]:
        """:meth:`encode_prompt` without truncation."""
        return prompt_ids(self.tokenizer, text, chat_template=self.spec.chat_template)

    def response_logp(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int, temperature: float,
        *, with_entropy: bool = False, reference: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the last ``response_width`` tokens of each row.

        input_ids, attention_mask: [B, P + T] on any device (moved to :attr:`device`); returns logp [B, T] and
        entropy [B, T] (or None) on :attr:`device`, under the tempered distribution ``softmax(logits / temperature)``
        the rollouts were sampled from.

        Rows that share a prompt (a GRPO group) share its forward pass: the distinct prompts run once, their
        key/value cache is gathered per row (differentiably), and only the response tokens run per row. This
        changes no value or gradient beyond float rounding (tested) and roughly halves forward+backward time
        for short responses. Set ``share_prompts = False`` on the policy to turn it off. With gradient
        checkpointing in train mode it is off (Hugging Face drops the cache there; recomputation would also append
        to a shared cache again): one plain forward, the same values and gradients (tested).

        Where the model's logits are exactly ``lm_head(hidden)`` (``model/lm_head.py``), the head runs outside the
        model in chunks of tokens (``algorithms/token_logp.py``), so no ``[B, T, V]`` float32 logits exist in the
        forward or the backward: on a 151k vocabulary that is most of an update's memory. Same values and gradients
        up to float rounding (tested); ``chunked_head = False`` on the policy builds full logits instead. Under FSDP
        the forward(s) and the chunked head run inside one forward of the root unit (``lm_head.in_root_forward``).
        """
        device = self.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        ctx = self._reference_ctx() if reference else contextlib.nullcontext(self.model)
        targets = input_ids[:, -response_width:]
        with ctx as model:
            head = plain_head(model) if self.chunked_head else None
            if head is not None:  # never full-vocabulary logits (model/lm_head.py)
                def chunked(inner):
                    with hidden_states_out(inner, head):
                        hidden = self._response_logits(inner, input_ids, attention_mask, response_width,
                                                       compiled=not reference)  # [B, T, H]
                    return token_logp_from_hidden(hidden, head.weight, head.bias, targets, temperature,
                                                  with_entropy=with_entropy)

                return in_root_forward(model, chunked)  # under FSDP: inside the root unit's forward
            logits = self._response_logits(model, input_ids, attention_mask, response_width,
                                           compiled=not reference)  # [B, T, V]
        logits = logits.float() / temperature
        logz = torch.logsumexp(logits, dim=-1)  # [B, T]
        logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
        entropy = None
        if with_entropy:
            with torch.no_grad():
                probs = torch.softmax(logits, dim=-1)
                entropy = logz - (probs * logits).sum(-1)
        return logp, entropy

    def dummy_prompt_ids(self) -> list[int]:
        """A short fixed prompt in this policy's format, for lockstep dummy passes (output discarded)."""
        return self.encode_prompt(self.render_prompt("1 + 1"))

    def dummy_logp(self, temperature: float = 1.0, *, reference: bool = False) -> torch.Tensor:
        """Log-prob [1, 1] of a fixed one-token response to a fixed prompt. Its only use is a forward whose result
        the caller discards (or multiplies by 0 before backward), run to keep FSDP ranks in lockstep
        (``mutual_rl.distributed``)."""
        ids = self.dummy_prompt_ids() + [self.tokenizer.eos_token_id]
        t = torch.tensor([ids], device=self.device)
        return self.response_logp(t, torch.ones_like(t), 1, temperature, reference=reference)[0]

    def _response_logits(self, model, input_ids, attention_mask, width: int, *, compiled: bool = True) -> torch.Tensor:
        """Logits predicting the last ``width`` tokens: [B, width, V]; through the compiled model when ``compiled``
        and ``spec.compile`` (never for the KL reference: under LoRA that is this model with its adapters off)."""
        recomputes = model.training and getattr(model, "is_gradient_checkpointing", False)
        if compiled:
            model = training_model(self, model)
        pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        prompt_w = input_ids.shape[1] - width
        if self.share_prompts and not recomputes and prompt_w > 0 and input_ids.shape[0] > 1:
            keys = torch.cat([input_ids[:, :prompt_w], attention_mask[:, :prompt_w]], dim=1)
            uniq, inverse = torch.unique(keys, dim=0, return_inverse=True)
            if len(uniq) < input_ids.shape[0]:
                p_ids, p_mask = uniq[:, :prompt_w], uniq[:, prompt_w:]
                out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=pos[:, :prompt_w][_first(inverse)],
                            use_cache=True, logits_to_keep=1)
                cache = out.past_key_values
                cache.batch_select_indices(inverse)
                rest = model(input_ids=input_ids[:, prompt_w:], attention_mask=attention_mask,
                             position_ids=pos[:, prompt_w:], past_key_values=cache, use_cache=True,
                             logits_to_keep=width)
                return torch.cat([out.logits[:, -1:][inverse], rest.logits[:, :-1]], dim=1)
        return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False,
                     logits_to_keep=width + 1).logits[:, :-1]

    @contextlib.contextmanager
    def _reference_ctx(self):
        if self.spec.lora is not None:
            with self.model.disable_adapter():
                yield self.model
        elif self._reference is not None:
            ref = self._reference[0]  # not a submodule (never trained or checkpointed): follow the policy's device
            if next(ref.parameters()).device != self.device:
                ref.to(self.device)
            yield ref
        else:
            raise RuntimeError(f"policy {self.name!r} has no KL reference (kl_coef is 0).")

    def export(self, path) -> None:
        """Hugging Face format: full weights, or only the LoRA adapters (peft) when LoRA is on. Under FSDP call it
        inside ``strategies.full_params(policy.model)``."""
        from pathlib import Path

        from mutual_rl.strategies import clean_name, plain_state_dict, unwrap

        model = unwrap(self.model)
        if self.spec.lora is not None and model is not self.model:
            # LoRA under FSDP: peft selects adapter tensors by its layers' module names, which carry FSDP's wrapper
            # components; select with those names, then save them under the plain ones in peft's format
            from peft.utils import get_peft_model_state_dict
            from safetensors.torch import save_file

            raw = {k: v.detach().clone() for k, v in model.named_parameters()}
            adapters = {clean_name(k): v.contiguous() for k, v in get_peft_model_state_dict(model, raw).items()}
            Path(path).mkdir(parents=True, exist_ok=True)
            save_file(adapters, str(Path(path) / "adapter_model.safetensors"), metadata={"format": "pt"})
            model.peft_config[model.active_adapter].save_pretrained(str(path))
        else:
            with restored_dropout(self._config_dropout):  # the export carries the checkpoint's own dropout settings
                model.save_pretrained(path, state_dict=plain_state_dict(self.model))
        self.tokenizer.save_pretrained(path)


def _first(inverse: torch.Tensor) -> torch.Tensor:
    """For each distinct value of ``inverse`` (0..U-1), the index of its first occurrence."""
    first = torch.full((int(inverse.max()) + 1,), len(inverse), dtype=torch.long, device=inverse.device)
    return first.scatter_reduce(0, inverse, torch.arange(len(inverse), device=inverse.device), reduce="amin")


def _enable_gradient_checkpointing(spec: PolicySpec, model) -> None:
    """Hugging Face gradient checkpointing, non-reentrant (works with frozen inputs, e.g. under LoRA)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"policy {spec.name!r}: gradient_checkpointing is true, but {type(model).__name__} does not "
                         "support it; set gradient_checkpointing: false.")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _add_lora(model, spec: PolicySpec):
    from peft import LoraConfig, get_peft_model

    check_lora_targets(model, spec)
    cfg = LoraConfig(
        r=spec.lora.r, lora_alpha=spec.lora.alpha, lora_dropout=spec.lora.dropout,
        target_modules=spec.lora.target_modules, task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def build_policy(spec: PolicySpec, task=None, cache_dir=None, needs_reference: bool = False) -> Policy:
    model, tokenizer = load_model_and_tokenizer(spec, task, cache_dir)
    return Policy(spec, model, tokenizer, needs_reference=needs_reference)


def _adaptable_types() -> tuple[type, ...]:
    """Layer types peft's LoRA adapts (transformers' ``Conv1D`` is GPT-2's linear layer)."""
    types: list[type] = [torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d]
    try:
        from transformers.pytorch_utils import Conv1D

        types.append(Conv1D)
    except ImportError:  # pragma: no cover - transformers always has it
        pass
    return tuple(types)


def check_lora_targets(model, spec: PolicySpec) -> None:
    """Every ``lora.target_modules`` entry names a layer of ``model`` that LoRA can adapt, by peft's rule (a list
    entry matches a module whose name is the entry or ends with ``.<entry>``; a string other than ``all-linear``
    is a regular expression the whole name must match). peft itself only fails when *no* entry matches, and then
    without naming the policy or the layers: a misspelt entry next to a good one was silently ignored. Else
    ``ValueError`` naming the policy, the entries that match nothing and the linear layers the model has."""
    targets = spec.lora.target_modules
    if targets == "all-linear":
        return
    kinds = _adaptable_types()
    names = [(name, module) for name, module in model.named_modules() if name]
    adaptable = [name for name, module in names if isinstance(module, kinds)]
    if isinstance(targets, str):
        try:
            missing = [] if any(re.fullmatch(targets, name) for name in adaptable) else [targets]
        except re.error as err:
            raise ValueError(f"policy {spec.name!r}: lora.target_modules {targets!r} is not a valid regular "
                             f"expression ({err}); give a list of layer names instead, e.g. [q_proj, v_proj]."
                             ) from None
        rule = ("a string is a regular expression that the whole module name must match (e.g. '.*q_proj'); a list "
                "such as [q_proj, v_proj] matches by the names' last part")
    else:
        if not targets:
            raise ValueError(f"policy {spec.name!r}: lora.target_modules is empty; name the layers to adapt, or "
                             "use all-linear.")
        missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in adaptable)]
        rule = "each entry is the last part(s) of a module name, e.g. q_proj or self_attn.q_proj"
    if not missing:
        return
    linear = tuple(k for k in kinds if k is nn.Linear or k.__name__ == "Conv1D")  # where LoRA usually goes
    leaves = sorted({name.rsplit(".", 1)[-1] for name, module in names if isinstance(module, linear)})
    other = [t for t in missing if isinstance(targets, list)
             and any(n == t or n.endswith("." + t) for n, _ in names)]
    note = (f" ({', '.join(repr(t) for t in other)} {'is' if len(other) == 1 else 'are'} not a linear, embedding "
            "or convolution layer)" if other else "")
    raise ValueError(
        f"policy {spec.name!r}: lora.target_modules {', '.join(repr(t) for t in missing)} "
        f"{'matches' if len(missing) == 1 else 'match'} no layer LoRA can adapt in {spec.model} "
        f"({type(model).__name__}){note}; {rule}. Its linear layers: {', '.join(leaves) or 'none'}. Fix "
        "lora.target_modules, or use all-linear (every linear layer but the output head)."
    )
