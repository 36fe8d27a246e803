"""Prompts: the built-in arithmetic task, JSONL/Parquet prompt files and the Lightning data module."""

from mutual_rl.data.files import SUPPORTED_EXTENSIONS, load_problems
from mutual_rl.data.task import SKILLS, ArithmeticTask
from mutual_rl.types import Problem

__all__ = ["SKILLS", "SUPPORTED_EXTENSIONS", "ArithmeticTask", "Problem", "load_problems"]
