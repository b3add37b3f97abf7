"""GSM8K scoring bundle: reward a completion whose final `#### N` line holds the gold answer.

    compute_score(solution_str="... so 48 + 24 = 72.\\n#### 72", ground_truth="...\\n#### 72")   # 1.1
    compute_score(solution_str="#### 71", ground_truth="...\\n#### 72")                          # 0.1
    compute_score(solution_str="The answer is 72.", ground_truth="...\\n#### 72")                # 0.0

The score is the sum of two terms:
  format   0.1 when the completion ends its reasoning with a `#### N` line at all;
  correct  1.0 more when that N (the last marked number) equals the gold answer's last `#### N`.

Used both as the run's reward and as the evaluation grader (`bundle:gsm8k/scoring#reward:compute_score`), with
the signature verl uses, so the same function judges training and the finished model. Standard library only:
a bundle runs wherever the trainer or evaluator runs.
"""

import re
from fractions import Fraction

# The format term is a tenth of the correctness term. It has to exist: an untuned model may answer no problem
# right, and when every completion in a group scores the same, GRPO's group advantage is zero and nothing is
# learnt. Rewarding the `#### N` line separates well-formed from rambling completions and gives a first
# gradient. It has to be small: a completion that only emits the marker (0.1) must always score far below one
# that answers correctly (1.1), so the model cannot settle for form over substance.
FORMAT_SCORE = 0.1
CORRECT_SCORE = 1.0

# "#### 1,234", "####-3", "#### 0.5": a number must follow the marker directly (spaces aside), so a Markdown
# heading such as "#### Step 2" is not taken for an answer. Thousands commas are allowed and dropped.
_MARKED = re.compile(r"####[ \t]*(-?\d[\d,]*(?:\.\d+)?)")
_BARE_NUMBER = re.compile(r"\s*(-?\d[\d,]*(?:\.\d+)?)\s*")


def final_answer(text):
    """The number on the last `#### N` in `text`, exactly (as a Fraction), or None when there is none."""
    found = _MARKED.findall(text or "")
    return _number(found[-1]) if found else None


def gold_answer(ground_truth):
    """The gold number: the last `#### N` of a GSM8K answer, or the whole value when it is a bare number."""
    if isinstance(ground_truth, (int, float)) and not isinstance(ground_truth, bool):
        return _number(str(ground_truth))
    answer = final_answer(ground_truth if isinstance(ground_truth, str) else None)
    if answer is None and isinstance(ground_truth, str):
        bare = _BARE_NUMBER.fullmatch(ground_truth)
        answer = _number(bare.group(1)) if bare else None
    return answer


def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
    answered = final_answer(solution_str)
    if answered is None:
        return 0.0
    expected = gold_answer(ground_truth)
    if expected is not None and answered == expected:
        return FORMAT_SCORE + CORRECT_SCORE
    return FORMAT_SCORE


def _number(text):
    # Fractions compare exactly, so "72", "72.0" and "72.00" are one answer and no float rounding sneaks in.
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
