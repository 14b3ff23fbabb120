"""SuperGLUE tasks that are not plain classification: WSC, DPR and ReCoRD.

The paper (section 2.4) recasts WSC as "name the referent": the pronoun is marked with asterisks
and the target is the noun it refers to; the definite pronoun resolution (DPR) data set is added in
the same format, and training keeps only the WSC examples whose candidate is the true referent.
ReCoRD becomes one example per correct answer entity. The layouts match the `t5` package's
preprocessors on the same TFDS records (`tests/preprocessors/test_formats.py`).
"""

import tensorflow as tf

from preprocessors.classification import UNKNOWN_LABEL


def wsc_simple(
    dataset: tf.data.Dataset, label: str = "wsc:", correct_referent_only: bool = False
) -> tf.data.Dataset:
    """SuperGLUE WSC as "mark the pronoun, name the referent".

    The word at `span2_index` (space-separated) is the pronoun and gets asterisks; when that word is
    not `span2_text` (two records of the data set have a shifted index), the nearest word that is
    the pronoun (ignoring trailing punctuation) is marked instead.

    Example: {"text": "Mitchell asked Tom if he could lend some money.", "span1_text": "Tom",
    "span2_text": "he", "span2_index": 4, "label": 1, "idx": 0} ->
    {"inputs": "wsc: Mitchell asked Tom if *he* could lend some money.", "targets": "Tom",
    "label": 1, "idx": 0}.

    Args:
        dataset: TFDS `super_glue/wsc.fixed` records.
        label: the input prefix.
        correct_referent_only: keep only examples whose candidate is the referent (label 1), for
            training.

    Returns:
        A dataset of {"inputs", "targets", "label", "idx"}.
    """
    if correct_referent_only:
        dataset = dataset.filter(lambda x: tf.cast(x["label"], tf.bool))

    def format_example(x):
        words = tf.strings.split(x["text"], sep=" ")
        index = _pronoun_index(words, x["span2_text"], tf.cast(x["span2_index"], tf.int32))
        marked = tf.strings.join(["*", x["span2_text"], "*"])
        stripped = tf.strings.regex_replace(words[index], r"[.,?!;:\"']+$", "")
        suffix = tf.strings.substr(words[index], tf.strings.length(stripped), -1)
        words = tf.tensor_scatter_nd_update(words, [[index]], [tf.strings.join([marked, suffix])])
        text = tf.strings.reduce_join(words, separator=" ")
        return {
            "inputs": tf.strings.join([label, text], separator=" "),
            "targets": x["span1_text"],
            "label": x["label"],
            "idx": x["idx"],
        }

    return dataset.map(format_example, num_parallel_calls=tf.data.AUTOTUNE)


def _pronoun_index(words: tf.Tensor, pronoun: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """`index` when `words[index]` is the pronoun, else the nearest word that is."""
    bare = tf.strings.regex_replace(words, r"[.,?!;:\"']+$", "")
    matches = tf.cast(tf.where(tf.equal(bare, pronoun))[:, 0], tf.int32)
    clipped = tf.clip_by_value(index, 0, tf.size(words) - 1)
    nearest = tf.gather(matches, tf.argmin(tf.abs(matches - index)))
    return tf.cond(
        tf.equal(words[clipped], pronoun) | tf.equal(tf.size(matches), 0),
        lambda: clipped,
        lambda: nearest,
    )


def dpr_simple(dataset: tf.data.Dataset, label: str = "wsc:") -> tf.data.Dataset:
    """Definite pronoun resolution in the WSC format: the first pronoun occurrence is marked.

    Example: {"sentence": "Bob asked Tom if he can lend some money.", "pronoun": "he",
    "candidates": ["Bob", "Tom"], "label": 1} ->
    {"inputs": "wsc: Bob asked Tom if *he* can lend some money.", "targets": "Tom"}.

    Args:
        dataset: TFDS `definite_pronoun_resolution` records.
        label: the input prefix.

    Returns:
        A dataset of {"inputs", "targets"}.
    """

    def format_example(x):
        # The pronoun as a word: after a space, before a space, period or comma.
        pattern = tf.strings.join([" (", x["pronoun"], ")( |\\.|,)"])
        text = tf.strings.regex_replace(x["sentence"], pattern, r" *\1*\2", replace_global=False)
        return {
            "inputs": tf.strings.join([label, text], separator=" "),
            "targets": tf.gather(x["candidates"], tf.cast(x["label"], tf.int32)),
        }

    return dataset.map(format_example, num_parallel_calls=tf.data.AUTOTUNE)


def record(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """ReCoRD: one example per correct answer (or one "<unk>" example when there is none).

    `@highlight` markers in the passage become sentence breaks.

    Example: {"passage": "The passage.", "query": "A @placeholder is a bird.",
    "entities": ["penguin", "potato"], "answers": ["penguin"], "idx": {"passage": 0,
    "query": 1}} -> {"inputs": "record query: A @placeholder is a bird. entities: penguin,
    potato passage: The passage.", "targets": "penguin", "answers": ["penguin"],
    "idx/passage": 0, "idx/query": 1}.

    Args:
        dataset: TFDS `super_glue/record` records.

    Returns:
        A dataset of {"inputs", "targets", "answers", "idx/passage", "idx/query"}.
    """

    def format_example(x):
        passage = tf.strings.regex_replace(
            x["passage"], "(\\.|\\?|\\!|\\\"|\\')\n@highlight\n", r"\1 "
        )
        passage = tf.strings.regex_replace(passage, "\n@highlight\n", ". ")
        inputs = tf.strings.join(
            [
                "record query:",
                x["query"],
                "entities:",
                tf.strings.reduce_join(x["entities"], separator=", "),
                "passage:",
                passage,
            ],
            separator=" ",
        )
        answers = x["answers"]
        targets = tf.cond(
            tf.size(answers) > 0, lambda: answers, lambda: tf.constant([UNKNOWN_LABEL])
        )
        count = tf.size(targets)
        return tf.data.Dataset.from_tensor_slices(
            {
                "inputs": tf.fill([count], inputs),
                "targets": targets,
                "answers": tf.broadcast_to(answers[tf.newaxis], [count, tf.size(answers)]),
                "idx/passage": tf.fill([count], x["idx"]["passage"]),
                "idx/query": tf.fill([count], x["idx"]["query"]),
            }
        )

    return dataset.flat_map(format_example)
