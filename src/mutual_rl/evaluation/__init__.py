"""Evaluation: pass@k, maj@k, held-out evaluation."""

from mutual_rl.evaluation.metrics import majority_correct, mean_pass_at_k, pass_at_k
from mutual_rl.evaluation.validation import EvalConfig, Evaluator

__all__ = ["EvalConfig", "Evaluator", "majority_correct", "mean_pass_at_k", "pass_at_k"]
