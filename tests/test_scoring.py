"""Scoring: the GSM8K grader, grader references and bundles, and weighted reward terms."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import pytest

from strop.data import Row
from strop.errors import BundleError, StropError
from strop.scoring import RewardTerm, TermScores, check_bundle, load_grader, score_terms, terms_from_spec
from strop.scoring.gsm8k import compute_score, extract_answer, format_score, gold_answer

# --- extract_answer ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("She makes 9 * 2 = 18 dollars.\n#### 18", "18"),
    ("####18", "18"),
    ("#### **18**", "18"),
    ("The answer is \\boxed{18}.", "18"),
    ("\\boxed{\\$18}", "18"),
    ("\\boxed{18\\%}", "18"),
    ("\\boxed{18 \\text{ dollars}}", "18"),
    ("\\boxed{1{,}234}", "1234"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("\\boxed{{18}}", "18"),
    ("#### 1,234", "1234"),
    ("#### $1,234.00", "1234"),
    ("It costs $18.", "18"),
    ("so the answer is 18.", "18"),
    ("18.0", "18"),
    ("0.50", "0.5"),
    ("The temperature is -5 degrees", "-5"),
    ("#### -5", "-5"),
    ("\\boxed{-12}", "-12"),
    ("x = \u22127", "-7"),
    ("pages 3-4", "4"),
    ("She has 12 apples left", "12"),
    ("1,2,3", "3"),
    ("I have 1,234,567 grains.", "1234567"),
])
def test_extract_answer_formats(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("#### 10 ... no wait, \\boxed{12}", "12"),
    ("\\boxed{12} ... actually\n#### 10", "10"),
    ("#### 5\n#### 6", "6"),
    ("\\boxed{5} then \\boxed{7} and 99 more words", "7"),
    ("#### 5 and then 99 more numbers 100", "5"),
])
def test_last_marked_answer_counts(text, expected):
    assert extract_answer(text) == expected


def test_markdown_heading_is_not_an_answer_marker():
    assert extract_answer("#### Step 1: add\n3 + 4 = 7") == "7"
    assert extract_answer("\\boxed{A} so 7 it is") == "7"


@pytest.mark.parametrize("text", [None, "", "no number here", "#### ", "\\boxed{}"])
def test_no_number_extracts_nothing(text):
    assert extract_answer(text) is None


# --- compute_score / format_score ------------------------------------------------------------------------

GOLD = "Janet sells 16 - 3 - 4 = 9 duck eggs a day.\nShe makes 9 * 2 = $18 every day.\n#### 18"


@pytest.mark.parametrize("completion, score", [
    ("#### 18", 1.0),
    ("So she makes \\boxed{18} dollars.", 1.0),
    ("She makes $18.00 per day.", 1.0),
    ("18.", 1.0),
    ("#### 18 dollars", 1.0),
    ("#### 17", 0.0),
    ("#### 18 ... wait, \\boxed{19}", 0.0),
    ("I do not know", 0.0),
    ("", 0.0),
    (None, 0.0),
])
def test_compute_score(completion, score):
    assert compute_score(data_source="openai/gsm8k", solution_str=completion, ground_truth=GOLD, extra_info={}) == score


@pytest.mark.parametrize("ground_truth, gold", [
    (GOLD, "18"),
    ("reasoning with 5 and 7\n#### 1,234", "1234"),
    ("#### 3 #### 4", "4"),
    ("#### -2", "-2"),
    ("42", "42"),
    ("$1,000", "1000"),
    (7, "7"),
    ("#### 2.50", "2.5"),
])
def test_gold_parsing(ground_truth, gold):
    assert gold_answer(ground_truth) == gold
    assert compute_score(solution_str=f"#### {gold}", ground_truth=ground_truth) == 1.0


@pytest.mark.parametrize("ground_truth", [None, "no answer", "text #### none"])
def test_unusable_gold_raises_with_a_fix(ground_truth):
    with pytest.raises(ValueError, match="#### N"):
        compute_score(solution_str="#### 1", ground_truth=ground_truth)


def test_numeric_equality_not_string_equality():
    assert compute_score(solution_str="#### 1234.000", ground_truth="#### 1,234") == 1.0
    assert compute_score(solution_str="#### 0.1", ground_truth="#### 0.10000001") == 1.0
    assert compute_score(solution_str="#### 0.1", ground_truth="#### 0.1001") == 0.0


def test_format_score():
    assert format_score(solution_str="so #### 4") == 1.0
    assert format_score(solution_str="\\boxed{4}") == 1.0
    assert format_score(solution_str="the answer is 4") == 0.0
    assert format_score(solution_str="#### Step 1") == 0.0
    assert format_score(solution_str=None) == 0.0


# --- load_grader: built-ins and bundles -----------------------------------------------------------------

def test_builtin_graders():
    assert load_grader("builtin:gsm8k") is compute_score
    assert load_grader("builtin:gsm8k-format") is format_score
    with pytest.raises(BundleError) as e:
        load_grader("builtin:math")
    assert "builtin:gsm8k" in str(e.value) and "builtin:gsm8k-format" in str(e.value)
    with pytest.raises(BundleError, match="empty"):
        load_grader("  ")


def make_bundle(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text), encoding="utf-8")
    return root


GOOD = {
    "helpers.py": "def last_word(s):\n    return s.split()[-1]\n",
    "reward.py": """
        from helpers import last_word

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            return 1.0 if last_word(solution_str) == ground_truth else 0.0

        def lenient(**kwargs):
            return 0.5
    """,
}


def call(fn, completion="it is yes", truth="yes"):
    return fn(data_source=None, solution_str=completion, ground_truth=truth, extra_info={})


def test_directory_bundle_with_sibling_import(tmp_path):
    root = make_bundle(tmp_path / "scoring", GOOD)
    for ref in (str(root), f"{root}#reward", f"{root}#reward:compute_score", f"bundle:{root}#reward:compute_score"):
        fn = load_grader(ref)
        assert call(fn) == 1.0 and call(fn, "it is no") == 0.0
    assert call(load_grader(f"{root}#reward:lenient")) == 0.5


def test_bundles_with_same_sibling_names_do_not_collide(tmp_path):
    reward = "from helpers import VALUE\ndef compute_score(**kw):\n    return VALUE\n"
    a = make_bundle(tmp_path / "a", {"helpers.py": "VALUE = 1.0\n", "reward.py": reward})
    b = make_bundle(tmp_path / "b", {"helpers.py": "VALUE = 0.25\n", "reward.py": reward})
    assert call(load_grader(str(a))) == 1.0
    assert call(load_grader(str(b))) == 0.25


def test_a_bundle_imports_its_neighbours_relatively_in_packages_too(tmp_path):
    """The layouts reward code comes in: a package with relative imports (verl's graders live in one), a top-level
    module importing a neighbour relatively, and an import made inside the function. The folder's own __init__.py
    is not run (verl's reward_score/__init__.py imports every grader's dependencies)."""
    root = make_bundle(tmp_path / "scoring", {
        "__init__.py": "raise ImportError('not run')\n",
        "util.py": "def same(a, b):\n    return a.strip() == b.strip()\nSCALE = 0.5\n",
        "reward.py": "from . import util\nfrom .util import same\nSCALE = util.SCALE\n"
                     "def compute_score(solution_str=None, ground_truth=None, **kw):\n"
                     "    return SCALE * same(solution_str, ground_truth)\n",
        "pkg/__init__.py": "",
        "pkg/helpers.py": "def last(s):\n    return (s or '').split()[-1]\n",
        "pkg/grade.py": "from .helpers import last\nfrom ..util import same\n"
                        "def compute_score(solution_str=None, ground_truth=None, **kw):\n"
                        "    from .late import BONUS\n"
                        "    return float(same(last(solution_str), ground_truth)) + BONUS\n",
        "pkg/late.py": "BONUS = 0.25\n",
    })
    assert call(load_grader(f"{root}#reward"), "yes", "yes") == 0.5
    grade = load_grader(f"{root}#pkg.grade")
    assert call(grade, "it is yes") == 1.25 and call(grade, "it is no") == 0.25
    assert "pkg" not in sys.modules and "util" not in sys.modules


def test_bundle_sibling_wins_over_an_already_imported_module(tmp_path, monkeypatch):
    import types
    other = types.ModuleType("helpers")
    monkeypatch.setitem(sys.modules, "helpers", other)
    root = make_bundle(tmp_path / "scoring", GOOD)
    assert call(load_grader(str(root))) == 1.0
    assert sys.modules["helpers"] is other


def bundle_error(ref) -> str:
    with pytest.raises(BundleError) as e:
        load_grader(str(ref))
    assert isinstance(e.value, StropError)
    return str(e.value)


def test_missing_directory(tmp_path):
    msg = bundle_error(f"{tmp_path / 'nope'}#reward:compute_score")
    assert "does not exist" in msg and "nope" in msg and "reward.py" in msg


def test_file_instead_of_directory_suggests_the_ref(tmp_path):
    root = make_bundle(tmp_path / "scoring", GOOD)
    msg = bundle_error(root / "reward.py")
    assert "is a file, not a directory" in msg and f"{root}#reward" in msg


def test_missing_module_lists_python_files(tmp_path):
    root = make_bundle(tmp_path / "scoring", GOOD)
    msg = bundle_error(f"{root}#grader")
    assert "no module 'grader'" in msg and "helpers.py" in msg and "reward.py" in msg


def test_import_error_shows_the_traceback_tail(tmp_path):
    root = make_bundle(tmp_path / "broken", {"reward.py": "import math\n\nx = 1 / 0\n"})
    msg = bundle_error(root)
    assert "importing" in msg and "reward.py" in msg and "ZeroDivisionError" in msg and "line 3" in msg
    root = make_bundle(tmp_path / "syntax", {"reward.py": "def compute_score(:\n"})
    assert "SyntaxError" in bundle_error(root)
    root = make_bundle(tmp_path / "missing_dep", {"reward.py": "import not_a_module_xyz\n"})
    assert "not_a_module_xyz" in bundle_error(root)


def test_missing_function_lists_defined_functions(tmp_path):
    root = make_bundle(tmp_path / "scoring", GOOD)
    msg = bundle_error(f"{root}#reward:score")
    assert "no function 'score'" in msg and "compute_score" in msg and "lenient" in msg
    assert "last_word" not in msg  # imported, not defined there


def test_wrong_signature_shows_found_and_expected(tmp_path):
    root = make_bundle(tmp_path / "scoring", {"reward.py": """
        def compute_score(solution, truth):
            return 1.0

        compute = 3
    """})
    msg = bundle_error(root)
    assert "wrong signature" in msg and "compute_score(solution, truth)" in msg
    assert "compute_score(data_source, solution_str, ground_truth, extra_info=None)" in msg
    assert "not a function" in bundle_error(f"{root}#reward:compute")


def test_registry_bundles_need_the_control_plane():
    msg = bundle_error("bundle:gsm8k-strict#reward:compute_score")
    assert "control plane" in msg and "directory" in msg


def test_check_bundle_in_the_sandbox(tmp_path):
    good = make_bundle(tmp_path / "good", GOOD)
    assert check_bundle(good, "reward", "compute_score") is None
    assert check_bundle(good, "reward", "lenient") is None
    noisy = make_bundle(tmp_path / "noisy",
                        {"reward.py": "print('hello from import')\ndef compute_score(x):\n    return 1\n"})
    msg = check_bundle(noisy, "reward", "compute_score")
    assert msg.startswith("grader 'compute_score'") and "wrong signature" in msg and "hello" not in msg
    assert "no module 'grader'" in check_bundle(good, "grader", "compute_score")
    crash = make_bundle(tmp_path / "crash", {"reward.py": "import os\nos._exit(5)\n"})
    assert "exit status 5" in check_bundle(crash, "reward", "compute_score")
    slow = make_bundle(tmp_path / "slow", {"reward.py": "import time\ntime.sleep(30)\n"})
    assert "timed out" in check_bundle(slow, "reward", "compute_score", timeout_s=1.5)


# --- reward terms ------------------------------------------------------------------------------------------

ROW = Row("What is 2 + 2?", "2 + 2 = 4\n#### 4", {"level": "add"})


def boom(**kwargs):
    raise RuntimeError("grader exploded")


def test_score_terms_weights_and_totals():
    terms = terms_from_spec([{"name": "correct", "weight": 1.0, "grader": "builtin:gsm8k"},
                             {"name": "format", "weight": 0.25, "grader": "builtin:gsm8k-format"}])
    assert score_terms(terms, "#### 4", ROW) == TermScores({"correct": 1.0, "format": 1.0}, 1.25, [])
    assert score_terms(terms, "\\boxed{5}", ROW) == TermScores({"correct": 0.0, "format": 1.0}, 0.25, [])
    assert score_terms(terms, "4", ROW).scores == {"correct": 1.0, "format": 0.0}


def test_graders_see_question_and_extra_and_cannot_mutate_the_row():
    seen = []

    def spy(data_source, solution_str, ground_truth, extra_info):
        seen.append((data_source, solution_str, ground_truth, dict(extra_info)))
        extra_info["level"] = "changed"
        return True

    out = score_terms([RewardTerm("spy", 2.0, spy), RewardTerm("spy2", 1.0, spy)], "x", ROW, data_source="synthetic")
    assert seen[0] == ("synthetic", "x", ROW.answer, {"level": "add", "question": ROW.question})
    assert seen[1][3]["level"] == "add" and ROW.extra == {"level": "add"}
    assert out.total == 3.0 and out.errors == []


def test_raising_grader_scores_zero_and_is_reported():
    out = score_terms([RewardTerm("boom", 1.0, boom, ref="./x#reward"), RewardTerm("ok", 0.5, lambda **k: 1.0)],
                      "#### 4", ROW)
    assert out.scores == {"boom": 0.0, "ok": 1.0} and out.total == 0.5
    assert len(out.errors) == 1 and "'boom'" in out.errors[0] and "RuntimeError: grader exploded" in out.errors[0]
    assert "./x#reward" in out.errors[0]


@pytest.mark.parametrize("value, shown", [
    (float("nan"), "nan"), (float("inf"), "inf"), (None, "None"), ("1.0", "str"), ([1.0], "list"),
])
def test_bad_grader_results_score_zero_and_are_reported(value, shown):
    out = score_terms([RewardTerm("bad", 1.0, lambda **k: value)], "x", ROW)
    assert out.scores == {"bad": 0.0} and out.total == 0.0
    assert len(out.errors) == 1 and shown in out.errors[0] and "finite number" in out.errors[0]
    assert not math.isnan(out.total)


def test_dict_results_use_their_score():
    out = score_terms([RewardTerm("d", 2.0, lambda **k: {"score": 0.5, "acc": True})], "x", ROW)
    assert out.scores == {"d": 0.5} and out.total == 1.0


def test_terms_from_spec_names_and_errors(tmp_path):
    root = make_bundle(tmp_path / "mybundle", GOOD)
    terms = terms_from_spec([{"grader": "builtin:gsm8k"}, {"grader": "builtin:gsm8k-format", "weight": 0.1},
                             {"grader": str(root)}, {"grader": f"{root}#reward:lenient"}])
    assert [t.name for t in terms] == ["gsm8k", "gsm8k-format", "mybundle", "lenient"]
    assert [t.weight for t in terms] == [1.0, 0.1, 1.0, 1.0]
    with pytest.raises(StropError, match="already used"):
        terms_from_spec([{"grader": "builtin:gsm8k"}, {"grader": "builtin:gsm8k"}])
    with pytest.raises(StropError, match="allowed keys are name, weight, grader"):
        terms_from_spec([{"grader": "builtin:gsm8k", "wieght": 2}])
    with pytest.raises(StropError, match="'grader' is required"):
        terms_from_spec([{"name": "x"}])
    with pytest.raises(StropError, match="weight must be a finite number"):
        terms_from_spec([{"grader": "builtin:gsm8k", "weight": "high"}])
    with pytest.raises(StropError, match="non-empty list"):
        terms_from_spec([])
    with pytest.raises(BundleError):
        terms_from_spec([{"grader": "builtin:nope"}])


def test_reward_term_is_frozen_and_validated():
    term = RewardTerm("t", 1.0, boom)
    with pytest.raises(AttributeError):
        term.weight = 2.0
    with pytest.raises(StropError):
        RewardTerm("", 1.0, boom)
    with pytest.raises(StropError):
        RewardTerm("t", float("nan"), boom)
    with pytest.raises(StropError):
        RewardTerm("t", 1.0, "builtin:gsm8k")


def test_a_bundle_folder_is_checked_module_by_module_in_the_sandbox(tmp_path):
    from strop.scoring import check_bundle_folder
    folder = make_bundle(tmp_path / "b", {
        "grading.py": "def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):\n"
                      "    return 1.0\n",
        "fmt.py": "from helpers import X\ndef compute_score(**kw):\n    return X\n",
        "helpers.py": "X = 0.1\n"})
    assert check_bundle_folder(folder) == (["fmt", "grading"], None)
    none = make_bundle(tmp_path / "none", {"helpers.py": "X = 1\n"})
    modules, problem = check_bundle_folder(none)
    assert modules == [] and "looked at: helpers.py" in problem and "--module NAME" in problem
    (folder / "broken.py").write_text("import not_a_module_anywhere\ncompute_score = None\n")
    modules, problem = check_bundle_folder(folder)
    assert modules == [] and problem.startswith("module 'broken'") and "not_a_module_anywhere" in problem
