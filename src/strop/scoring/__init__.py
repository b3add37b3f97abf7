"""Scoring: graders that turn a completion into a reward, and weighted sums of them.

    >>> from strop.scoring import load_grader, terms_from_spec, score_terms
    >>> grade = load_grader("builtin:gsm8k")             # or "./scoring#reward:compute_score"
    >>> grade(solution_str="... #### 18", ground_truth="... #### 18")
    1.0
    >>> terms = terms_from_spec([{"grader": "builtin:gsm8k"}, {"grader": "builtin:gsm8k-format", "weight": 0.1}])
    >>> score_terms(terms, "#### 18", row).total          # row: anything with question, answer, extra
    1.1
"""

from strop.scoring.bundles import load_grader
from strop.scoring.checks import check_bundle, check_bundle_folder
from strop.scoring.terms import RewardTerm, TermScores, score_terms, terms_from_spec

__all__ = ["load_grader", "check_bundle", "check_bundle_folder", "RewardTerm", "TermScores", "score_terms", "terms_from_spec"]
