"""Loading a policy's model and tokenizer: embedded ``tiny:`` presets, Hugging Face folders or Hub ids, ``.gguf``
files and ``pkg:`` files of installed packages; dtype, special tokens and the checks that make a bad checkpoint one
clear error."""

from __future__ import annotations

import re

import torch

from mutual_rl.model.spec import PolicySpec, WarmStart

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
