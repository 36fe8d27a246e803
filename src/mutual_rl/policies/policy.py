"""A policy at run time: its model (optionally with LoRA adapters), tokenizer and prompt format."""

from __future__ import annotations

import contextlib
import copy
import re

import torch
from torch import nn

from mutual_rl.algorithms.token_logp import token_logp_from_hidden
from mutual_rl.distributed import compute_device
from mutual_rl.policies.compiled import check_compiler, training_model
from mutual_rl.policies.dropout import disable_dropout, restored_dropout
from mutual_rl.policies.lm_head import hidden_states_out, plain_head
from mutual_rl.policies.spec import PolicySpec, WarmStart
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

        Where the model's logits are exactly ``lm_head(hidden)`` (``policies/lm_head.py``), the head runs outside the
        model in chunks of tokens (``algorithms/token_logp.py``), so no ``[B, T, V]`` float32 logits exist in the
        forward or the backward: on a 151k vocabulary that is most of an update's memory. Same values and gradients
        up to float rounding (tested); ``chunked_head = False`` on the policy builds full logits instead.
        """
        device = self.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        ctx = self._reference_ctx() if reference else contextlib.nullcontext(self.model)
        targets = input_ids[:, -response_width:]
        with ctx as model:
            head = plain_head(model) if self.chunked_head else None
            if head is not None:  # never full-vocabulary logits (policies/lm_head.py)
                with hidden_states_out(model, head):
                    hidden = self._response_logits(model, input_ids, attention_mask, response_width,
                                                     compiled=not reference)  # [B, T, H]
                return token_logp_from_hidden(hidden, head.weight, head.bias, targets, temperature,
                                              with_entropy=with_entropy)
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

    cfg = LoraConfig(
        r=spec.lora.r, lora_alpha=spec.lora.alpha, lora_dropout=spec.lora.dropout,
        target_modules=spec.lora.target_modules, task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


class UnsupportedModelError(ValueError):
    """A checkpoint whose architecture this transformers cannot load as a causal LM."""


def load_model_and_tokenizer(spec: PolicySpec, task=None, cache_dir=None):
    """(model, tokenizer) for ``spec.model``: an embedded ``tiny:`` preset, a Hugging Face folder or Hub id, a
    ``.gguf`` file (``gguf_file`` inside a folder / repo), or a ``pkg:`` file of an installed package.

    Presets warm up on ``task`` (the run's built-in task; a default :class:`ArithmeticTask` if None). The
    tokenizer must be fast; its EOS is what rollouts stop at, so the model's ``config`` and ``generation_config``
    are made to name it too (a warning says when they named another). No pad token: the EOS pads.
    """
    from mutual_rl.presets.models import is_preset

    model_kwargs = {"dtype": _DTYPES[spec.dtype]}
    if spec.attn_implementation is not None:
        model_kwargs["attn_implementation"] = spec.attn_implementation
    if is_preset(spec.model):
        from mutual_rl.data.task import ArithmeticTask
        from mutual_rl.presets.cache import load_preset

        return load_preset(
            spec.model, seed=spec.seed, warmstart=spec.warmstart or WarmStart(),
            task=task if task is not None else ArithmeticTask(), prompt_template=spec.prompt_template,
            chat_template=spec.chat_template, cache_dir=cache_dir, **model_kwargs,
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _source(spec, "model", spec.model, spec.gguf_file)
    if spec.revision is not None and source.local:
        raise ValueError(
            f"policy {spec.name!r}: revision {spec.revision!r} is set, but model {spec.model!r} is the local folder "
            f"{source.path}, which has one version only (revision selects a branch, tag or commit of a Hub repo). "
            "Remove revision, or point model at the folder of the version you want."
        )
    hub_revision = {"revision": spec.revision} if spec.revision is not None else {}
    tok_source = _source(spec, "tokenizer", spec.tokenizer, None) if spec.tokenizer else source
    tokenizer = _from_pretrained(spec, AutoTokenizer, tok_source, **(hub_revision if tok_source is source else {}))
    if not tokenizer.is_fast:
        raise ValueError(
            f"policy {spec.name!r}: tokenizer {type(tokenizer).__name__} ({spec.tokenizer or spec.model}) is not a "
            "fast tokenizer; mutual-rl needs character offsets. Use a tokenizer with a tokenizer.json."
        )
    if spec.chat_template and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"policy {spec.name!r}: chat_template is true, but tokenizer {spec.tokenizer or spec.model!r} has no chat "
            "template. Set chat_template: false (prompt_template is then the whole prompt), or use a tokenizer "
            "with one (an instruct/chat checkpoint)."
        )
    tokenizer.padding_side = "left"
    model = _from_pretrained(spec, AutoModelForCausalLM, source, is_model=True, **hub_revision, **model_kwargs)
    _align_special_tokens(spec, model, tokenizer)
    return model, tokenizer


class _Source:
    """Where ``from_pretrained`` reads: ``path`` (folder or Hub id) and an optional ``gguf_file`` in it."""

    def __init__(self, path: str, gguf_file: str | None, local: bool):
        self.path, self.gguf_file, self.local = path, gguf_file, local


def _source(spec: PolicySpec, field: str, ref: str, gguf_file: str | None) -> _Source:
    """Resolve ``ref`` (model or tokenizer) as :func:`load_model_and_tokenizer` describes; errors name the policy,
    the field and the fix."""
    from pathlib import Path

    from mutual_rl.assets import PackagedFileNotFoundError, PackageNotInstalledError, is_packaged, resolve

    if is_packaged(ref):
        try:
            path = resolve(ref)
        except PackageNotInstalledError as err:
            raise PackageNotInstalledError(f"policy {spec.name!r}: {field} {ref!r}: {err}", name=err.name) from None
        except PackagedFileNotFoundError as err:
            raise PackagedFileNotFoundError(f"policy {spec.name!r}: {field} {err}") from None
    else:
        checked = _checked_path(spec.name, field, ref, local=ref.lower().endswith(".gguf") or None)
        path = Path(checked)
        if not path.exists():  # a Hub id
            return _Source(checked, gguf_file, local=False)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(f"policy {spec.name!r}: {field} {ref!r} is the file {path}; give a checkpoint folder "
                             "(config.json + weights, or tokenizer files) or a .gguf file.")
        return _Source(str(path.parent), path.name, local=True)
    if gguf_file is not None and not (path / gguf_file).is_file():
        from mutual_rl.assets import listing

        raise FileNotFoundError(f"policy {spec.name!r}: gguf_file {gguf_file!r} is not in the model folder {path} "
                                f"(it holds: {listing(path)}). Fix gguf_file.")
    return _Source(str(path), gguf_file, local=True)


def _from_pretrained(spec: PolicySpec, cls, src: _Source, *, is_model: bool = False, **kwargs):
    """``cls.from_pretrained`` with GGUF and remote-code options; a missing ``gguf`` package and an architecture
    transformers cannot load become one message each, naming the policy and the fix."""
    dense_gguf = is_model and src.gguf_file is not None
    if src.gguf_file is not None:
        kwargs["gguf_file"] = src.gguf_file
        if dense_gguf:  # dense, trainable weights, not GGUF blocks (transformers >= 5.20 may keep those)
            import transformers

            if hasattr(transformers, "GgufConfig"):
                kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    try:
        loaded = cls.from_pretrained(src.path, trust_remote_code=spec.trust_remote_code, **kwargs)
        if dense_gguf:
            _drop_gguf_quantizer(spec, loaded)
        return loaded
    except ImportError as err:
        if src.gguf_file is None or _gguf_version_ok():
            raise
        raise ImportError(
            f"policy {spec.name!r}: loading the GGUF checkpoint {src.gguf_file} needs the gguf package (>= 0.10), "
            f"which is not installed or too old: pip install gguf (or pip install \"mutual-rl[real]\")."
        ) from err
    except (ValueError, KeyError) as err:
        text = str(err)
        if "contains custom code" in text:
            raise UnsupportedModelError(
                f"policy {spec.name!r}: {src.path} ships its own modelling code; set trust_remote_code: true on "
                "this policy to run it (only for checkpoints you trust)."
            ) from err
        arch = _unsupported_architecture(text)
        if arch is None:
            raise
        import transformers

        elsewhere = not is_model and spec.tokenizer is not None  # the separate tokenizer: source failed
        field, shown, what = (("tokenizer", spec.tokenizer, "a tokenizer (AutoTokenizer)") if elsewhere else
                              ("model", spec.model, "a causal language model (AutoModelForCausalLM)"))
        gguf = f" ({spec.gguf_file})" if spec.gguf_file and not elsewhere else ""  # gguf_file: inside a folder
        raise UnsupportedModelError(
            f"policy {spec.name!r}: {field} {shown!r}{gguf} has architecture {arch!r}, which transformers "
            f"{transformers.__version__} cannot load as {what}. mutual-rl trains transformers-supported causal LMs: "
            "use a checkpoint of a supported architecture (Llama, Qwen2/3, Mistral, GPT-2, ...), upgrade "
            "transformers, or, for a checkpoint that ships its own modelling code, set trust_remote_code: true."
        ) from err


def _drop_gguf_quantizer(spec: PolicySpec, model) -> None:
    """A GGUF loaded dequantised is a plain dense model, but transformers still marks it quantized (GGUF), which
    forbids ``save_pretrained`` (exports) and casts; drop the marks once no packed GGUF module is left."""
    packed = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.lower().startswith(("gguf", "ggml"))})
    if packed:
        raise ValueError(f"policy {spec.name!r}: the GGUF checkpoint loaded with packed (untrainable) modules "
                         f"{packed}; mutual-rl needs dense weights. Convert it to safetensors first.")
    if getattr(model, "hf_quantizer", None) is not None:
        del model.hf_quantizer  # the class default (None) remains: is_quantized becomes False
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.__dict__.pop("quantization_method", None)


_ARCH_PATTERNS = [re.compile(p) for p in (
    r"has model type `([^`]+)`", r"GGUF model with architecture (\S+) is not supported",
    r"GGUF architecture '([^']+)' is not supported", r"GGUF file of architecture '([^']+)'",
    r"Unrecognized configuration class <class '(?:[\w.]*\.)?(\w+)'> for this kind of AutoModel",
    r"Unrecognized configuration class <class '(?:[\w.]*\.)?(\w+)'> to build an AutoTokenizer",
    r"Unrecognized model in (.+?)\. Should have a `model_type`",
)]


def _unsupported_architecture(text: str) -> str | None:
    for i, pattern in enumerate(_ARCH_PATTERNS):
        m = pattern.search(text)
        if m:
            return "no model_type in its config.json" if i == len(_ARCH_PATTERNS) - 1 else m.group(1)
    return None


def _gguf_version_ok() -> bool:
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        return False
    try:
        import gguf  # noqa: F401
        major, minor = (int(x) for x in importlib.metadata.version("gguf").split(".")[:2])
    except Exception:  # broken install or an unparsable version
        return False
    return (major, minor) >= (0, 10)


def _eos_list(value) -> list[int]:
    return [] if value is None else [int(value)] if isinstance(value, int) else [int(v) for v in value]


def _align_special_tokens(spec: PolicySpec, model, tokenizer) -> None:
    """The tokenizer's EOS (what rollouts stop at) is named by ``model.config`` and ``model.generation_config``
    too; a tokenizer without EOS takes the model's; no pad token: EOS pads (module docs of the engines)."""
    import warnings

    generation = getattr(model, "generation_config", None)
    configs = [c for c in (model.config, generation) if c is not None]
    if tokenizer.eos_token_id is None:
        known = next((ids[0] for c in configs if (ids := _eos_list(c.eos_token_id))), None)
        if known is None:
            raise ValueError(f"policy {spec.name!r}: neither the tokenizer nor the model config names an EOS token, "
                             "so rollouts could never stop; use a tokenizer with an eos_token.")
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(known)
    eos = tokenizer.eos_token_id
    vocab = model.get_input_embeddings().num_embeddings
    if eos >= vocab:
        raise ValueError(f"policy {spec.name!r}: the tokenizer's EOS id {eos} is outside the model's {vocab}-token "
                         "vocabulary; the tokenizer does not belong to this model. Fix tokenizer.")
    for cfg in configs:
        ids = _eos_list(cfg.eos_token_id)
        if eos not in ids:
            if ids:
                warnings.warn(f"policy {spec.name!r}: {type(cfg).__name__}.eos_token_id was {cfg.eos_token_id}, but "
                              f"the tokenizer's EOS is {tokenizer.eos_token!r} ({eos}), which rollouts stop at; "
                              f"set to include {eos}.", UserWarning, stacklevel=3)
            cfg.eos_token_id = eos if cfg is model.config or not ids else [eos, *ids]
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if generation is not None and generation.pad_token_id is None:
        generation.pad_token_id = tokenizer.pad_token_id


def _checked_path(policy: str, field: str, name: str, local: bool | None = None) -> str:
    """``name`` as ``from_pretrained`` gets it. A name that looks local -- it starts with ``/``, ``./``, ``../`` or
    ``~``, has more parts than a Hub id (``org/name``), or its first part is an existing folder -- or any name
    with ``local=True`` (a ``.gguf`` file) is a local path: it must exist, and comes back with ``~`` expanded. Any
    other name is a Hugging Face Hub id, unchanged."""
    from pathlib import Path

    parts = Path(name).parts
    local = local or (name.startswith(("/", "./", "../", "~")) or name in (".", "..") or len(parts) > 2
                      or (len(parts) == 2 and Path(parts[0]).is_dir()))
    if not local:
        return name
    path = Path(name).expanduser()
    if not path.exists():
        found = next((p for p in path.absolute().parents if p.exists()), None)
        raise FileNotFoundError(
            f"policy {policy!r}: {field} {name!r} was not found: {path.absolute()} does not exist (nearest existing "
            f"folder: {found}). Fix this policy's {field}: the folder holding the saved checkpoint, a .gguf file, "
            "a pkg:<package>/<path> reference, or a Hugging Face Hub id (org/name)."
        )
    return str(path)


def build_policy(spec: PolicySpec, task=None, cache_dir=None, needs_reference: bool = False) -> Policy:
    model, tokenizer = load_model_and_tokenizer(spec, task, cache_dir)
    return Policy(spec, model, tokenizer, needs_reference=needs_reference)
