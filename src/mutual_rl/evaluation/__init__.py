"""Evaluation: pass@k, maj@k, greedy accuracy, complementarity; held-out evaluation and benchmark files."""

from mutual_rl.evaluation.answers import answer_extractor
from mutual_rl.evaluation.benchmarks import evaluate_file, evaluate_problems
from mutual_rl.evaluation.complementarity import complementarity
from mutual_rl.evaluation.greedy import greedy_generate
from mutual_rl.evaluation.metrics import (
    ComplementarityCounts,
    PassAtK,
    ProblemCount,
    ProblemMean,
    majority_correct,
    mean_pass_at_k,
    pass_at_k,
)
from mutual_rl.evaluation.validation import EvalConfig, Evaluator

__all__ = [
    "ComplementarityCounts", "EvalConfig", "Evaluator", "PassAtK", "ProblemCount", "ProblemMean", "answer_extractor",
    "complementarity", "evaluate_file", "evaluate_problems", "greedy_generate", "majority_correct", "mean_pass_at_k",
    "pass_at_k",
]
