"""The settings of one comparison (what ``mutual-rl compare`` parsed), read by the runner and the report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mutual_rl.compare.labels import BENCHMARKS, DEFAULT_LABELS, LABELS
from mutual_rl.config_files import load_config

ConfigReader = Callable[[Path], dict]
"""reads a config file as ``mutual-rl fit --config`` does (its ``base:`` chain merged): by default
:func:`mutual_rl.config_files.load_config`"""


@dataclass
class Settings:
    """One comparison: its name, labels, seeds and run budget, where its results go, and the command line."""

    name: str = "embedded"
    regimes: list[str] = field(default_factory=lambda: list(DEFAULT_LABELS))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    steps: int = 300
    val_every: int = 100
    val_per_skill: int = 400
    k: int = 8
    last_k: int = 2
    ckpt_every: int = 50
    parallel: int = 2
    threads: int = 1
    results: Path = Path("results")
    warmstart_steps: int | None = None
    smoke: bool = False
    benchmark: str = "v3"
    """the benchmark (``labels.BENCHMARKS``): v3, the labels' configs as shipped; v4, configs/v4.yaml over each"""
    command: str = "mutual-rl compare"
    """the command line as typed (written into table.md)"""
    read_config: ConfigReader = load_config
    """how a config file is read (:data:`ConfigReader`)"""

    def __post_init__(self) -> None:
        self.regimes = list(dict.fromkeys(self.regimes))
        unknown = [lab for lab in self.regimes if lab not in LABELS]
        if unknown:
            raise SystemExit(f"[compare] unknown label(s) {', '.join(unknown)}; the labels: {', '.join(LABELS)}")
        if self.benchmark not in BENCHMARKS:
            raise SystemExit(f"[compare] unknown benchmark {self.benchmark!r}; the benchmarks: {', '.join(BENCHMARKS)}")
        self.seeds = [int(s) for s in self.seeds]
        self.results = Path(self.results)
        if self.smoke:  # 2 steps, 1 seed, tiny warm-up and evaluation
            self.steps, self.val_every, self.val_per_skill, self.k, self.ckpt_every = 2, 1, 8, 2, 1
            self.seeds = self.seeds[:1]

    def reader(self) -> ConfigReader:
        """:attr:`read_config`."""
        return self.read_config

    @property
    def root(self) -> Path:
        """``<results>/<name>``, absolute (the run configs hold absolute paths)."""
        return (self.results / self.name).absolute()
