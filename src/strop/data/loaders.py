"""Rows: the question/answer pairs a run trains and evaluates on, from any source.

A `Row` holds a question, an answer in GSM8K's form (worked reasoning, then `#### N`) and any other fields of
the source in `extra`. `load_rows` reads one of

    synthetic            generated arithmetic, level 'add' (see `strop.data.synthetic.LEVELS`)
    synthetic:LEVEL      generated problems of that level, e.g. 'synthetic:word-2'
    gsm8k | openai/gsm8k GSM8K from the Hugging Face hub (cached after the first download)
    PATH                 a local .jsonl (one object per line), .json (a list of objects) or .parquet file,
                         of question/answer rows, or of rows that bring their prompt (text or chat messages):
                         verl's (data_source, prompt, reward_model, extra_info) or TRL's (prompt, answer)

    >>> from strop.data import load_rows
    >>> rows = load_rows("synthetic:mul", limit=3, seed=1)
    >>> rows[0].question, rows[0].gold      # e.g. ('Compute 6 * 7.', '42')

Every row of a file is checked before anything is returned, and up to `MAX_REPORTED` problems are reported in
one error, each with its line number, so a bad file is fixed in one pass rather than one error at a time.
A file costs time and memory in proportion to its size whatever it holds: only regular files are opened (a FIFO
or a device would block or never end), files over MAX_FILE_BYTES and lines over MAX_LINE_CHARS are refused, and
JSON nested too deeply is a DatasetError naming its line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from strop.data import gsm8k
from strop.data.row import Row
from strop.data.synthetic import DEFAULT_LEVEL, generate
from strop.errors import DatasetError
from strop.files import FileKindError, check_regular, open_regular

MAX_REPORTED = 10
MAX_LINE_CHARS = 1 << 20  # a row of a question and an answer; a longer line is almost surely the wrong file
MAX_FILE_BYTES = 1 << 30  # read whole into memory; GSM8K's train split is 4 MB
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
DEFAULT_SYNTHETIC_COUNT = {"train": 2000, "test": 500}
GSM8K_NAMES = ("gsm8k", "openai/gsm8k")
REQUIRED = ("question", "answer")


def load_rows(
    source: str,
    *,
    split: str = "train",
    limit: int | None = None,
    seed: int = 0,
    fields: dict[str, str] | None = None,
) -> list[Row]:
    """Rows from `source` (see the module docstring); at most `limit` of them, in source order.

    `split` picks GSM8K's or the synthetic generator's train/test split; a local file is its own split.
    `seed` drives the synthetic generator only. `fields` maps a row field to the source's column name when they
    differ, e.g. `{"question": "problem", "answer": "solution"}`.
    """
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise DatasetError(f"limit must be a whole number >= 1 (or None for all rows), got {limit!r}.")
    columns = _column_map(fields)
    src = str(source).strip()

    if src == "synthetic" or src.startswith("synthetic:"):
        level = src.partition(":")[2].strip() or DEFAULT_LEVEL
        if split not in DEFAULT_SYNTHETIC_COUNT:
            raise DatasetError(f"synthetic data has splits 'train' and 'test', got split={split!r}.")
        return generate(level, limit or DEFAULT_SYNTHETIC_COUNT[split], seed, split=split)

    if src.lower() in GSM8K_NAMES:
        path = gsm8k.fetch_split(split)
        rows = _rows_from_records(_read_parquet(path), columns, where=f"GSM8K {split} split ({path})")
        return rows[:limit] if limit else rows

    path = Path(src).expanduser()
    if path.suffix.lower() not in FILE_SUFFIXES and not path.exists():
        raise DatasetError(
            f"unknown dataset {src!r}: pass 'synthetic', 'synthetic:LEVEL', 'gsm8k', or a path to a "
            f".jsonl, .json or .parquet file (e.g. --dataset data/test.jsonl)."
        )
    rows = _rows_from_records(read_records(path), columns, where=str(path))
    return rows[:limit] if limit else rows


def read_records(path: Path) -> list[tuple[str, Any]]:
    """The raw records of a local file as (location, value) pairs; location is e.g. 'line 3' or 'row 3'."""
    if not path.exists():
        raise DatasetError(f"dataset file {path} does not exist: check the path "
                           f"(relative paths start in {Path.cwd()}).")
    if path.is_dir():
        raise DatasetError(f"dataset {path} is a directory: pass a .jsonl, .json or .parquet file inside it.")
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise DatasetError(f"dataset file {path} has suffix {suffix!r}: rename it or convert it to .jsonl, .json "
                           f"or .parquet.")
    check_regular_file(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    text = _read_text(path)
    if not text.strip():
        raise DatasetError(f"dataset file {path} is empty: it needs at least one row with 'question' and 'answer'.")
    return _read_jsonl(path, text) if suffix == ".jsonl" else _read_json(path, text)


def check_regular_file(path: Path) -> None:
    """Refuse, before anything opens it, a dataset path that is not a regular file (a FIFO blocks the reader
    forever, a device never ends) or is too large to read into memory. Symbolic links are followed."""
    try:
        info = check_regular(path, what="dataset file")
    except FileKindError as e:
        raise DatasetError(f"{e}. Save the rows to a .jsonl file and pass that.") from None
    except OSError as e:
        raise DatasetError(f"cannot read dataset file {path}: {e.strerror or e}.") from None
    if info.st_size > MAX_FILE_BYTES:
        raise DatasetError(f"dataset file {path} is {info.st_size:,} bytes, over the {MAX_FILE_BYTES:,} a dataset "
                           f"file may have (it is read into memory): split it, or register a subset.")


def _read_text(path: Path) -> str:
    try:
        with open_regular(path, what="dataset file") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileKindError as e:
        raise DatasetError(f"{e}. Save the rows to a .jsonl file and pass that.") from None
    except OSError as e:
        raise DatasetError(f"cannot read dataset file {path}: {e.strerror or e}. Check its permissions.") from None
    try:
        # utf-8-sig so a file saved by an editor that adds a byte-order mark still reads.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DatasetError(
            f"dataset file {path} is not UTF-8 text: byte 0x{data[e.start]:02x} at line {line}, column {column} "
            f"(byte offset {e.start}). Re-save the file as UTF-8."
        ) from None


def _read_jsonl(path: Path, text: str) -> list[tuple[str, Any]]:
    records, errors = [], _Problems()
    # split on newlines only: str.splitlines also splits at U+2028, U+0085 and others, which JSON strings may hold
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            errors.append(f"line {number}: {len(line):,} characters, over the {MAX_LINE_CHARS:,} a row may have "
                          "(is this the right file?)")
            continue
        try:
            records.append((f"line {number}", json.loads(line)))
        except json.JSONDecodeError as e:
            errors.append(f"line {number}: invalid JSON ({e.msg} at column {e.colno})")
        except RecursionError:
            errors.append(f"line {number}: JSON nested too deeply (a row is an object of strings)")
    if errors:
        raise DatasetError(_summary(path, errors, "Each line must be one JSON object, e.g. "
                                    '{"question": "...", "answer": "... #### 42"}.'))
    return records


def _read_json(path: Path, text: str) -> list[tuple[str, Any]]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        hint = " If it holds one object per line, name it .jsonl." if e.msg == "Extra data" else ""
        raise DatasetError(
            f"dataset file {path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}.{hint}"
        ) from None
    except RecursionError:
        raise DatasetError(f"dataset file {path}: JSON nested too deeply; a .json dataset is a list of objects "
                           f'like [{{"question": "...", "answer": "... #### 42"}}].') from None
    if not isinstance(value, list):
        raise DatasetError(
            f"dataset file {path} holds a JSON {type(value).__name__}; a .json dataset must be a list of objects "
            f'like [{{"question": "...", "answer": "... #### 42"}}].'
        )
    if not value:
        raise DatasetError(f"dataset file {path} is an empty list: it needs at least one row.")
    lines = _item_lines(text, len(value))
    return [(f"line {line} (item {i + 1})" if line else f"item {i + 1}", item)
            for i, (item, line) in enumerate(zip(value, lines))]


def _item_lines(text: str, count: int) -> list[int | None]:
    """The line each top-level list item starts on, so errors in a .json file can point at a line."""
    decoder = json.JSONDecoder()
    lines: list[int | None] = []
    pos = text.index("[") + 1
    line, counted = 1, 0  # newlines are counted once, from where the last item's count stopped
    try:
        while len(lines) < count:
            while text[pos] in " \t\r\n,":
                pos += 1
            line += text.count("\n", counted, pos)
            counted = pos
            lines.append(line)
            _, pos = decoder.raw_decode(text, pos)
    except (ValueError, IndexError, RecursionError):
        return [None] * count
    return lines


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    if not path.exists():
        raise DatasetError(f"dataset file {path} does not exist: check the path.")
    try:
        # lazy: optional, its absence is handled here
        import pyarrow.parquet as pq

        table = pq.read_table(path)
    except ImportError:
        raise DatasetError(f"reading {path} needs pyarrow: `pip install pyarrow`, or convert the file to "
                           f".jsonl.") from None
    except Exception as e:  # pyarrow raises several unrelated types for a damaged file
        raise DatasetError(f"dataset file {path} is not a readable parquet file: {e}. Re-export it, or use "
                           f".jsonl.") from None
    if table.num_rows == 0:
        raise DatasetError(f"dataset file {path} has no rows: it needs at least one row with 'question' and 'answer'.")
    return [(f"row {i + 1}", record) for i, record in enumerate(table.to_pylist())]


def _column_map(fields: dict[str, str] | None) -> dict[str, str]:
    columns = {name: name for name in REQUIRED}
    if fields is None:
        return columns
    if not isinstance(fields, dict):
        raise DatasetError(f"fields must be a dict like {{'question': 'problem'}}, got {type(fields).__name__}.")
    for key, column in fields.items():
        if key not in REQUIRED:
            raise DatasetError(f"fields maps {key!r}, but only {', '.join(REQUIRED)} can be mapped: "
                               f"other columns are kept in Row.extra as they are.")
        if not isinstance(column, str) or not column:
            raise DatasetError(f"fields[{key!r}] must be a column name (a non-empty string), got {column!r}.")
        columns[key] = column
    return columns


def _rows_from_records(records: Iterable[tuple[str, Any]], columns: dict[str, str], *, where: str) -> list[Row]:
    rows, errors = [], _Problems()
    for location, record in records:
        if not isinstance(record, dict):
            errors.append(f"{location}: expected a JSON object with 'question' and 'answer', "
                          f"got {_kind(record)}")
            continue
        if columns["question"] not in record and "prompt" in record:  # verl's or TRL's row: prompt messages
            row, problem = _prompt_row(record, location, columns["answer"])
            if problem:
                errors.append(problem)
            else:
                rows.append(row)
            continue
        values, ok = {}, True
        for name, column in columns.items():
            shown = repr(column) if column == name else f"{column!r} (mapped to {name})"
            if column not in record:
                keys = [repr(k)[:60] for k, _ in zip(record, range(MAX_REPORTED))]
                have = ", ".join(keys) + (", ..." if len(record) > len(keys) else "") or "no fields"
                errors.append(f"{location}: missing field {shown}; the row has {have}")
                ok = False
            elif not isinstance(record[column], str):
                errors.append(f"{location}: field {shown} is {_kind(record[column])}, expected a string "
                              f"(quote the value)")
                ok = False
            else:
                values[name] = record[column]
        if ok:
            extra = {k: v for k, v in record.items() if k not in columns.values()}
            rows.append(Row(question=values["question"], answer=values["answer"], extra=extra))
    if errors:
        raise DatasetError(_summary(where, errors, "Every row needs string fields 'question' and 'answer' (the "
                                    "answer ending in '#### N'), or a prompt (text or chat messages) and "
                                    "'answer' or verl's reward_model.ground_truth; if your columns have other "
                                    "names, pass a field mapping such as "
                                    "fields={'question': 'problem', 'answer': 'solution'}."))
    if not rows:
        raise DatasetError(f"dataset {where} has no rows: it needs at least one row with 'question' and 'answer'.")
    return rows


VERL_ROLES = ("system", "user", "assistant")


def _prompt_row(record: dict, location: str, answer: str) -> tuple[Row | None, str | None]:
    """A row that brings its prompt: verl's form ({"data_source", "prompt": [chat messages], "reward_model":
    {"ground_truth": ...}, "extra_info": {...}}) or TRL's (a "prompt", as text or messages, beside the answer
    column): the prompt's messages as the row's conversation, its last user turn as the question, the ground truth
    (or the answer) as the answer; the other fields stay in `extra` (graders get data_source and extra_info as verl
    passes them). (Row, None), or (None, the problem)."""
    if "reward_model" in record:
        where = "reward_model.ground_truth"
        truth = record["reward_model"].get("ground_truth") if isinstance(record["reward_model"], dict) else None
    else:
        where, truth = answer, record.get(answer)
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        truth = str(truth)
    if not isinstance(truth, str):
        return None, (f"{location}: {where} is {_kind(truth)}; a row with a prompt needs it as a string (or a "
                      "number): the answer a grader compares with")
    prompt = record.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        return None, f"{location}: prompt is {_kind(prompt)}; give the question as text or as a list of chat messages"
    messages = []
    for i, message in enumerate(prompt):
        role = message.get("role") if isinstance(message, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type", "text") == "text"
                                             and isinstance(p.get("text"), str) for p in content):
            content = "".join(p["text"] for p in content)
        if role not in VERL_ROLES or not isinstance(content, str):
            return None, (f"{location}: prompt[{i}] must be {{\"role\": {' | '.join(map(repr, VERL_ROLES))}, "
                          f"\"content\": text}}")
        messages.append({"role": role, "content": content})
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        return None, f"{location}: prompt has no user message, so there is no question to ask"
    extra = {k: v for k, v in record.items() if k not in ("prompt", answer if where == answer else "prompt")}
    return Row(question=users[-1]["content"], answer=truth, extra=extra, messages=tuple(messages)), None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", bool: "a boolean", int: "a number", float: "a number",
            str: "a string"}.get(type(value), type(value).__name__)


class _Problems(list):
    """A file's problems: the first MAX_REPORTED kept as text, the rest only counted (a million bad rows must not
    become a million strings)."""

    count = 0

    def append(self, problem: str) -> None:
        self.count += 1
        if len(self) < MAX_REPORTED:
            super().append(problem)


def _summary(where: Any, errors: list[str], fix: str) -> str:
    total = getattr(errors, "count", len(errors))
    shown = errors[:MAX_REPORTED]
    more = f"\n  ... and {total - len(shown)} more" if total > len(shown) else ""
    plural = "problem" if total == 1 else "problems"
    return f"dataset {where}: {total} {plural}:\n  " + "\n  ".join(shown) + more + f"\n{fix}"
