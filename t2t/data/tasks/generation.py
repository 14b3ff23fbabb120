"""Generation benchmarks of the paper: SQuAD, CNN/Daily Mail, WMT En-De / En-Fr / En-Ro.

Registers `squad` (question answering, EM and F1 against every gold answer), `cnn_dailymail`
(summarization, ROUGE), and `wmt_ende`, `wmt_enfr`, `wmt_enro` (translation, BLEU), on the TFDS
datasets the paper used.
"""

from __future__ import annotations

import functools

import seqio

from t2t import metrics
from t2t.data import vocab
from t2t.data.tasks import glue

SQUAD_TFDS_NAME = "squad/v1.1:3.0.0"
CNN_DAILYMAIL_TFDS_NAME = "cnn_dailymail:3.4.0"
# Task name -> (TFDS dataset, target language); the source language is English.
TRANSLATION = {
    "wmt_ende": ("wmt_t2t_translate/de-en:1.0.0", "de"),
    "wmt_enfr": ("wmt15_translate/fr-en:1.0.0", "fr"),
    "wmt_enro": ("wmt16_translate/ro-en:1.0.0", "ro"),
}
TASK_NAMES = ("squad", "cnn_dailymail", *TRANSLATION)


def register(vocabulary: seqio.Vocabulary | None = None) -> list[str]:
    """Registers the SQuAD, CNN/DM and WMT tasks; returns their names."""
    import preprocessors
    from preprocessors import postprocessors

    vocabulary = vocabulary or vocab.default_vocabulary()
    glue.register_tfds_task(
        "squad",
        SQUAD_TFDS_NAME,
        preprocessors.squad,
        vocabulary,
        metric_fns=[metrics.squad_em_f1],
        postprocess_fn=postprocessors.qa,
        splits={"train": "train", "validation": "validation"},
    )
    summarize = functools.partial(
        preprocessors.summarize, article_key="article", summary_key="highlights"
    )
    glue.register_tfds_task(
        "cnn_dailymail", CNN_DAILYMAIL_TFDS_NAME, summarize, vocabulary, metric_fns=[metrics.rouge]
    )
    for name, (tfds_name, language) in TRANSLATION.items():
        translate = functools.partial(
            preprocessors.translate, source_language="en", target_language=language
        )
        glue.register_tfds_task(name, tfds_name, translate, vocabulary, metric_fns=[metrics.bleu])
    return list(TASK_NAMES)


TASKS = register()
