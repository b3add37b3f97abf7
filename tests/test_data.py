"""Datasets: the synthetic generator, local files (good and bad), and GSM8K (shared copy and hub path)."""

from __future__ import annotations

import ast
import json
import operator
import os
import re
import time
from pathlib import Path

import pytest

from strop.data import LEVELS, Row, generate, load_rows
from strop.data import gsm8k as gsm8k_hub
from strop.errors import DatasetError, StropError

REPO = Path(__file__).resolve().parents[1]
GSM8K_DIR = Path(os.environ.get("STROP_GSM8K_DIR") or REPO.parent / "shared" / "data" / "gsm8k")

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expr: str) -> float:
    """Arithmetic on + - * / and parentheses, computed here independently of the generator."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(f"unexpected expression {expr!r}")
    return walk(ast.parse(expr, mode="eval"))


# --- synthetic ---------------------------------------------------------------------------------------------

def test_levels_listed_from_bare_arithmetic_to_multi_step():
    assert list(LEVELS) == ["add", "add-sub", "mul", "mixed", "word-1", "word-2", "word-3"]
    assert all(isinstance(d, str) and d for d in LEVELS.values())


@pytest.mark.parametrize("level", list(LEVELS))
def test_generate_is_deterministic_in_seed(level):
    assert generate(level, 50, seed=3) == generate(level, 50, seed=3)
    assert generate(level, 50, seed=3) != generate(level, 50, seed=4)


@pytest.mark.parametrize("level", ["add", "add-sub", "mul", "mixed"])
def test_bare_arithmetic_gold_matches_the_question(level):
    for row in generate(level, 300, seed=11):
        m = re.fullmatch(r"(?:What is|Compute) ([\d +\-*()]+)[?.]", row.question)
        assert m, row.question
        value = evaluate(m.group(1))
        assert value >= 0 and row.gold == str(int(value)), row
        assert row.answer.endswith(f"#### {row.gold}")


def test_bare_arithmetic_ranges():
    for row in generate("add", 200, seed=0):
        a, b = map(int, re.findall(r"\d+", row.question))
        assert a <= 20 and b <= 20
    for row in generate("mul", 200, seed=0):
        a, b = map(int, re.findall(r"\d+", row.question))
        assert 1 <= a <= 9 and 1 <= b <= 9 and row.question == f"Compute {a} * {b}."


def test_one_step_word_problems_recomputed_from_the_question():
    patterns = [
        (r"has (\d+) \w+\. \w+ gets (\d+) more\.", lambda a, b: a + b),
        (r"has (\d+) \w+\. \w+ gives away (\d+) of them\.", lambda a, b: a - b),
        (r"has (\d+) \w+ with (\d+) \w+ in each\.", lambda a, b: a * b),
        (r"shares (\d+) \w+ equally among (\d+) friends\.", lambda a, b: a / b),
    ]
    for row in generate("word-1", 300, seed=5):
        results = [fn(*map(int, m.groups())) for pat, fn in patterns if (m := re.search(pat, row.question))]
        assert len(results) == 1, row.question
        assert results[0] == int(row.gold) and int(row.gold) >= 0, row


@pytest.mark.parametrize("level", list(LEVELS))
def test_every_worked_step_is_correct_and_ends_at_gold(level):
    step = re.compile(r"([\d()][\d\s+\-*/()]*?)\s*=\s*(\d+)")
    for row in generate(level, 300, seed=7):
        *lines, final = row.answer.splitlines()
        assert final == f"#### {row.gold}" and int(row.gold) >= 0, row
        assert lines, row
        last = None
        for line in lines:
            for expr, value in step.findall(line):
                assert evaluate(expr) == int(value), (line, row.question)
                last = int(value)
        assert last == int(row.gold), row


def test_multi_step_levels_have_more_steps():
    def steps(level):
        return min(len(r.answer.splitlines()) - 1 for r in generate(level, 100, seed=0))
    assert steps("word-1") == 1 and steps("word-2") == 2 and steps("word-3") >= 3


def test_unknown_level_lists_the_levels():
    with pytest.raises(DatasetError) as e:
        load_rows("synthetic:division")
    assert "'division'" in str(e.value)
    for level in LEVELS:
        assert level in str(e.value)


def test_synthetic_defaults_and_splits_are_disjoint():
    train = load_rows("synthetic")
    assert len(train) == 2000 and all(r.extra["level"] == "add" for r in train)
    test = load_rows("synthetic", split="test", limit=200)
    assert len(test) == 200
    # Even 'add' (441 distinct problems) keeps test questions out of train.
    assert not {r.question for r in train} & {r.question for r in test}
    for level in ("mixed", "word-2"):
        tr = load_rows(f"synthetic:{level}", limit=500, seed=1)
        te = load_rows(f"synthetic:{level}", split="test", limit=200, seed=1)
        assert not {r.question for r in tr} & {r.question for r in te}
    assert load_rows("synthetic:mul", limit=5, seed=9) == generate("mul", 5, 9, split="train")
    with pytest.raises(DatasetError, match="'train' and 'test'"):
        load_rows("synthetic", split="validation")


# --- Row -----------------------------------------------------------------------------------------------------

def test_row_gold_and_hashable():
    row = Row("q", "Work: 1,000 + 234 = 1,234\n#### 1,234 ", {"id": 1})
    assert row.gold == "1234"
    assert Row("q", "a #### 1 #### 2").gold == "2"
    assert Row("q", " 42 ").gold == "42"
    assert hash(row) == hash(Row("q", row.answer, {"other": 2}))
    with pytest.raises(AttributeError):
        row.question = "x"


# --- local files -----------------------------------------------------------------------------------------------

ROWS = [{"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4", "id": 7},
        {"question": "What is 3 * 3?", "answer": "#### 9", "id": 8}]


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def test_jsonl_json_and_parquet_load_alike(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    jsonl = write_jsonl(tmp_path / "d.jsonl", ROWS)
    js = tmp_path / "d.json"
    js.write_text(json.dumps(ROWS, indent=2), encoding="utf-8")
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    expected = [Row(r["question"], r["answer"], {"id": r["id"]}) for r in ROWS]
    for path in (jsonl, js, parquet):
        rows = load_rows(str(path))
        assert rows == expected and rows[1].gold == "9"
        assert load_rows(str(path), limit=1) == expected[:1]


VERL_ROWS = [{"data_source": "openai/gsm8k", "ability": "math",
              "prompt": [{"role": "user", "content": f"What is {i} + 1? Answer after ####."}],
              "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
              "extra_info": {"split": "train", "index": i}} for i in range(3)]
VERL_ROWS[1]["prompt"] = [{"role": "system", "content": "Be terse."}, *VERL_ROWS[1]["prompt"]]
VERL_ROWS[2]["reward_model"]["ground_truth"] = 3          # a number is read as its text


def test_rows_in_verls_form_load_from_jsonl_and_parquet(tmp_path):
    """verl's datasets (its gsm8k preprocessing writes parquet rows like these) train and evaluate as they are: the
    prompt's messages are the conversation, the ground truth the answer, data_source and extra_info kept."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = tmp_path / "verl.parquet"
    as_text = [{**r, "reward_model": {**r["reward_model"], "ground_truth": str(r["reward_model"]["ground_truth"])}}
               for r in VERL_ROWS]                  # a parquet column holds one type
    pq.write_table(pa.Table.from_pylist(as_text), parquet)
    from strop.data.row import grader_context
    for path in (write_jsonl(tmp_path / "verl.jsonl", VERL_ROWS), parquet):
        rows = load_rows(str(path))
        assert [r.gold for r in rows] == ["1", "2", "3"] and rows[0].question == "What is 0 + 1? Answer after ####."
        assert rows[1].conversation() == VERL_ROWS[1]["prompt"]
        asked = [{"role": "system", "content": "Think."},
                 {"role": "user", "content": "What is 1 + 1? Answer after ####.!"}]
        assert rows[1].conversation("Think.", "!") == asked
        source, info = grader_context(rows[0])
        assert source == "openai/gsm8k" and info["split"] == "train" and info["index"] == 0
        assert info["question"] == rows[0].question and "prompt" not in rows[0].extra


def test_rows_in_trls_form_load(tmp_path):
    """TRL's GRPO datasets name the question `prompt` (text, or chat messages) beside the answer column."""
    rows = load_rows(str(write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": "What is 1 + 1?", "answer": "#### 2"},
        {"prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 2 + 2?"}],
         "answer": 4, "level": "easy"}])))
    assert [(r.question, r.gold) for r in rows] == [("What is 1 + 1?", "2"), ("What is 2 + 2?", "4")]
    assert rows[1].conversation()[0] == {"role": "system", "content": "Be terse."}
    assert rows[1].extra == {"level": "easy"}


@pytest.mark.parametrize("row, says", [
    ({"prompt": [{"role": "tool", "content": "x"}], "reward_model": {"ground_truth": "1"}}, "prompt[0] must be"),
    ({"prompt": "hi", "reward_model": {"ground_truth": [1]}}, "ground_truth is a list"),
    ({"prompt": [{"role": "user", "content": "x"}], "reward_model": {}}, "ground_truth is null"),
    ({"prompt": [{"role": "system", "content": "x"}], "reward_model": {"ground_truth": "1"}}, "no user message"),
    ({"prompt": {"role": "user"}, "reward_model": {"ground_truth": "1"}}, "as text or as a list of chat messages"),
    ({"prompt": "What is 1 + 1?"}, "answer is null"),
])
def test_a_bad_row_in_verls_form_names_its_line(tmp_path, row, says):
    with pytest.raises(DatasetError, match="line 2") as caught:
        load_rows(str(write_jsonl(tmp_path / "d.jsonl", [VERL_ROWS[0], row])))
    assert says in str(caught.value)


def test_blank_lines_and_bom_are_fine(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(ROWS[0]).encode() + b"\n\n   \n" + json.dumps(ROWS[1]).encode())
    assert [r.gold for r in load_rows(str(path))] == ["4", "9"]


def test_field_mapping_renames_columns_and_keeps_the_rest(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"problem": "p", "solution": "#### 3", "level": "easy"}])
    (row,) = load_rows(str(path), fields={"question": "problem", "answer": "solution"})
    assert row == Row("p", "#### 3", {"level": "easy"})
    with pytest.raises(DatasetError, match="only question, answer can be mapped"):
        load_rows(str(path), fields={"label": "x"})


def error_for(source, **kwargs) -> str:
    with pytest.raises(DatasetError) as e:
        load_rows(str(source), **kwargs)
    assert isinstance(e.value, StropError)
    return str(e.value)


def test_missing_file_and_directory(tmp_path):
    msg = error_for(tmp_path / "nope.jsonl")
    assert "nope.jsonl" in msg and "does not exist" in msg and "check the path" in msg
    (tmp_path / "sub.jsonl").mkdir()
    assert "is a directory" in error_for(tmp_path / "sub.jsonl")


def test_unknown_source_and_suffix(tmp_path):
    msg = error_for("squad")
    assert "unknown dataset 'squad'" in msg and "synthetic" in msg and ".jsonl" in msg
    csv = tmp_path / "d.csv"
    csv.write_text("question,answer\n")
    assert "convert it to .jsonl" in error_for(csv)


def test_not_utf8_names_line_and_byte(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b'\n{"question": "caf\xe9", "answer": "#### 1"}\n')
    msg = error_for(path)
    assert "not UTF-8" in msg and "line 2" in msg and "0xe9" in msg and "Re-save the file as UTF-8" in msg


def test_bad_json_lines_are_all_reported(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], '{"question": "x", answer: 1}', ROWS[1], "{oops"])
    msg = error_for(path)
    assert "2 problems" in msg and "line 2: invalid JSON" in msg and "line 4: invalid JSON" in msg
    assert "one JSON object" in msg


def test_empty_files(tmp_path):
    for name, text in (("e.jsonl", ""), ("w.jsonl", "\n  \n"), ("e.json", "")):
        (tmp_path / name).write_text(text)
        msg = error_for(tmp_path / name)
        assert "is empty" in msg and "at least one row" in msg
    (tmp_path / "l.json").write_text("[]")
    assert "empty list" in error_for(tmp_path / "l.json")


def test_missing_field_names_line_field_and_what_the_row_has(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], {"question": "q", "solution": "#### 1"}])
    msg = error_for(path)
    assert "line 2: missing field 'answer'" in msg
    assert "the row has 'question', 'solution'" in msg and "fields=" in msg


def test_non_string_and_non_object_rows(tmp_path):
    records = [{"question": "q", "answer": 18}, [1, 2], {"question": None, "answer": "#### 1"}]
    path = write_jsonl(tmp_path / "d.jsonl", records)
    msg = error_for(path)
    assert "line 1: field 'answer' is a number, expected a string" in msg
    assert "line 2: expected a JSON object" in msg
    assert "line 3: field 'question' is null" in msg


def test_many_errors_are_capped(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q"}] * 15)
    msg = error_for(path)
    assert "15 problems" in msg and "line 10:" in msg and "line 11:" not in msg and "and 5 more" in msg


def test_json_file_errors_point_at_lines(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('[\n  {"question": "q", "answer": "#### 1"},\n  {"question": "q", "answer": "#### 2",}\n]\n')
    msg = error_for(path)
    assert "invalid JSON at line 3" in msg
    path.write_text(json.dumps([ROWS[0], {"question": "q"}], indent=2))
    assert "line 7 (item 2): missing field 'answer'" in error_for(path)
    path.write_text(json.dumps({"question": "q", "answer": "a"}))
    assert "must be a list of objects" in error_for(path)
    path.write_text("\n".join(json.dumps(r) for r in ROWS))
    assert "name it .jsonl" in error_for(path)


def test_parquet_errors_point_at_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"question": ["a", "b"], "answer": [1, 2]}), path)
    msg = error_for(path)
    assert "row 1: field 'answer' is a number" in msg and "row 2:" in msg
    pq.write_table(pa.table({"question": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), path)
    assert "has no rows" in error_for(path)
    path.write_bytes(b"not parquet at all")
    assert "not a readable parquet file" in error_for(path)


def test_bad_limit():
    assert "limit must be" in error_for("synthetic", limit=0)


# --- GSM8K ---------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not (GSM8K_DIR / "test.jsonl").exists(), reason=f"no GSM8K copy at {GSM8K_DIR}")
def test_shared_gsm8k_test_split_loads_and_every_gold_is_a_number():
    rows = load_rows(str(GSM8K_DIR / "test.jsonl"))
    assert len(rows) == gsm8k_hub.SPLIT_SIZES["test"] == 1319
    for row in rows:
        float(row.gold)
    assert rows[0].gold == "18"


def test_gsm8k_reads_the_hub_parquet(tmp_path, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q", "answer": "x\n#### 5"}] * 3), path)
    asked = []
    monkeypatch.setattr(gsm8k_hub, "fetch_split", lambda split: asked.append(split) or path)
    rows = load_rows("openai/gsm8k", split="test", limit=2)
    assert asked == ["test"] and len(rows) == 2 and rows[0].gold == "5"


def test_gsm8k_unreachable_hub_fails_fast_and_says_to_pass_a_file(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")

    def not_cached(*args, **kwargs):
        raise FileNotFoundError("not in cache")

    monkeypatch.setattr(hub, "hf_hub_download", not_cached)
    monkeypatch.setattr(gsm8k_hub, "_unreachable", lambda endpoint: "Name or service not known")
    start = time.monotonic()
    msg = error_for("gsm8k", split="test")
    assert time.monotonic() - start < 5
    assert "unreachable" in msg and "--dataset path/to/test.jsonl" in msg
    assert "splits 'train' and 'test'" in error_for("gsm8k", split="dev")


def test_gsm8k_split_files():
    assert gsm8k_hub.HUB_REPO == "openai/gsm8k"
    assert gsm8k_hub.SPLIT_FILES == {"train": "main/train-00000-of-00001.parquet",
                                     "test": "main/test-00000-of-00001.parquet"}
