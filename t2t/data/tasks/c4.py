"""Every pretraining objective of the paper on TFDS `c4/en`, and the paper's sweeps.

Registers `c4_<objective>` for each of `text.OBJECTIVES`; `c4_span_corruption` is the T5
default, trained with task feature lengths inputs 512 / targets 114 (DEFAULT_FEATURE_LENGTHS:
568 raw tokens become 512 inputs and 114 targets with EOS at noise density 0.15, mean span 3).
Also registers the paper's sweeps: i.i.d. corruption rates 10/15/25/50% (Table 6) as
`c4_iid_noise_replace_spans_rate<percent>` and span lengths 2/3/5/10 (Table 7) as
`c4_span_corruption_span<length>`, and span corruption on `c4/en.noclean`, C4 without its
heuristic filters (Table 8), as `c4_unfiltered_span_corruption`. On any corpus the same sweeps
are one gin binding of the objective's knob (`span_corruption.mean_noise_span_length = 10.0`,
see `t2t.runs`). The vocabulary is `vocab.default_vocabulary()` (`$T2T_VOCABULARY`, else T5's
public model).
"""

from __future__ import annotations

import seqio

from t2t.data import vocab
from t2t.data.tasks import text

TFDS_NAME = "c4/en:3.1.0"
UNFILTERED_TFDS_NAME = "c4/en.noclean:3.1.0"
DEFAULT_FEATURE_LENGTHS = {"inputs": 512, "targets": 114}
CORRUPTION_RATES = (10, 15, 25, 50)
MEAN_SPAN_LENGTHS = (2, 3, 5, 10)


def register(vocabulary: seqio.Vocabulary | None = None, tfds_name: str = TFDS_NAME) -> list[str]:
    """Registers the C4 tasks with `vocabulary` (default: `vocab.default_vocabulary()`)."""
    vocabulary = vocabulary or vocab.default_vocabulary()
    source = seqio.TfdsDataSource(tfds_name, splits=("train", "validation"))
    names = []
    for objective in text.OBJECTIVES:
        names.append(f"c4_{objective}")
        text.register_pretraining_task(names[-1], source, objective, vocabulary)
    for rate in CORRUPTION_RATES:
        names.append(f"c4_iid_noise_replace_spans_rate{rate}")
        text.register_pretraining_task(
            names[-1], source, "iid_noise_replace_spans", vocabulary, noise_density=rate / 100
        )
    for span in MEAN_SPAN_LENGTHS:
        names.append(f"c4_span_corruption_span{span}")
        text.register_pretraining_task(
            names[-1], source, "span_corruption", vocabulary, mean_noise_span_length=float(span)
        )
    names.append("c4_unfiltered_span_corruption")
    text.register_pretraining_task(
        names[-1],
        seqio.TfdsDataSource(UNFILTERED_TFDS_NAME, splits=("train", "validation")),
        "span_corruption",
        vocabulary,
    )
    return names


TASKS = register()
