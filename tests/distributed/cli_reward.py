"""A reward for the multi-process CLI tests, given as ``model.reward: tests.distributed.cli_reward:parity`` (the
ranks are separate processes, so an in-process registration would not reach them)."""


def parity(completion: str, answer: str) -> float:
    """1 for an even-length completion: mixed groups, hence a learning signal, from any policy."""
    return float(len(completion) % 2 == 0)
