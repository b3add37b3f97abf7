"""A small stand-in for Hugging Face `datasets`, so code written against it (the GSM8K walkthrough's notebook) runs offline.

    ds = load_dataset("openai/gsm8k", "main")                       # the hub, or data_dir= for local files
    train = ds["train"]; batch = train.select(range(0, 8))
    batch["question"]      # a column as a list
    for row in batch: row["answer"]                                  # rows as dicts

Only what such loops use is here: `select`, column and row indexing, `len` and iteration.
"""

from __future__ import annotations

import os
from pathlib import Path

from strop.data.loaders import Row, load_rows
from strop.errors import DatasetError


class Table:
    def __init__(self, rows: list[Row]):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self):
        return (self._as_dict(r) for r in self._rows)

    def __getitem__(self, key):
        if isinstance(key, str):
            if key in ("question", "answer"):
                return [getattr(r, key) for r in self._rows]
            if self._rows and key in self._rows[0].extra:
                return [r.extra.get(key) for r in self._rows]
            raise KeyError(f"no column {key!r}; columns: {self.column_names}")
        return self._as_dict(self._rows[key])

    def select(self, indices) -> Table:
        return Table([self._rows[i] for i in indices])

    @property
    def column_names(self) -> list[str]:
        return ["question", "answer", *(self._rows[0].extra if self._rows else {})]

    @staticmethod
    def _as_dict(row: Row) -> dict:
        return {"question": row.question, "answer": row.answer, **row.extra}


def load_dataset(path: str, name: str | None = None, *, data_dir: str | None = None,
                 splits: tuple[str, ...] = ("train", "test")) -> dict[str, Table]:
    """Splits of a dataset as Tables: a hub id ('openai/gsm8k'), 'synthetic[:LEVEL]', or a folder holding
    `<split>.jsonl` / `<split>.parquet` files (`data_dir`, or `$STROP_GSM8K_DIR` for GSM8K)."""
    folder = data_dir or (os.environ.get("STROP_GSM8K_DIR") if path.lower() in ("gsm8k", "openai/gsm8k") else None)
    out = {}
    for split in splits:
        if folder:
            files = [Path(folder) / f"{split}{suffix}" for suffix in (".jsonl", ".parquet", ".json")]
            found = next((f for f in files if f.exists()), None)
            if found is None:
                raise DatasetError(f"{folder} has no {split}.jsonl, {split}.parquet or {split}.json; "
                                   "put each split in a file named after it")
            out[split] = Table(load_rows(str(found)))
        else:
            out[split] = Table(load_rows(path, split=split))
    return out
