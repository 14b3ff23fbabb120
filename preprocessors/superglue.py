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
    """SuperGLUE WSC as "mark the pronoun, name the referent", byte for byte as the `t5` package.

    The word at `span2_index` (space-separated) is the pronoun: it is replaced by `*pronoun*` set
    off by single spaces, so a pronoun that ends the text leaves a trailing space ("... thanked
    *him* "). When that word is not `span2_text` (two records of the data set: the index points at
    the word before, or the pronoun has punctuation attached), the nearest word that is the
    pronoun once trailing punctuation is stripped is marked instead, its punctuation set apart by
    a space, and the text's trailing spaces dropped: what the `t5` package writes by hand for
    those two records ('"Good for *him* ," he said.'); on other such records it stops with an
    assertion error. One difference is kept on purpose: the `t5` package marks the pronoun by
    replacing every standalone "X" of the text, so a text with the word "X" in it gets the
    pronoun there too; here only the pronoun is marked.

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
        pronoun = x["span2_text"]
        marked = tf.strings.join(["*", pronoun, "*"])
        index = tf.clip_by_value(tf.cast(x["span2_index"], tf.int32), 0, tf.size(words) - 1)

        def at_index():  # the t5 package's "before X after"
            before = tf.strings.reduce_join(words[:index], separator=" ")
            after = tf.strings.reduce_join(words[index + 1 :], separator=" ")
            return tf.cond(
                index > 0,
                lambda: tf.strings.join([before, marked, after], separator=" "),
                lambda: tf.strings.join([marked, after], separator=" "),
            )

        def nearest():  # the t5 package's hand-written records, as a rule
            found = _pronoun_index(words, pronoun, index)
            bare = tf.strings.regex_replace(words[found], _TRAILING_PUNCTUATION, "")
            suffix = tf.strings.substr(words[found], tf.strings.length(bare), -1)
            word = tf.cond(
                tf.strings.length(suffix) > 0,
                lambda: tf.strings.join([marked, suffix], separator=" "),
                lambda: marked,
            )
            text = tf.strings.reduce_join(
                tf.tensor_scatter_nd_update(words, [[found]], [word]), separator=" "
            )
            return tf.strings.regex_replace(text, r"\s+$", "")

        text = tf.cond(tf.equal(words[index], pronoun), at_index, nearest)
        return {
            "inputs": tf.strings.join([label, text], separator=" "),
            "targets": x["span1_text"],
            "label": x["label"],
            "idx": x["idx"],
        }

    return dataset.map(format_example, num_parallel_calls=tf.data.AUTOTUNE)


_TRAILING_PUNCTUATION = r"[.,?!;:\"']+$"


def _pronoun_index(words: tf.Tensor, pronoun: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
    """The nearest word to `index` that is the pronoun once trailing punctuation is stripped
    (`index` when none is)."""
    bare = tf.strings.regex_replace(words, _TRAILING_PUNCTUATION, "")
    matches = tf.cast(tf.where(tf.equal(bare, pronoun))[:, 0], tf.int32)
    return tf.cond(
        tf.equal(tf.size(matches), 0),
        lambda: index,
        lambda: tf.gather(matches, tf.argmin(tf.abs(matches - index))),
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
