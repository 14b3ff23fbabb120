"""Building blocks of text tasks: output features, line parsing, objective tasks on any text.

Every pretraining objective of the paper's Table 3 is a function of the top-level `preprocessors`
package that reads a tokenized `targets` feature and writes `inputs`/`targets`. A pretraining task
is therefore: raw text -> `targets` -> tokenize -> (seqio cache point) -> objective -> EOS.
`register_text_file_tasks` registers every objective on text files a user names.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence

import seqio
import tensorflow as tf

from t2t import files
from t2t.data import registry

# Table 3 objectives, named as the `preprocessors` package exports them.
OBJECTIVES = (
    "span_corruption",
    "iid_noise_replace_spans",
    "iid_noise_drop_tokens",
    "bert_style",
    "mass_style",
    "deshuffle",
    "prefix_lm",
    "full_lm",
)
TARGETS_ONLY_OBJECTIVES = frozenset({"full_lm"})


def output_features(
    vocabulary: seqio.Vocabulary, *, has_inputs: bool = True
) -> dict[str, seqio.Feature]:
    """`inputs` (if any) and `targets`, both with EOS appended, sharing one vocabulary."""
    features = {"targets": seqio.Feature(vocabulary=vocabulary, add_eos=True)}
    if has_inputs:
        features = {"inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True), **features}
    return features


@seqio.map_over_dataset
def line_to_text(line: tf.Tensor) -> dict[str, tf.Tensor]:
    """A text line (from `seqio.TextLineDataSource`) -> {"text": line}."""
    return {"text": line}


def parse_tsv(dataset: tf.data.Dataset, field_names: Sequence[str]) -> tf.data.Dataset:
    """Splits tab-separated lines into named string features.

    Example: field_names ("body", "summary"), line "Adds two numbers.\\tReturn a sum."
    -> {"body": "Adds two numbers.", "summary": "Return a sum."}
    """
    defaults = [""] * len(field_names)

    def parse(line):
        fields = tf.io.decode_csv(line, defaults, field_delim="\t", use_quote_delim=False)
        return dict(zip(field_names, fields))

    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


# Objective name -> the function tasks call, looked up when a task builds its dataset. The gin
# edge (`t2t.runs`) installs gin-configurable wrappers of the `preprocessors` functions here, so
# `--gin.span_corruption.noise_density=0.5` reaches every task built on span corruption.
_IMPLEMENTATIONS: dict[str, Callable] = {}


def set_objective_implementation(objective: str, function: Callable) -> None:
    """Makes tasks of `objective` call `function` (same signature) from now on."""
    if objective not in OBJECTIVES:
        raise ValueError(f"Unknown objective {objective!r}; expected one of {OBJECTIVES}.")
    _IMPLEMENTATIONS[objective] = function


def objective_function(objective: str, **knobs) -> Callable:
    """A seqio preprocessor applying the objective called `objective` with keyword knobs bound.

    The implementation is looked up each time the preprocessor runs (`set_objective_
    implementation`; by default the `preprocessors` function), so knobs set later, from gin,
    apply to tasks registered earlier; knobs bound here take precedence over gin's.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"Unknown objective {objective!r}; expected one of {OBJECTIVES}.")

    def apply(dataset: tf.data.Dataset, sequence_length, output_features) -> tf.data.Dataset:
        import preprocessors

        function = _IMPLEMENTATIONS.get(objective) or getattr(preprocessors, objective)
        return function(
            dataset, sequence_length=sequence_length, output_features=output_features, **knobs
        )

    apply.__name__ = objective
    return apply


def pretraining_preprocessors(objective: str, text_key: str = "text", **knobs) -> list[Callable]:
    """seqio preprocessors turning raw text (feature `text_key`) into examples of `objective`.

    Tokenization is the `preprocessors` package's batched drop-in for seqio's (same ids, many
    documents per SentencePiece call).
    """
    import preprocessors

    return [
        functools.partial(seqio.preprocessors.rekey, key_map={"inputs": None, "targets": text_key}),
        preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        objective_function(objective, **knobs),
        seqio.preprocessors.append_eos_after_trim,
    ]


def register_pretraining_task(
    name: str,
    source: seqio.DataSource,
    objective: str,
    vocabulary: seqio.Vocabulary,
    *,
    text_key: str = "text",
    source_preprocessors: Sequence[Callable] = (),
    **knobs,
) -> seqio.Task:
    """Registers `objective` on a text source as task `name` (replacing an older registration).

    Args:
      name: the task name.
      source: a seqio data source of examples with a string feature `text_key`.
      objective: one of OBJECTIVES.
      vocabulary: tokenizes the text.
      text_key: the feature holding the text.
      source_preprocessors: run first (e.g. `line_to_text` for a `TextLineDataSource`).
      **knobs: keyword arguments of the objective (e.g. `noise_density=0.5`).
    """
    return registry.add_task(
        name,
        __name__,
        source=source,
        preprocessors=[
            *source_preprocessors,
            *pretraining_preprocessors(objective, text_key, **knobs),
        ],
        output_features=output_features(
            vocabulary, has_inputs=objective not in TARGETS_ONLY_OBJECTIVES
        ),
        metric_fns=[],
    )


def count_lines(patterns: str | Iterable[str]) -> int:
    """Number of non-empty lines in the files matching `patterns` (local or tf.io.gfile paths)."""
    total = 0
    for path in seqio.utils.list_files(patterns):
        with files.open_file(path) as f:
            total += sum(1 for line in f if line.strip())
    return total


def register_text_file_tasks(
    prefix: str,
    split_to_filepattern: Mapping[str, str | Sequence[str]],
    vocabulary: seqio.Vocabulary,
    *,
    objectives: Sequence[str] = OBJECTIVES,
    count_examples: bool = True,
    **knobs,
) -> list[str]:
    """Registers each objective on text files (one document per line) as `{prefix}_{objective}`.

    Args:
      prefix: task name prefix.
      split_to_filepattern: e.g. {"train": "data/train-*.txt", "validation": "data/valid.txt"}.
      vocabulary: tokenizes the text.
      objectives: which of OBJECTIVES to register.
      count_examples: count the lines of each split (used by examples-proportional mixing).
      **knobs: keyword arguments passed to every objective.

    Returns:
      the registered task names.
    """
    for split, pattern in split_to_filepattern.items():
        if not seqio.utils.list_files(pattern):
            raise ValueError(
                f"No file matches {pattern!r} (split {split!r}); pass existing text files, one "
                f"document per line (working directory {os.getcwd()})."
            )
    counts = (
        {split: count_lines(pattern) for split, pattern in split_to_filepattern.items()}
        if count_examples
        else None
    )
    source = seqio.TextLineDataSource(dict(split_to_filepattern), num_input_examples=counts)
    names = []
    for objective in objectives:
        name = f"{prefix}_{objective}"
        register_pretraining_task(
            name, source, objective, vocabulary, source_preprocessors=[line_to_text], **knobs
        )
        names.append(name)
    return names
