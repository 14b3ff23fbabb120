"""The T5 paper's numbers, as data: what a study's ordering is compared with.

`paper_tables.json` (beside this module) holds the tables of Raffel et al. (2020) a study can
cite, each row the seven scores of the paper's columns (GLUE, CNNDM, SQuAD, SGLUE, EnDe, EnFr,
EnRo; GLUE and SGLUE are the benchmark averages), with the addresses they were read from.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

CITATION = (
    "Raffel et al., Exploring the Limits of Transfer Learning with a Unified "
    "Text-to-Text Transformer, JMLR 21(140), 2020 (arXiv:1910.10683)"
)
_HERE = os.path.dirname(os.path.abspath(__file__))  # local path: package data
PATH = os.path.join(_HERE, "paper_tables.json")


@functools.lru_cache(maxsize=1)
def tables() -> dict[str, Any]:
    with open(PATH, encoding="utf-8") as f:  # local path: package data
        return json.load(f)


def value(table: str, row: str, column: str = "GLUE") -> float | None:
    """The paper's score in `row` of `table` for `column` (None if not recorded).

    Raises:
      ValueError: an unknown table, row or column (the message lists the known ones).
    """
    data = tables()
    if str(table) not in data["tables"]:
        raise ValueError(f"No Table {table} recorded; recorded: {sorted(data['tables'])}.")
    rows = data["tables"][str(table)]["rows"]
    if row not in rows:
        raise ValueError(f"Table {table} has no row {row!r}; rows: {list(rows)}.")
    if column not in data["columns"]:
        raise ValueError(f"Unknown column {column!r}; columns: {data['columns']}.")
    entry = rows[row]
    scores = entry["scores"] if isinstance(entry, dict) else entry
    return scores[data["columns"].index(column)]
