"""``mutual-rl``: the LightningCLI entry point (``fit``, ``validate``, ``--help``, ``--print_config``).

Beyond Lightning's CLI:

* no ``--optimizer`` / ``--lr_scheduler``: every policy has its own AdamW (``model.policies[i].optimizer``);
  Lightning's automatic single optimizer would replace them, so giving either is a parse error saying so;
* checkpoints are written with :class:`~mutual_rl.callbacks.checkpointing.AtomicCheckpointIO` (atomic, fsynced)
  unless the trainer is given another checkpoint plugin;
* ``--ckpt_path`` is checked before any model is built: a missing path, a directory, a web URL, or a file that is
  not a complete checkpoint, is one error naming the path; ``--ckpt_path last`` is the newest ``last.ckpt`` of the
  run's checkpoint folders (:func:`~mutual_rl.callbacks.checkpointing.find_last_checkpoint`); with none, a printed
  warning and a start from scratch, as Lightning does (``--resume_required true``: an error naming where it looked);
* a checkpoint's ``hyper_parameters`` are never merged into the configuration (Lightning would): a printed note;
* a parse error (an unknown key, a value of the wrong type, a missing config file) is one paragraph naming the file
  or flag, the full key, what it accepts and the fix, exit status 2 (:class:`MutualRLArgumentParser`);
* a progress bar of steps by default (:class:`~mutual_rl.callbacks.progress.StepProgressBar`: step / max_steps,
  s/step, ETA, each policy's reward).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml
from jsonargparse import Namespace, set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins.io import TorchCheckpointIO

from mutual_rl.callbacks.checkpointing import (
    AtomicCheckpointIO,
    checkpoint_hyper_parameter_keys,
    find_last_checkpoint,
    is_special_ckpt_path,
    refuse_web_url,
    verify_checkpoint_file,
)
from mutual_rl.cli_errors import report_errors, start_running
from mutual_rl.cli_parse_errors import parse_error_paragraph
from mutual_rl.config_files import expand_config_bases
from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.distributed import destroy_process_group
from mutual_rl.module import MutualRLModule
from mutual_rl.rollout.vllm import close_all

# Attribute docstrings of the config dataclasses become --help text.
set_parsing_settings(docstring_parse_attribute_docstrings=True)

TRAINER_DEFAULTS = {
    "max_steps": 200,
    "num_sanity_val_steps": 0,
    "log_every_n_steps": 1,
    "check_val_every_n_epoch": None,
    "val_check_interval": 50,
    "default_root_dir": "runs",
}

_UNSUPPORTED = ("--optimizer", "--lr_scheduler")

#: Trainer arguments left out of the CLI: not applicable here (manual optimization: accumulate_grad_batches,
#: gradient_clip_*; each policy clips with its optimizer.grad_clip; no test/predict loop; prompts are split per
#: rank by the data module) or never needed by this trainer's users
TRAINER_HIDDEN = (
    "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm", "limit_test_batches",
    "limit_predict_batches", "overfit_batches", "reload_dataloaders_every_n_epochs", "use_distributed_sampler",
    "sync_batchnorm", "inference_mode", "barebones", "detect_anomaly", "min_epochs", "min_steps", "model_registry",
    "limit_train_batches",
)


class MutualRLArgumentParser(LightningArgumentParser):
    """Lightning's parser whose parse errors (an unknown key, a wrong type, a missing config file) are one
    paragraph naming the file, the full key, what it accepts and the fix (:func:`~mutual_rl.cli_errors.
    parse_error_paragraph`), exit status 2, instead of the usage line and jsonargparse's message;
    ``MUTUAL_RL_DEBUG=1``: the exception with its traceback."""

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error:
            return super().error(message, ex)
        if os.environ.get("MUTUAL_RL_DEBUG") == "1":
            raise argparse.ArgumentError(None, message) from ex
        argv = getattr(self, "args", None)
        print(parse_error_paragraph(message, self, list(argv) if isinstance(argv, (list, tuple)) else sys.argv[1:]),
              file=sys.stderr, flush=True)
        self.exit(2)


class MutualRLCLI(LightningCLI):
    """LightningCLI for :class:`MutualRLModule` and :class:`PromptDataModule` (module docstring)."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Only ``fit`` and ``validate``: the module has no test or predict step."""
        return {k: v for k, v in LightningCLI.subcommands().items() if k in ("fit", "validate")}

    def add_core_arguments_to_parser(self, parser) -> None:
        """As LightningCLI's, without the Trainer arguments that do not apply to this trainer (manual optimization
        with per-policy clipping, no test/predict loop, our own per-rank prompt split) or that a user of it never
        sets (:data:`TRAINER_HIDDEN`); those keep Lightning's defaults."""
        parser.add_class_arguments(self.trainer_class, "trainer", fail_untyped=False, instantiate=False,
                                   sub_configs=True, skip=set(TRAINER_HIDDEN))
        parser.set_defaults({"trainer." + k: v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(self._datamodule_class, "data", subclass_mode=self.subclass_mode_data)
        # one usage line instead of argparse's list of every option (80 lines that repeat the option list below)
        parser.add_argument("--resume_required", type=bool, default=False,
                            help="with --ckpt_path last: an error when the run has no last.ckpt (default: a warning, "
                                 "and the run starts from scratch, as Lightning does)")
        parser.usage = ("%(prog)s [-h] [-c CONFIG] [--print_config[=flags]] [--ckpt_path CKPT_PATH] "
                        "[--trainer.KEY VALUE] [--model.KEY VALUE] [--data.KEY VALUE] ...")

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("parser_class", MutualRLArgumentParser)
        kwargs["auto_configure_optimizers"] = False  # per-policy optimizers: configure_optimizers is the module's
        super().__init__(*args, **kwargs)

    def parse_arguments(self, parser, args) -> None:
        argv = sys.argv[1:] if args is None else args
        expanded = False
        if isinstance(argv, (list, tuple)):
            bases = expand_config_bases([str(a) for a in argv])
            if bases != [str(a) for a in argv]:  # an overlay names its base: parse the expanded command line
                argv, expanded = bases, True
            flag = _unsupported_optimizer_option([str(a) for a in argv])
            if flag is not None:
                parser.error(
                    f"{flag} is not an option of mutual-rl: each policy has its own AdamW, set per policy under "
                    "model.policies[i].optimizer (lr, betas, weight_decay, eps, grad_clip) in the config file, "
                    "with its learning-rate schedule there too (warmup_steps, schedule: constant | cosine | linear, "
                    "decay_steps, min_lr_ratio; no lr_scheduler)."
                )
        if expanded:
            self.config = parser.parse_args(argv)
        else:
            super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path == "last":  # Lightning looks only in this run's new version folder: never finds the last run's
            ckpt_path = _resolve_last(self.config[subcommand])
        if ckpt_path:
            refuse_web_url(ckpt_path)
        if ckpt_path and not is_special_ckpt_path(ckpt_path):
            verify_checkpoint_file(ckpt_path)  # before Lightning reads it (and before any model is built)

    def _parse_ckpt_path(self) -> None:
        """Lightning merges a checkpoint's ``hyper_parameters`` into the parsed configuration, silently. mutual-rl
        never writes that key, and a checkpoint must not choose the run's configuration (a crafted one switched
        ``trust_remote_code`` on, or replaced the reward's import path): the configuration comes only from the
        user's config files and command line; a checkpoint that carries ``hyper_parameters`` gets a printed note
        saying they were ignored."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and Path(ckpt_path).is_file():
            keys = checkpoint_hyper_parameter_keys(ckpt_path)
            if keys:
                print(f"mutual-rl: checkpoint {ckpt_path!r} carries hyper_parameters ({', '.join(keys[:8])}"
                      f"{', ...' if len(keys) > 8 else ''}); mutual-rl never writes them and did NOT apply them: "
                      "the configuration is your config files and command line only.", file=sys.stderr, flush=True)

    def before_instantiate_classes(self) -> None:
        cfg = self.config.get(self.subcommand) if self.subcommand else self.config
        trainer = cfg.trainer
        if trainer.get("enable_progress_bar") is False:
            return
        callbacks = list(trainer.get("callbacks") or [])
        if not any("ProgressBar" in str(getattr(c, "class_path", c)) for c in callbacks):
            callbacks.append(Namespace(class_path="mutual_rl.callbacks.progress.StepProgressBar", init_args=Namespace()))
            trainer.callbacks = callbacks

    def _run_subcommand(self, subcommand: str) -> None:
        start_running()  # configuration is done: errors from here on are run-time errors
        super()._run_subcommand(subcommand)

    def instantiate_trainer(self, **kwargs):
        trainer = super().instantiate_trainer(**kwargs)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default, not a user's plugin
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer


def _resolve_last(cfg) -> str | None:
    """``--ckpt_path last``: the newest ``last.ckpt`` of the run, printed; none found: a printed warning and a start
    from scratch (Lightning's behaviour), or with ``--resume_required true`` the error naming where it looked."""
    try:
        ckpt_path = str(find_last_checkpoint(cfg.trainer))
    except FileNotFoundError as exc:
        if cfg.get("resume_required"):
            raise
        ckpt_path = None
        print(f"mutual-rl: warning: {exc.args[0].split('. Give')[0]}; starting from scratch, as Lightning does "
              "(--resume_required true makes this an error).", file=sys.stderr, flush=True)
    else:
        print(f"mutual-rl: --ckpt_path last -> {ckpt_path}", file=sys.stderr, flush=True)
    cfg.ckpt_path = ckpt_path
    return ckpt_path


def _unsupported_optimizer_option(argv: list[str]) -> str | None:
    """The first ``--optimizer`` / ``--lr_scheduler`` option in ``argv``, or such a top-level key of a config file
    given with ``--config`` / ``-c`` (as ``optimizer`` / ``lr_scheduler``); None if there is none."""
    for i, token in enumerate(argv):
        flag, _, value = token.partition("=")
        if any(flag == u or flag.startswith(u + ".") for u in _UNSUPPORTED):
            return flag
        if flag in ("--config", "-c"):
            path = Path(value or (argv[i + 1] if i + 1 < len(argv) else ""))
            try:
                loaded = yaml.safe_load(path.read_text()) if path.is_file() else None
            except (OSError, yaml.YAMLError):
                loaded = None  # jsonargparse reports unreadable config files itself
            for key in ("optimizer", "lr_scheduler"):
                if isinstance(loaded, dict) and key in loaded:
                    return f"{key} (in {path})"
    return None


def build_cli(args=None, run: bool = True) -> MutualRLCLI:
    """The ``mutual-rl`` CLI on ``args`` (default: ``sys.argv``); with ``run=False`` only parsed and instantiated."""
    return MutualRLCLI(
        MutualRLModule,
        PromptDataModule,
        trainer_defaults=TRAINER_DEFAULTS,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"description": "Mutual RL: train heterogeneous LLM policies together with GRPO. Subcommands: "
                                      "fit, validate; and `mutual-rl compare` (the regime comparison: mutual-rl "
                                      "compare --help)."},
    )


def main(args=None) -> None:
    """``mutual-rl``: ``compare`` (the regime comparison, :mod:`mutual_rl.compare.cli`) or LightningCLI's
    ``fit`` / ``validate``. Run as the command (``args`` None), an error is one paragraph and exit status 2 for a
    configuration error, 1 for an error mutual-rl raises on purpose (:mod:`mutual_rl.cli_errors`; the traceback
    with ``MUTUAL_RL_DEBUG=1``); called with ``args``, the exception is raised."""
    argv = sys.argv[1:] if args is None else args
    if isinstance(argv, (list, tuple)) and argv[:1] in (["compare"], ("compare",)):
        _compare(list(argv[1:]))
        return
    try:
        if args is None:  # the console command: errors as one paragraph, exit 2 for configuration errors
            report_errors(build_cli, argv)
        else:  # called from Python: the exceptions themselves
            build_cli(args)
    finally:
        close_all()  # vLLM engines tear down their groups first (rollout/vllm.py)
        destroy_process_group()  # a live gloo group can abort the exit of a finished multi-process run


def _compare(argv: list[str]) -> None:
    """``mutual-rl compare ...``: dispatched before LightningCLI, which knows only ``fit`` and ``validate``."""
    from mutual_rl.compare.cli import main as compare_main

    compare_main(argv)


if __name__ == "__main__":
    main()
