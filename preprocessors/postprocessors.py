"""Postprocessors: decoded model text back to the values metrics compare.

A seqio postprocessor is called as `fn(output, example=..., is_target=...)` on the decoded
prediction and on the target. Predictions are free text, so every function here accepts anything
and never raises: text that is not a valid label maps to -1 (or the given default), which metrics
count as wrong (docs/spec.md section 10).
"""

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

INVALID = -1

# Words ignored when comparing a WSC prediction with the referent.
_DETERMINERS = frozenset(
    "a an few her his each every many much my our some that the their these this those which "
    "whose your".split()
)


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else str(value)


def string_label_to_class_id(
    string_label: Any, label_classes: Sequence[str], default: int = INVALID, **unused_kwargs
) -> int:
    """The index of a label word in `label_classes`, or `default` for anything else.

    Example: "not_entailment" with ("entailment", "not_entailment") -> 1; "maybe" -> -1.
    """
    label = _text(string_label)
    return list(label_classes).index(label) if label in label_classes else default


def string_to_float(string: Any, default: float = float(INVALID), **unused_kwargs) -> float:
    """A finite float parsed from the text, or `default` (STS-B). Example: "3.2" -> 3.2; "x" -> -1."""
    try:
        value = float(_text(string))
    except (TypeError, ValueError):
        return default
    return value if math.isfinite(value) else default


def multirc(
    string_label: Any, example: Optional[Mapping[str, Any]] = None, is_target: bool = False
) -> Dict[str, Any]:
    """MultiRC: {"value": class id of "False"/"True"}, plus the question `group` for targets.

    Example: "True" -> {"value": 1}; as a target of an example with idx/question 7 ->
    {"value": 1, "group": 7}.
    """
    out: Dict[str, Any] = {"value": string_label_to_class_id(string_label, ("False", "True"))}
    if is_target and example is not None:
        out["group"] = example["idx/question"]
    return out


def record(
    answer: Any, example: Optional[Mapping[str, Any]] = None, is_target: bool = False
) -> Dict[str, Any]:
    """ReCoRD: the predicted entity, or for targets every answer and the (passage, query) group."""
    if is_target and example is not None:
        return {
            "value": [_text(a) for a in example["answers"]],
            "group": (example["idx/passage"], example["idx/query"]),
        }
    return {"value": _text(answer)}


def qa(answer: Any, example: Optional[Mapping[str, Any]] = None, is_target: bool = False) -> Any:
    """SQuAD: the predicted text, or for targets every reference answer."""
    if is_target and example is not None:
        return [_text(a) for a in example["answers"]]
    return _text(answer)


def wsc_simple(
    prediction: Any, example: Optional[Mapping[str, Any]] = None, is_target: bool = False
) -> int:
    """WSC: 1 when the predicted noun phrase names the example's referent, else 0 (-1 if empty).

    Case and determiners are ignored; one phrase's words must contain the other's ("fuzzy bunny"
    names "the bunny"), and a possessive must match a possessive ("Bob" does not name "Bob's
    hat"). Targets are the example's label (1 when the candidate is the true referent).

    Example: prediction "The boy" for targets_pretokenized "boy" -> 1.
    """
    if is_target:
        return int(example["label"]) if example is not None else INVALID
    predicted = _content_words(prediction)
    if not predicted or example is None:
        return INVALID
    referent = _content_words(example.get("targets_pretokenized", ""))
    if ("'" in " ".join(predicted)) != ("'" in " ".join(referent)):
        return 0
    return int(set(predicted) <= set(referent) or set(referent) <= set(predicted))


def _content_words(text: Any) -> List[str]:
    words = _text(text).strip().lower().split(" ")
    return [w for w in words if w and w not in _DETERMINERS]
