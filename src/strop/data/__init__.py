"""Datasets: rows of (question, answer) from generated arithmetic, GSM8K, or local files.

    >>> from strop.data import load_rows, generate, LEVELS
    >>> train = load_rows("synthetic:word-1", limit=100)
    >>> test = load_rows("gsm8k", split="test")           # or load_rows("path/to/test.jsonl")
    >>> train[0].gold                                     # the final answer, e.g. '42'
"""

from strop.data.datasets import Table, load_dataset
from strop.data.loaders import Row, load_rows
from strop.data.synthetic import LEVELS, generate

__all__ = ["Row", "load_rows", "generate", "LEVELS", "Table", "load_dataset"]
