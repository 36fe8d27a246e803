"""What a policy is, as the YAML states it: model, tokenizer, prompt format, LoRA, optimizer, sampling.

These dataclasses are the configuration (docs/design.md, rule 5): their typed fields and attribute docstrings appear in
``mutual-rl fit --help``; ``__post_init__`` validates them with errors that name the field and the fix.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

from mutual_rl.regimes.base import Regime

PRESET_PREFIX = "tiny:"
"""How an embedded preset's name starts (``tiny:gpt2-bpe``)."""


@dataclass
class SamplingSpec:
    """How a policy samples its rollouts."""

    n: int = 8
    """Rollouts per prompt (group size G)."""
    temperature: float = 1.0
    """Sampling temperature; log-probs are those of the tempered distribution."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Top-k filter (0 = off; transformers would otherwise apply 50)."""
    max_new_tokens: int = 32
    """Longest response; longer ones finish with reason length."""

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1 (got {self.n}).")
        if self.temperature <= 0:
            raise ValueError(f"sampling.temperature must be > 0 (got {self.temperature}); use a small value for near-greedy.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1] (got {self.top_p}).")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (got {self.top_k}); 0 turns it off.")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1 (got {self.max_new_tokens}).")


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
        if self.lr <= 0:
            raise ValueError(f"optimizer.lr must be > 0 (got {self.lr}).")
        self.betas = tuple(self.betas)
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
    """Supervised steps (600 at lr 1e-3, batch 64 give ~20-30 % sampled pass@1 on 2-digit +/-)."""
    lr: float = 1e-3
    batch_size: int = 64
    skills: list[str] | None = None
    """Operators to learn (None = all the task has)."""
    other_skill_fraction: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.steps < 0:
            raise ValueError(f"warmstart.steps must be >= 0 (got {self.steps}).")
        if not 0.0 <= self.other_skill_fraction <= 1.0:
            raise ValueError(f"warmstart.other_skill_fraction must be in [0, 1] (got {self.other_skill_fraction}).")


@dataclass
class PolicySpec:
    """One policy: its own model, tokenizer, prompt format, optimizer and sampling."""

    name: str
    """Identifier used in logs and exports (<name>/reward)."""
    model: str
    """A Hugging Face model path or id, or an embedded preset (tiny:gpt2-bpe, tiny:llama-char)."""
    tokenizer: str | None = None
    """Tokenizer path (default: the model's)."""
    prompt_template: str = "{problem}"
    """How a problem becomes this policy's prompt; {problem} is replaced by the problem text."""
    chat_template: bool = False
    """Wrap the rendered prompt as a user message in the tokenizer's chat template."""
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
    seed: int = 0
    """Initialisation seed of a tiny preset."""

    def __post_init__(self):
        if not self.name or "/" in self.name:
            raise ValueError(f"policy name {self.name!r} must be non-empty and contain no '/'.")
        if "{problem}" not in self.prompt_template:
            raise ValueError(
                f"policy {self.name!r}: prompt_template {self.prompt_template!r} must contain '{{problem}}'."
            )
        if self.warmstart is not None and not self.model.startswith(PRESET_PREFIX):
            raise ValueError(
                f"policy {self.name!r}: warmstart is set, but model {self.model!r} is not a {PRESET_PREFIX} preset; "
                f"the supervised warm-up only builds the embedded presets ({PRESET_PREFIX}gpt2-bpe, ...). Remove "
                "warmstart from this policy, or use a preset model."
            )
        if self.sampling.n == 1:
            warnings.warn(
                f"policy {self.name!r}: sampling.n is 1, so each GRPO group holds one response, whose advantage is "
                "0 (nothing to compare it with): GRPO gets no signal from this policy's rollouts. Set sampling.n "
                ">= 2 (e.g. 8).", UserWarning, stacklevel=3,
            )

    def render_prompt(self, problem: str) -> str:
        return self.prompt_template.replace("{problem}", problem)
