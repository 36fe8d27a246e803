"""Prompts for training and held-out evaluation: the built-in task, JSONL/Parquet files, or Hugging Face datasets.

Per split, one source: ``train_files`` or ``train_dataset`` (else the task's train split), ``val_files`` or
``val_dataset`` (else the task's held-out split, or none when the training prompts come from files or a dataset).
Giving both a files list and a dataset for one split is an error.

Held-out evaluation is turned off with ``trainer.limit_val_batches: 0`` (no evaluation before the first step nor
during training). Otherwise an empty held-out set is an error at set-up naming its source (``data.val_files`` that
hold no row, a ``data.val_dataset`` with no row, a task with ``num_heldout: 0``), and ``data.val_per_skill`` must be
>= 1 (or null: every held-out prompt); training prompts from files or a dataset with no held-out source is the
one case without evaluation, and it warns once. Rows of files and datasets follow the rules of
:mod:`mutual_rl.data.files` and :mod:`mutual_rl.data.hf_datasets` (one column mapping, ``problem_key`` /
``answer_key`` / ``skill_key`` / ``answer_regex``, for every source); training rows are numbered from 10**9,
held-out rows from 2 * 10**9.

Training draws an endless, seeded stream of prompt batches: epoch ``e`` is a permutation of the training problems
(seed ``(seed, e)``), batch ``i`` is the ``i``-th slice of ``batch_size * world_size`` across epoch boundaries,
and rank ``r`` of a multi-process run (FSDP/DDP) trains on its ``r``-th ``batch_size`` part of it -- so
``batch_size`` is prompts per process and step, as in Lightning, and ranks never see the same prompt in a step. A
Lightning epoch is ``len(train) // (batch_size * world_size)`` batches of that stream. The stream
position is the module's to report (:meth:`PromptDataModule.mark_consumed`), so a checkpoint resumes at exactly
the next unseen batch even though Lightning prefetches one batch ahead.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, IterableDataset

from mutual_rl.data.chain import ChainTask
from mutual_rl.data.files import compile_answer_regex, load_problems
from mutual_rl.data.hf_datasets import HFDataset, as_hf_dataset, load_dataset_problems
from mutual_rl.data.task import ArithmeticTask
from mutual_rl.data.word_problems import WordProblemTask
from mutual_rl.types import Problem, PromptBatch


class _PromptStream(IterableDataset):
    def __init__(self, dm: PromptDataModule):
        self.dm = dm

    def __iter__(self) -> Iterator[PromptBatch]:
        # One Lightning "epoch" is one pass over the training problems; resuming mid-epoch yields its rest.
        length = len(self)
        start = self.dm.next_batch
        rank, world = self.dm.rank_and_world()
        for index in range(start, (start // length + 1) * length):
            problems = self.dm.train_batch(index, rank=rank, world_size=world)
            yield PromptBatch(index, problems, offset=(index * world + rank) * self.dm.batch_size)

    def __len__(self) -> int:
        return max(1, len(self.dm.train_problems()) // (self.dm.batch_size * self.dm.rank_and_world()[1]))


class _Batches(IterableDataset):
    def __init__(self, problems: list[Problem], batch_size: int):
        self.problems, self.batch_size = problems, batch_size

    def __iter__(self) -> Iterator[PromptBatch]:
        for i, start in enumerate(range(0, len(self.problems), self.batch_size)):
            yield PromptBatch(i, self.problems[start : start + self.batch_size])

    def __len__(self) -> int:
        return -(-len(self.problems) // self.batch_size)


class PromptDataModule(LightningDataModule):
    def __init__(
        self,
        task: ArithmeticTask | WordProblemTask | ChainTask | None = None,
        train_files: list[str] | None = None,
        val_files: list[str] | None = None,
        train_dataset: HFDataset | None = None,
        val_dataset: HFDataset | None = None,
        problem_key: str = "problem",
        answer_key: str = "answer",
        skill_key: str | None = None,
        answer_regex: str = "",
        batch_size: int = 16,
        val_batch_size: int = 256,
        val_per_skill: int | None = None,
        seed: int = 0,
    ):
        """
        Args:
            task: a built-in task, ArithmeticTask, WordProblemTask or ChainTask (worked solutions; benchmark v4) (used when no train_files or train_dataset are given; default
                settings if omitted).
            train_files: JSONL/Parquet prompt files (fields problem/answer, names configurable); when
                given they replace the task's train split.
            val_files: held-out prompt files; default: the task's held-out split.
            train_dataset: training prompts from Hugging Face datasets instead of train_files, e.g. {path:
                openai/gsm8k, name: main, split: train}.
            val_dataset: held-out prompts from Hugging Face datasets instead of val_files.
            problem_key: field holding the problem text in the files and datasets.
            answer_key: field holding the gold answer in the files and datasets.
            skill_key: optional field naming the skill (evaluation reports pass@1 per skill).
            answer_regex: if set, the answer is this pattern's first group in the answer field (GSM8K:
                '####\\s*(.+)').
            batch_size: prompts per training step.
            val_batch_size: prompts per evaluation batch.
            val_per_skill: evaluate on at most this many held-out prompts per skill, >= 1 (default: all). To turn
                evaluation off set trainer.limit_val_batches: 0.
            seed: seed of the training order.
        """
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be >= 1 (got {batch_size}).")
        if val_batch_size < 1:
            raise ValueError(f"data.val_batch_size must be >= 1 (got {val_batch_size}).")
        if val_per_skill is not None and (isinstance(val_per_skill, bool) or val_per_skill < 1):
            raise ValueError(f"data.val_per_skill must be >= 1, or null for every held-out prompt (got "
                             f"{val_per_skill!r}): with it no held-out prompt would be evaluated. To turn evaluation "
                             "off, set trainer.limit_val_batches: 0.")
        for split, files, dataset in (("train", train_files, train_dataset), ("val", val_files, val_dataset)):
            if files and dataset is not None:
                raise ValueError(f"data.{split}_files and data.{split}_dataset are both given: choose one source "
                                 f"for the {split} prompts.")
        self.train_dataset = as_hf_dataset(train_dataset) if train_dataset is not None else None
        self.val_dataset = as_hf_dataset(val_dataset) if val_dataset is not None else None
        own_train = bool(train_files) or self.train_dataset is not None
        self.task = task if task is not None or own_train else ArithmeticTask()
        self.train_files, self.val_files = list(train_files or []), list(val_files or [])
        self.keys = {"problem_key": problem_key, "answer_key": answer_key, "skill_key": skill_key,
                     "answer_regex": compile_answer_regex(answer_regex or None)}
        self.batch_size, self.val_batch_size, self.val_per_skill = batch_size, val_batch_size, val_per_skill
        self.seed = seed
        self.next_batch = 0
        self._train: list[Problem] | None = None
        self._val: list[Problem] | None = None
        self._epoch_orders: dict[int, list[int]] = {}

    # ----------------------------------------------------------------------------------------------- problems
    def train_problems(self) -> list[Problem]:
        if self._train is None:
            if self.train_dataset is not None:
                self._train = load_dataset_problems(self.train_dataset, id_offset=10**9, label="data.train_dataset",
                                                    **self.keys)
            elif self.train_files:
                self._train = self._load(self.train_files, 10**9)
            else:
                self._train = self.task.train_problems()
            if not self._train:
                raise ValueError("the training set is empty; check data.task, data.train_files or data.train_dataset.")
        return self._train

    def val_problems(self) -> list[Problem]:
        """The held-out problems (``val_per_skill`` per skill at most); an empty set is an error naming its source
        unless evaluation is off (module docstring)."""
        if self._val is None:
            if self.val_dataset is not None:
                val = load_dataset_problems(self.val_dataset, id_offset=2 * 10**9, label="data.val_dataset",
                                            **self.keys)
                source = f"data.val_dataset {self.val_dataset.describe()} has no row"
            elif self.val_files:
                val = self._load(self.val_files, 2 * 10**9)
                source = f"data.val_files {self.val_files} hold no row"
            elif self.task is not None:
                val = self.task.heldout_problems()
                source = (f"data.task ({type(self.task).__name__}) has no held-out problem (num_heldout: "
                          f"{getattr(self.task, 'num_heldout', '?')})")
            else:
                val, source = [], None
            if self.val_per_skill is not None:
                seen: dict[str, int] = {}
                kept = []
                for p in val:
                    seen[p.skill] = seen.get(p.skill, 0) + 1
                    if seen[p.skill] <= self.val_per_skill:
                        kept.append(p)
                val = kept
            if not val and not self._evaluation_off():
                if source is not None:
                    raise ValueError(f"the held-out set is empty: {source}, so no evaluation would run. Give "
                                     "held-out prompts, or turn evaluation off with trainer.limit_val_batches: 0.")
                warnings.warn("no held-out prompts: the training prompts come from data.train_files or "
                              "data.train_dataset and neither data.val_files nor data.val_dataset is set, so no "
                              "evaluation runs. Set one of them, or trainer.limit_val_batches: 0 to say so.",
                              UserWarning, stacklevel=2)
            self._val = val
        return self._val

    def _evaluation_off(self) -> bool:
        """Whether the attached trainer evaluates nothing (``limit_val_batches: 0``); False without a trainer."""
        trainer = getattr(self, "trainer", None)
        return trainer is not None and getattr(trainer, "limit_val_batches", None) == 0

    def _load(self, files: list[str], offset: int) -> list[Problem]:
        out: list[Problem] = []
        for path in files:
            out += load_problems(path, id_offset=offset + len(out), **self.keys)
        return out

    def rank_and_world(self) -> tuple[int, int]:
        """(this process's global rank, number of processes) of the attached trainer; (0, 1) without one."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), max(int(trainer.world_size), 1)

    def train_batch(self, index: int, rank: int = 0, world_size: int = 1) -> list[Problem]:
        """Rank ``rank``'s part of batch ``index`` of the endless training stream (pure function of seed, index,
        rank and world size); ``world_size = 1`` gives the whole batch."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, {world_size}).")
        problems = self.train_problems()
        n = len(problems)
        out = []
        start = (index * world_size + rank) * self.batch_size
        for flat in range(start, start + self.batch_size):
            epoch, pos = divmod(flat, n)
            out.append(problems[self._order(epoch)[pos]])
        return out

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._epoch_orders:
            order = list(range(len(self.train_problems())))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._epoch_orders = {epoch: order}  # keep only the current epoch
        return self._epoch_orders[epoch]

    # ------------------------------------------------------------------------------------------- Lightning
    def train_dataloader(self) -> DataLoader:
        return DataLoader(_PromptStream(self), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_Batches(self.val_problems(), self.val_batch_size), batch_size=None)

    def mark_consumed(self, index: int) -> None:
        """The module trained on batch ``index``; a checkpoint taken now resumes at ``index + 1``."""
        self.next_batch = index + 1

    def state_dict(self) -> dict:
        return {"next_batch": self.next_batch, "seed": self.seed, "prompts_per_batch":
                self.batch_size * self.rank_and_world()[1]}

    def load_state_dict(self, state: dict) -> None:
        """Resume at the next unseen prompt. When the global batch (``batch_size`` x processes) changed since the
        checkpoint, the stream position is converted through the number of prompts consumed, rounded up to a
        whole batch: at most one batch worth of prompts is skipped, none is repeated."""
        per = int(state.get("prompts_per_batch", self.batch_size * self.rank_and_world()[1]))
        now = self.batch_size * self.rank_and_world()[1]
        consumed = int(state["next_batch"]) * per
        self.next_batch = -(-consumed // now)
