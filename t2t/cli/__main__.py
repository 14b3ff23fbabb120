"""`python -m t2t.cli ...`, the same as the `t2t` console script."""

from t2t.cli import console

console()
