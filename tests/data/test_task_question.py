import dataclasses
import re

import pytest

from mutual_rl.data.task import BOXED_TEMPLATE, INTEGER_TEMPLATE, ArithmeticTask
from mutual_rl.data.word_problems import TEMPLATE, WordProblemTask
from mutual_rl.rewards import boxed_integer_match, integer_match
from mutual_rl.types import Problem

TASK = {"operators": ["+", "-", "*"], "digits": 2, "num_train": 900, "num_heldout": 50}
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def chat_tokenizer():
    """A local character-level tokenizer with a chat template (no downloads)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<|end|>": 1}
    for i in range(32, 127):
        vocab[chr(i)] = len(vocab)
    vocab["\n"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", unk_token="<unk>")
    out.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>"]})
    out.chat_template = CHAT
    return out


def test_question_text_same_pairs_ids_and_splits():
    compact, question = ArithmeticTask(**TASK), ArithmeticTask(**TASK, style="question")
    assert question._problem("+", 2 * 90 + 24) == Problem(100120034, "What is 12 + 34?", "46", "add")
    for split in ("train", "heldout"):
        c, q = compact.problems(split), question.problems(split)
        assert [(p.prompt_id, p.answer, p.skill) for p in c] == [(p.prompt_id, p.answer, p.skill) for p in q]
        for pc, pq in zip(c, q):
            a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", pq.problem).groups()
            assert pc.problem == f"{a}{op}{b}="
    assert question.problems("heldout", ["mul"])[0].problem.startswith("What is ")
    assert compact.problems("train")[0].problem.endswith("=")  # compact unchanged (tests/data/test_task.py)
    assert dataclasses.asdict(question)["style"] == "question"


def test_default_reward_and_target_per_style_and_format():
    p = Problem(100120034, "What is 12 + 34?", "46", "add")
    rewards = {(s, f): ArithmeticTask(style=s, answer_format=f).default_reward
               for s in ("compact", "question") for f in ("integer", "boxed")}
    assert rewards == {("compact", "integer"): "integer_match", ("compact", "boxed"): "boxed_integer_match",
                       ("question", "integer"): "integer_match", ("question", "boxed"): "boxed_integer_match"}
    assert ArithmeticTask(style="question").target_text(p) == "46"
    assert ArithmeticTask(style="question", answer_format="boxed").target_text(p) == "\\boxed{46}"
    assert integer_match("46", "46") == boxed_integer_match("\\boxed{46}", "46") == 1.0
    with pytest.raises(ValueError, match="style must be 'compact'.*or 'question'"):
        ArithmeticTask(style="chat")


@pytest.mark.parametrize(("completion", "expected"), [
    ("\\boxed{46}", 1.0), ("46", 1.0), ("12 + 34 = 46, so \\boxed{46}", 1.0), ("\\boxed{46.0}", 1.0),
    ("\\boxed{45}", 0.0), ("45", 0.0), ("12 + 34 = 46, so \\boxed{47}", 0.0),
])
def test_math_verify_on_question_answers(completion, expected):
    pytest.importorskip("math_verify")
    from mutual_rl.rewards import math_verify

    assert math_verify(completion, "46") == expected


@pytest.mark.parametrize("which", ["arithmetic", "word"])
def test_renders_through_a_chat_template(which):
    from mutual_rl.model.spec import PolicySpec
    from mutual_rl.thl.retokenize import prompt_ids

    tok = chat_tokenizer()
    if which == "arithmetic":
        task, template = ArithmeticTask(**TASK, style="question", answer_format="boxed"), BOXED_TEMPLATE
    else:
        task, template = WordProblemTask(num_train=30, num_heldout=2), TEMPLATE
    spec = PolicySpec(name="chat", model="local", prompt_template=template, chat_template=True)
    for p in task.heldout_problems()[:5]:
        user = spec.render_prompt(p.problem)
        assert user.startswith(p.problem) and user.endswith(" in \\boxed{}.")
        ids = prompt_ids(tok, user, chat_template=True)
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == f"<|user|>\n{user}<|end|>\n<|assistant|>\n"
        assert ids[0] == tok.convert_tokens_to_ids("<|user|>")
        assert ids[-2:] == [tok.convert_tokens_to_ids("<|assistant|>"), tok.convert_tokens_to_ids("\n")]
    assert INTEGER_TEMPLATE.replace("{problem}", "What is 1 + 2?") == "What is 1 + 2? Answer with only the number."


def test_every_character_is_in_the_tiny_char_vocabulary():
    from mutual_rl.presets.tokenizers import CHAR_ALPHABET

    texts = [p.problem for p in ArithmeticTask(**TASK, style="question").heldout_problems()]
    word = WordProblemTask(num_train=600, num_heldout=20)
    texts += [p.problem + word.target_text(p) for p in word.train_problems() + word.heldout_problems()]
    texts += [BOXED_TEMPLATE, TEMPLATE]
    assert set("".join(texts)) <= set(CHAR_ALPHABET)


@pytest.mark.parametrize("hack", ["12 + 34 = \\boxed{}", "\\boxed{12+34}", "12 + 34 ="])
def test_restating_the_question_does_not_score_with_the_default_reward(hack):
    """math-verify reads the question's own expression as the answer (an empty box, or the sum in the box), which
    GRPO found on SmolLM2 within 40 steps; the default reward of question-style boxed arithmetic does not."""
    pytest.importorskip("math_verify")
    from mutual_rl.rewards import get_reward, math_verify

    assert math_verify(hack, "46") == 1.0  # why math_verify is not the default here
    reward = get_reward(ArithmeticTask(style="question", answer_format="boxed").default_reward)
    assert reward(hack, "46") == 0.0 and reward("12 + 34 = 46, so \\boxed{46}", "46") == 1.0
