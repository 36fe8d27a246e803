"""A reward whose module takes 1.5 s to import (as a module that imports torch does): standard library only."""

import time

time.sleep(1.5)


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def exact_trl(prompts, completions, answer, **_) -> list[float]:
    return [float(c.strip() == a) for c, a in zip(completions, answer)]
