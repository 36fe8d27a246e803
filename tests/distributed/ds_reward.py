"""A group reward for the two-rank dynamic-sampling test, given as ``tests.distributed.ds_reward:by_answer`` (the
ranks are separate processes): a prompt whose answer is a multiple of 3 gets ``[1, 0, ..., 0]`` (mixed), any other
all zeros (zero variance), whatever was sampled."""


def by_answer(prompts, completions, answer):
    n = len(completions)
    return [1.0] + [0.0] * (n - 1) if int(answer[0]) % 3 == 0 else [0.0] * n
