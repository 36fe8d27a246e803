"""``rollout_engine: auto`` (the default): vLLM where it is installed and samples faster than Hugging Face, else HF.

The choice is made once per run, when the policies are built (the module's ``setup``, before the memory plan; or
at the first rollout outside Lightning), and said in one line:

* vLLM is not installed -> HF (:class:`~mutual_rl.rollout.hf.HFRolloutEngine`);
* the run's largest policy has fewer than ``min_params`` parameters -> HF: below that size vLLM's per-call overhead
  costs more than its faster decoding saves (:data:`CROSSOVER_PARAMS`, 10 M, measured on CPU with
  ``scripts/bench_engines.py`` on models of several sizes: docs/benchmarks.md);
* else vLLM (:class:`~mutual_rl.rollout.vllm.VLLMRolloutEngine` with ``vllm`` as its arguments). If it cannot start
  (it does not import, or a policy's first rollout or greedy evaluation through it raises: an architecture it does
  not support, no memory, ...), the run falls back to HF for good, with one line naming the error; the vLLM engines
  built so far are closed. Under several processes the ranks agree first (one ``agree_max``), so every rank falls
  back together and regenerates that rollout with HF. A wrong ``vllm`` argument (a ``ValueError``) is not a fall-back:
  it is raised.

Everything else -- ``place``, ``sync_weights``, ``close``, the memory plan's view of the engine's arguments -- goes to
the chosen engine (attributes read and not defined here are the chosen engine's; set them on ``chosen``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence

from mutual_rl.interfaces import RolloutEngine
from mutual_rl.rollout.hf import HFRolloutEngine
from mutual_rl.rollout.vllm import VLLMRolloutEngine
from mutual_rl.sampling import SamplingSpec
from mutual_rl.types import Problem, Rollout

CROSSOVER_PARAMS = 10_000_000
"""Parameters of the largest policy from which vLLM is chosen. Measured on this 2-core CPU at 32e11cc (vLLM 0.32's CPU
backend vs the HF engine's default sampler, tokens/s of 64-token samples, median of 3 interleaved pairs): vLLM/HF
0.61 at 0.87 M parameters, 0.83 at 3.3 M, 1.12 at 10.7 M, 1.35 at 25.5 M, 1.17 at 85 M (GPT-2s of the tiny BPE
vocabulary), 1.56 at SmolLM2-135M; the crossover lies between 3.3 and 10.7 M, and 10 M is the smallest size
measured where vLLM wins (docs/benchmarks.md). Not measured on a GPU."""


def _params(policy) -> int:
    counts = getattr(policy, "param_counts", None) or {}
    if counts.get("params"):
        return int(counts["params"])  # counted at build time, before any sharding
    return sum(p.numel() for p in policy.model.parameters())


class AutoRolloutEngine(RolloutEngine):
    """vLLM where it is installed and the run's largest policy reaches ``min_params`` parameters, else Hugging Face
    (module docstring).

    Args:
        min_params: parameters of the largest policy from which vLLM is chosen.
        hf: init arguments of the HF engine (when it is chosen, or fallen back to).
        vllm: init arguments of the vLLM engine (when it is chosen).
    """

    def __init__(self, min_params: int = CROSSOVER_PARAMS, hf: dict | None = None, vllm: dict | None = None):
        if isinstance(min_params, bool) or not isinstance(min_params, int) or min_params < 0:
            raise ValueError(f"rollout engine auto: min_params must be a number of parameters >= 0, got "
                             f"{min_params!r}.")
        self.min_params = min_params
        self.hf_args, self.vllm_args = dict(hf or {}), dict(vllm or {})
        self.chosen: RolloutEngine | None = None
        self.reason = ""
        self._started: set[str] = set()  # policies whose vLLM engine started

    def choose(self, policies: Mapping[str, object] | Sequence[object]) -> RolloutEngine:
        """The engine for a run of ``policies`` (by name, e.g. the module's ``ModuleDict``, or a list; once: later
        calls return the same), said in one line."""
        if self.chosen is not None:
            return self.chosen
        items = list(policies.values()) if hasattr(policies, "values") else list(policies)
        largest = max((_params(p) for p in items), default=0)
        size = f"largest policy {largest / 1e6:.1f} M parameters"
        if importlib.util.find_spec("vllm") is None:
            self._pick(HFRolloutEngine(**self.hf_args), f"Hugging Face (vLLM is not installed; {size})")
        elif largest < self.min_params:
            self._pick(HFRolloutEngine(**self.hf_args),
                       f"Hugging Face ({size} < {self.min_params / 1e6:g} M, below which HF samples faster)")
        else:
            try:
                engine = VLLMRolloutEngine(**self.vllm_args)
            except (ImportError, OSError, RuntimeError) as e:  # installed but unusable (a broken install): HF
                self._pick(HFRolloutEngine(**self.hf_args), f"Hugging Face (vLLM could not start: "
                                                            f"{type(e).__name__}: {str(e).splitlines()[0]})")
            else:
                self._pick(engine, f"vLLM ({size} >= {self.min_params / 1e6:g} M)")
        return self.chosen

    def _pick(self, engine: RolloutEngine, reason: str) -> None:
        from mutual_rl.distributed import rank_and_world

        self.chosen, self.reason = engine, reason
        if rank_and_world()[0] == 0:
            print(f"mutual-rl: rollout engine (auto): {reason}", file=sys.stderr, flush=True)

    def _fall_back(self, policy, error: Exception) -> None:
        self.chosen.close()
        self._pick(HFRolloutEngine(**self.hf_args), f"Hugging Face from here on: vLLM could not start for policy "
                                                    f"{policy.name!r} ({type(error).__name__}: "
                                                    f"{str(error).splitlines()[0] if str(error) else ''})")

    def _first_use(self, policy, use):
        """``use(engine)`` with the chosen engine; a policy's first use of vLLM falls back to HF when it raises on any
        rank (the ranks agree), and then ``use`` runs again with HF."""
        from mutual_rl.distributed import agree_max, is_distributed

        engine = self.chosen or self.choose([policy])
        if not isinstance(engine, VLLMRolloutEngine) or policy.name in self._started:
            return use(engine)
        out, error = None, None
        try:
            out = use(engine)
        except Exception as e:  # noqa: BLE001 - the engine could not start: HF from here on, said once
            error = e
        failed = error is not None
        if is_distributed():
            failed = bool(agree_max([int(failed)])[0])
        if not failed:
            self._started.add(policy.name)
            return out
        self._fall_back(policy, error or RuntimeError("it failed on another rank"))
        return use(self.chosen)

    def generate(self, policy, problems: Sequence[Problem], sampling: SamplingSpec, *, step: int,
                 group_id_base: int = 0) -> list[list[Rollout]]:
        return self._first_use(policy, lambda engine: engine.generate(policy, problems, sampling, step=step,
                                                                     group_id_base=group_id_base))

    def generate_greedy(self, policy, problems: Sequence[Problem], max_new_tokens: int) -> list[str] | None:
        """Greedy texts through the chosen engine when it decodes greedily itself (vLLM); ``None`` when it does not
        (HF, or after a fall-back): the evaluator then decodes with Hugging Face ``generate``."""
        def greedy(engine):
            through = getattr(engine, "generate_greedy", None)
            return None if through is None else through(policy, problems, max_new_tokens)

        return self._first_use(policy, greedy)

    def place(self, name: str, placement: str | int) -> None:
        if self.chosen is None and placement != "colocate":  # before the choice: both engines' rule
            raise ValueError(f"placement of policy {name!r} is device {placement!r}, but the rollout engines run in "
                             "the training process on its device (Hugging Face generates with the training weights; "
                             "the vLLM engine is bound to the process's device); use placement 'colocate'.")
        if self.chosen is not None:
            self.chosen.place(name, placement)

    def sync_weights(self, policy):
        return None if self.chosen is None else self.chosen.sync_weights(policy)

    def close(self) -> None:
        if self.chosen is not None:
            self.chosen.close()

    def __getattr__(self, name: str):
        chosen = self.__dict__.get("chosen")
        if chosen is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(chosen, name)
