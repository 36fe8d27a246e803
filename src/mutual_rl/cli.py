"""``mutual-rl``: the LightningCLI entry point (``fit``, ``validate``, ``--help``, ``--print_config``)."""

from __future__ import annotations

from jsonargparse import Namespace, set_parsing_settings
from lightning.pytorch.cli import LightningCLI

from mutual_rl.data.datamodule import PromptDataModule
from mutual_rl.module import MutualRLModule

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


class MutualRLCLI(LightningCLI):
    """LightningCLI for :class:`MutualRLModule` and :class:`PromptDataModule`; a rich progress bar by default."""

    def before_instantiate_classes(self) -> None:
        cfg = self.config.get(self.subcommand) if self.subcommand else self.config
        trainer = cfg.trainer
        if trainer.get("enable_progress_bar") is False:
            return
        callbacks = list(trainer.get("callbacks") or [])
        if not any("ProgressBar" in str(getattr(c, "class_path", c)) for c in callbacks):
            callbacks.append(Namespace(class_path="lightning.pytorch.callbacks.RichProgressBar", init_args=Namespace()))
            trainer.callbacks = callbacks


def main(args=None) -> None:
    MutualRLCLI(
        MutualRLModule,
        PromptDataModule,
        trainer_defaults=TRAINER_DEFAULTS,
        args=args,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"description": "Mutual RL: train heterogeneous LLM policies together with GRPO."},
    )


if __name__ == "__main__":
    main()
