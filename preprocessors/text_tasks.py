"""Question answering, summarization and translation as text-to-text pairs (paper Appendix D).

- SQuAD: `question: <question> context: <context>` -> the first answer, with spaces around
  punctuation as in the `t5` package's SQuAD task.
- CNN/Daily Mail: `summarize: <article>` -> the highlights.
- WMT: `translate English to German: <text>` -> the translation (French, Romanian likewise).

Records are TFDS-shaped (`squad`, `cnn_dailymail`, `wmt*_translate/<pair>`).
"""

from typing import Dict

import tensorflow as tf

# Language names for the translation prefix, by TFDS language code.
LANGUAGE_NAMES: Dict[str, str] = {
    "en": "English",
    "de": "German",
    "fr": "French",
    "ro": "Romanian",
    "cs": "Czech",
    "fi": "Finnish",
    "ru": "Russian",
    "tr": "Turkish",
    "et": "Estonian",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "kk": "Kazakh",
    "gu": "Gujarati",
    "hi": "Hindi",
    "zh": "Chinese",
    "ja": "Japanese",
}


def pad_punctuation(text: tf.Tensor) -> tf.Tensor:
    """Spaces around every punctuation mark, runs of whitespace collapsed to one space.

    Example: "Hyperbaric (high-pressure) medicine." -> "Hyperbaric ( high - pressure ) medicine . "
    """
    text = tf.strings.regex_replace(text, r"([[:punct:]])", r" \1 ")
    return tf.strings.regex_replace(text, r"\s+", " ")


def squad(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """SQuAD: question and context in, the first answer out; punctuation padded with spaces.

    Example: {"id": "q1", "question": "Who?", "context": "Ann (a cat).",
    "answers": {"text": ["Ann"], "answer_start": [0]}} -> {"inputs": "question: Who ? context:
    Ann ( a cat ) . ", "targets": "Ann", "id": "q1", "question": "Who ? ", "context":
    "Ann ( a cat ) . ", "answers": ["Ann"]}.

    Args:
        dataset: TFDS `squad` records.

    Returns:
        A dataset of {"inputs", "targets", "id", "question", "context", "answers"}; `answers`
        keeps every reference answer for evaluation.
    """

    def format_example(x):
        answers = pad_punctuation(x["answers"]["text"])
        question = pad_punctuation(x["question"])
        context = pad_punctuation(x["context"])
        inputs = tf.strings.join(["question:", question, "context:", context], separator=" ")
        return {
            "inputs": tf.strings.regex_replace(inputs, r"\s+", " "),
            "targets": answers[0],
            "id": x["id"],
            "question": question,
            "context": context,
            "answers": answers,
        }

    return dataset.map(format_example, num_parallel_calls=tf.data.AUTOTUNE)


def summarize(
    dataset: tf.data.Dataset, article_key: str = "article", summary_key: str = "highlights"
) -> tf.data.Dataset:
    """Summarization: `summarize: <article>` -> the summary.

    Example: {"article": "Long text.", "highlights": "Short."} ->
    {"inputs": "summarize: Long text.", "targets": "Short."}.
    """

    def format_example(x):
        inputs = tf.strings.join(["summarize:", x[article_key]], separator=" ")
        return {"inputs": inputs, "targets": x[summary_key]}

    return dataset.map(format_example, num_parallel_calls=tf.data.AUTOTUNE)


def translate(
    dataset: tf.data.Dataset, source_language: str, target_language: str
) -> tf.data.Dataset:
    """Translation: `translate <Source> to <Target>: <text>` -> the translation.

    Example (en -> de): {"en": "That is good.", "de": "Das ist gut."} ->
    {"inputs": "translate English to German: That is good.", "targets": "Das ist gut."}.

    Args:
        dataset: TFDS `wmt*_translate` records, one string feature per language code.
        source_language: the code of the input language ("en").
        target_language: the code of the output language ("de", "fr", "ro", ...).

    Returns:
        A dataset of {"inputs", "targets"}.

    Raises:
        ValueError: for a language code without a name here.
    """
    names = []
    for code in (source_language, target_language):
        if code[:2] not in LANGUAGE_NAMES:
            raise ValueError(
                f"no English name for language code {code!r}; known codes: {sorted(LANGUAGE_NAMES)}"
            )
        names.append(LANGUAGE_NAMES[code[:2]])
    prefix = f"translate {names[0]} to {names[1]}: "

    def format_example(x):
        return {
            "inputs": tf.strings.join([prefix, x[source_language]]),
            "targets": x[target_language],
        }

    return dataset.map(format_example, num_parallel_calls=tf.data.AUTOTUNE)
