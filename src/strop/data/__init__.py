"""Datasets: rows of (question, answer) from generated arithmetic, GSM8K, or local files.

    >>> from strop.data import load_rows, generate, LEVELS
    >>> train = load_rows("synthetic:word-1", limit=100)
    >>> test = load_rows("gsm8k", split="test")           # or load_rows("path/to/test.jsonl")
    >>> train[0].gold                                     # the final answer, e.g. '42'
"""

from strop.data.rows import Row, load_rows
from strop.data.synthetic import LEVELS, generate
from strop.data.tables import Table, load_dataset

__all__ = ["Row", "load_rows", "generate", "LEVELS", "Table", "load_dataset"]
