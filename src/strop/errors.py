"""User-facing errors.

Every error a person can cause (a bad flag, a missing file, an unknown model) is a `StropError`: its message
names the input, says what was wrong and what to do. The CLI prints it on one line and exits 1; Python
callers catch it like any exception.
"""


class StropError(Exception):
    """An error caused by input that a person can fix; the message says how."""


class ModelNotFoundError(StropError):
    """No source could provide the requested base model."""


class DatasetError(StropError):
    """A dataset could not be read, or a row is malformed."""


class BundleError(StropError):
    """A scoring bundle could not be loaded or does not define a usable function."""
