"""Pure tf.data preprocessors for text-to-text tasks: the paper's objectives and task formats.

Every public function takes a `tf.data.Dataset` first and returns one, taking `sequence_length` and
`output_features` by keyword where it needs them, so it can be listed in a `seqio.Task`'s
preprocessors as is (bind knobs with `functools.partial`). Random choices are stateless and seeded
through seqio (`seqio.map_over_dataset(num_seeds=1)`), so `Task.get_dataset(seed=...)` reproduces
its output. Nothing here imports `t2t`.

- `chunking`: one random chunk per document, concatenation, fixed-length segments.
- `noise`: noise masks and the span-corruption length helper `random_spans_helper`.
- `corruption`: how a noise mask turns tokens into inputs and targets.
- `objectives`: the paper's Table 3 objectives, composed from the above.
- `tokenization`: a batched drop-in for `seqio.preprocessors.tokenize`.
- `classification`, `superglue`, `text_tasks`: task text formats (paper Appendix D) on TFDS records.
- `postprocessors`: decoded text back to labels and numbers, never raising. The generic two are
  exported here; the task-specific ones (`multirc`, `record`, `qa`, `wsc_simple`) stay in
  `preprocessors.postprocessors`, since `record` and `wsc_simple` here name the text formats.
"""

from preprocessors.chunking import (
    reduce_concat_tokens,
    select_random_chunk,
    split_tokens,
    split_tokens_to_inputs_length,
    split_tokens_to_targets_length,
)
from preprocessors.classification import CLASSIFICATION_FORMATS, glue, stsb, text_preprocessor
from preprocessors.corruption import (
    drop_noise_tokens,
    drop_nonnoise_tokens,
    noise_span_to_unique_sentinel,
    noise_token_to_mask_or_random,
    noise_token_to_sentinel,
    nonnoise_span_to_unique_sentinel,
    permute_noise_tokens,
    sentinel_id,
)
from preprocessors.noise import (
    iid_noise_mask,
    noise_counts,
    random_prefix_mask,
    random_spans_helper,
    random_spans_noise_mask,
)
from preprocessors.objectives import (
    bert_style,
    denoise,
    deshuffle,
    full_lm,
    iid_noise_drop_tokens,
    iid_noise_replace_spans,
    mass_style,
    prefix_lm,
    span_corruption,
)
from preprocessors.postprocessors import string_label_to_class_id, string_to_float
from preprocessors.superglue import dpr_simple, record, wsc_simple
from preprocessors.text_tasks import squad, summarize, translate
from preprocessors.tokenization import tokenize
