"""The error a user can fix: raised with a message that says what was expected and how to fix it.

The CLI prints a `UserError` (and any `OSError`, and `ValueError`s from t2t's own checks) as one
line and exits 2; anything else is treated as a bug and shown with its stack (`t2t.cli`).
"""


class UserError(ValueError):
    """Bad input, said in words: the CLI prints the message and exits 2."""
