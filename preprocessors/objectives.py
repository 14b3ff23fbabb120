"""The pretraining objectives of the paper's Table 3, each a short chain of small steps.

Every objective reads the tokenized `targets` feature of a text task (one document per example) and
yields `inputs` and `targets` token sequences (`full_lm` yields only `targets`). The chain is: one
random chunk per document -> (concatenate documents) -> split into raw segments -> noise mask ->
corruption of inputs and targets. The steps run on ragged batches (see `batching`); only the
dataset boundary is per example.

Objectives do not append EOS: a task follows them with `seqio.preprocessors.append_eos_after_trim`,
and lengths here leave one token of room for it. Their token features carry a ragged rank-0 type
spec (see `batching.unbatch_sequences`): inside a seqio Task nothing changes, but a bare
`padded_batch` on an objective's output needs a `map` first.

The paper's example, "Thank you for inviting me to your party last week .":

| objective | inputs | targets |
|---|---|---|
| `prefix_lm` | Thank you for inviting | me to your party last week . |
| `bert_style` | Thank you `<M>` `<M>` me to your party apple week . | (original text) |
| `deshuffle` | party me for your to . last you inviting week Thank | (original text) |
| `mass_style` | Thank you `<M>` `<M>` me to your party `<M>` week . | (original text) |
| `iid_noise_replace_spans` | Thank you `<X>` me to your party `<Y>` week . | `<X>` for inviting `<Y>` last `<Z>` |
| `iid_noise_drop_tokens` | Thank you me to your party week . | for inviting last |
| `span_corruption` | Thank you `<X>` to `<Y>` week . | `<X>` for inviting me `<Y>` your party last `<Z>` |

Objectives with a random noise mask accept `noise_mask_fn` to replace it (a function
`(lengths [B], seed [2]) -> bool [B, W]`, see `noise`); the paper's comparisons of noise patterns
are built that way, and tests use it to fix a mask by hand.
"""

import functools
from typing import Callable, Mapping, Optional

import seqio
import tensorflow as tf

from preprocessors import batching, chunking, corruption, noise

NoiseMaskFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
CorruptionFn = Callable[..., tf.RaggedTensor]
SequenceLength = Mapping[str, int]
OutputFeatures = Mapping[str, seqio.Feature]

# ------------------------------------------------------------------------------ the common step


def denoise_batches(
    batches: tf.data.Dataset,
    vocabulary: seqio.Vocabulary,
    noise_mask_fn: NoiseMaskFn,
    inputs_fn: CorruptionFn,
    targets_fn: Optional[CorruptionFn] = None,
) -> tf.data.Dataset:
    """Noise mask and corruption over a dataset of ragged `targets` batches, seeded per batch.

    Args:
        batches: elements `{"targets": int [B, None]}` of raw segments.
        vocabulary: the shared inputs/targets vocabulary (sentinels, mask and random tokens).
        noise_mask_fn: `(lengths [B], seed) -> bool [B, W]`.
        inputs_fn: `(tokens, noise_mask, vocabulary, seed) -> [B, None]` for the inputs.
        targets_fn: the same for the targets; None keeps the original segment as targets.

    Returns:
        Elements `{"inputs": [B, None], "targets": [B, None]}`.
    """

    def corrupt(batch, seed):
        tokens = batch["targets"]
        mask_seed, inputs_seed, targets_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, 3)
        )
        dense_mask = noise_mask_fn(tokens.row_lengths(), mask_seed)
        mask = tf.RaggedTensor.from_tensor(dense_mask, lengths=tokens.row_lengths())
        inputs = inputs_fn(tokens, mask, vocabulary, inputs_seed)
        targets = (
            tokens if targets_fn is None else targets_fn(tokens, mask, vocabulary, targets_seed)
        )
        return {"inputs": inputs, "targets": targets}

    return batching.map_with_seed(batches, corrupt)


def denoise(
    dataset: tf.data.Dataset,
    output_features: OutputFeatures,
    noise_mask_fn: NoiseMaskFn,
    inputs_fn: CorruptionFn,
    targets_fn: Optional[CorruptionFn] = None,
    batch_size: int = 64,
) -> tf.data.Dataset:
    """Turns each `targets` segment into an `inputs`/`targets` pair with a mask and two corruptions.

    Example (docs/spec.md section 4, vocab_size 32100): with a mask marking `C D` and `H` of
    `A B C D E F G H`, `noise_span_to_unique_sentinel` / `nonnoise_span_to_unique_sentinel` give
    inputs `A B 32099 E F G 32098` and targets `32099 C D 32098 H`.

    Args:
        dataset: examples with a tokenized 1-D `targets` feature (segments, already split).
        output_features: the task's features; `targets` supplies the vocabulary.
        noise_mask_fn: see `denoise_batches`.
        inputs_fn: see `denoise_batches`.
        targets_fn: see `denoise_batches`.
        batch_size: segments corrupted together (affects speed only).

    Returns:
        A dataset of `{"inputs": [None], "targets": [None]}`.
    """
    vocabulary = shared_vocabulary(output_features)
    batches = batching.batch_sequences(dataset, "targets", batch_size)
    batches = denoise_batches(batches, vocabulary, noise_mask_fn, inputs_fn, targets_fn)
    return batching.unbatch_sequences(batches)


# ------------------------------------------------------------------------------- the objectives


def span_corruption(
    dataset: tf.data.Dataset,
    sequence_length: SequenceLength,
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    concatenate_documents: bool = True,
    noise_mask_fn: Optional[NoiseMaskFn] = None,
) -> tf.data.Dataset:
    """Random-span corruption, the T5 objective (docs/spec.md section 4).

    Segments of the raw length from `random_spans_helper` fill `sequence_length['inputs']` exactly
    once EOS is appended; the targets need the helper's targets length (114 for 512 at the
    defaults), and a shorter `sequence_length['targets']` raises. A segment of a single token (the
    tail of a document group) is dropped: it cannot hold both a kept and a noise span.

    Example (vocab_size 32100): segment `A B C D E F G H` with noise spans `C D` and `H` ->
    inputs `A B 32099 E F G 32098`, targets `32099 C D 32098 H`.

    Args:
        dataset: documents with a tokenized 1-D `targets` feature.
        sequence_length: `{"inputs": ..., "targets": ...}`.
        output_features: the task's features; `targets` supplies the vocabulary.
        noise_density: fraction of tokens corrupted (paper sweep: 0.10, 0.15, 0.25, 0.50).
        mean_noise_span_length: mean corrupted span length (paper sweep: 2, 3, 5, 10).
        concatenate_documents: join each group of 128 chunks before splitting (the paper); False
            splits each document on its own, leaving short examples for packing to combine.
        noise_mask_fn: replaces `random_spans_noise_mask` with the given density and span length.

    Returns:
        A dataset of `{"inputs": [None], "targets": [None]}` without EOS.
    """
    vocabulary = shared_vocabulary(output_features)
    inputs_length = _required_length(sequence_length, "inputs", "span_corruption")
    raw_length, _ = noise.random_spans_helper(
        inputs_length,
        noise_density,
        mean_noise_span_length,
        targets_length=sequence_length.get("targets"),
    )
    if noise_mask_fn is None:
        _check_sentinels(vocabulary, raw_length, noise_density, mean_noise_span_length)
        noise_mask_fn = functools.partial(
            noise.random_spans_noise_mask,
            noise_density=noise_density,
            mean_noise_span_length=mean_noise_span_length,
        )
    batches = _raw_segments(dataset, raw_length, concatenate_documents)
    batches = batching.map_batches(batches, _drop_single_tokens)
    batches = denoise_batches(
        batches,
        vocabulary,
        noise_mask_fn,
        corruption.noise_span_to_unique_sentinel,
        corruption.nonnoise_span_to_unique_sentinel,
    )
    return batching.unbatch_sequences(batches)


def iid_noise_replace_spans(
    dataset: tf.data.Dataset,
    sequence_length: SequenceLength,
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    noise_mask_fn: Optional[NoiseMaskFn] = None,
) -> tf.data.Dataset:
    """i.i.d. token noise; each run of noise tokens becomes one sentinel (the paper's baseline).

    Example (vocab_size 32100): `1 2 3 4 5 6`, noise `3 4` and `6` -> inputs `1 2 32099 5 32098`,
    targets `32099 3 4 32098 6`.
    """
    return _iid_objective(
        dataset,
        sequence_length,
        output_features,
        noise_density,
        noise_mask_fn,
        corruption.noise_span_to_unique_sentinel,
        corruption.nonnoise_span_to_unique_sentinel,
    )


def iid_noise_drop_tokens(
    dataset: tf.data.Dataset,
    sequence_length: SequenceLength,
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    noise_mask_fn: Optional[NoiseMaskFn] = None,
) -> tf.data.Dataset:
    """i.i.d. token noise; noise tokens are dropped from the inputs and are the targets.

    Example: `1 2 3 4 5 6`, noise `3 4` and `6` -> inputs `1 2 5`, targets `3 4 6`.
    """
    return _iid_objective(
        dataset,
        sequence_length,
        output_features,
        noise_density,
        noise_mask_fn,
        corruption.drop_noise_tokens,
        corruption.drop_nonnoise_tokens,
    )


def bert_style(
    dataset: tf.data.Dataset,
    sequence_length: SequenceLength,
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    mask_rate: float = 0.9,
    random_rate: float = 0.1,
    noise_mask_fn: Optional[NoiseMaskFn] = None,
) -> tf.data.Dataset:
    """BERT-style: corrupt 15% of tokens (mask / random / keep) and reconstruct the whole text.

    The defaults are the paper's (section 3.3.1, Table 3): of the corrupted tokens 90% become the
    mask token and 10% a random token. BERT's own split is `mask_rate=0.8, random_rate=0.1`
    (10% kept unchanged); from gin, `bert_style.mask_rate = 0.8`.

    Example (vocab_size 32100, mask_rate 1.0): `1 2 3 4 5 6`, noise `3 4` -> inputs
    `1 2 32099 32099 5 6`, targets `1 2 3 4 5 6`.
    """
    corruption.check_replacement_rates(mask_rate, random_rate)
    inputs_fn = functools.partial(
        corruption.noise_token_to_mask_or_random, mask_rate=mask_rate, random_rate=random_rate
    )
    return _iid_objective(
        dataset, sequence_length, output_features, noise_density, noise_mask_fn, inputs_fn, None
    )


def mass_style(
    dataset: tf.data.Dataset,
    sequence_length: SequenceLength,
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    noise_mask_fn: Optional[NoiseMaskFn] = None,
) -> tf.data.Dataset:
    """MASS-style: every noise token becomes the mask token; reconstruct the whole text.

    Example (vocab_size 32100): `1 2 3 4 5 6`, noise `3 4` -> inputs `1 2 32099 32099 5 6`,
    targets `1 2 3 4 5 6`.
    """
    return _iid_objective(
        dataset,
        sequence_length,
        output_features,
        noise_density,
        noise_mask_fn,
        corruption.noise_token_to_sentinel,
        None,
    )


def deshuffle(
    dataset: tf.data.Dataset,
    sequence_length: SequenceLength,
    output_features: OutputFeatures,
    noise_mask_fn: Optional[NoiseMaskFn] = None,
) -> tf.data.Dataset:
    """Deshuffling: the inputs are the segment's tokens in random order, the targets the original.

    Example: `5 6 7` -> inputs one of the 6 orders of `5 6 7`, targets `5 6 7`. With a
    `noise_mask_fn` only the marked tokens are shuffled among themselves.
    """
    return _iid_objective(
        dataset,
        sequence_length,
        output_features,
        None,
        noise_mask_fn or noise.full_mask,
        corruption.permute_noise_tokens,
        None,
    )


def prefix_lm(
    dataset: tf.data.Dataset,
    sequence_length: SequenceLength,
    output_features: OutputFeatures,
    noise_mask_fn: Optional[NoiseMaskFn] = None,
) -> tf.data.Dataset:
    """Prefix LM: split each segment at a uniformly random point into inputs and targets.

    Documents are chunked and split (not concatenated, as in the t5 package) into segments that fit
    `sequence_length['inputs']`; the prefix length is uniform in [1, L - 1]. `noise_mask_fn`
    marks the prefix.

    Example: "Thank you for inviting me to your party last week ." with a prefix of 4 tokens ->
    inputs "Thank you for inviting", targets "me to your party last week .".
    """
    vocabulary = shared_vocabulary(output_features)
    length = chunking.length_leaving_room_for_eos("inputs", sequence_length, output_features)
    batches = _raw_segments(dataset, length, concatenate_documents=False)
    batches = denoise_batches(
        batches,
        vocabulary,
        noise_mask_fn or noise.random_prefix_mask,
        corruption.drop_nonnoise_tokens,
        corruption.drop_noise_tokens,
    )
    return batching.unbatch_sequences(batches)


def full_lm(
    dataset: tf.data.Dataset,
    sequence_length: SequenceLength,
    output_features: OutputFeatures,
) -> tf.data.Dataset:
    """Full language modeling for decoder-only models: EOS between documents, fixed-length targets.

    One random chunk per document, EOS after each document (the document separator), all
    concatenated and split to fill `sequence_length['targets']` (one token less when the targets
    feature appends EOS).

    Example (targets length 4, targets without EOS): documents `5 6 7` and `8 9` -> targets
    `5 6 7 1`, `8 9 1`.

    Returns:
        A dataset of `{"targets": [None]}`.
    """
    vocabulary = shared_vocabulary(output_features)
    length = chunking.length_leaving_room_for_eos("targets", sequence_length, output_features)
    eos = vocabulary.eos_id
    if eos is None:
        raise ValueError(f"full_lm separates documents with EOS, but {vocabulary} has no eos_id")
    batches = batching.batch_sequences(dataset, "targets", batching.DOCUMENTS_PER_BATCH)
    batches = chunking.chunk_batches(batches, "targets", chunking.MAX_CHUNK_LENGTH)

    def append_separator(batch):
        tokens = batch["targets"]
        separators = tf.fill([tokens.nrows(), 1], tf.cast(eos, tokens.dtype))
        return {"targets": tf.concat([tokens, separators], axis=1)}

    batches = batching.map_batches(batches, append_separator)
    batches = chunking.concat_batches(batches, "targets")
    batches = chunking.split_batches(batches, "targets", length)
    return batching.unbatch_sequences(batches)


# ----------------------------------------------------------------------------------- the pieces


def _iid_objective(
    dataset: tf.data.Dataset,
    sequence_length: SequenceLength,
    output_features: OutputFeatures,
    noise_density: Optional[float],
    noise_mask_fn: Optional[NoiseMaskFn],
    inputs_fn: CorruptionFn,
    targets_fn: Optional[CorruptionFn],
) -> tf.data.Dataset:
    """Chunk, concatenate, split to the inputs length (less EOS), i.i.d. mask, corrupt."""
    vocabulary = shared_vocabulary(output_features)
    length = chunking.length_leaving_room_for_eos("inputs", sequence_length, output_features)
    if noise_mask_fn is None:
        if not 0.0 < noise_density < 1.0:
            raise ValueError(
                f"noise_density must lie strictly between 0 and 1, got {noise_density}"
            )
        noise_mask_fn = functools.partial(noise.iid_noise_mask, noise_density=noise_density)
    batches = _raw_segments(dataset, length, concatenate_documents=True)
    batches = denoise_batches(batches, vocabulary, noise_mask_fn, inputs_fn, targets_fn)
    return batching.unbatch_sequences(batches)


def _raw_segments(
    dataset: tf.data.Dataset, segment_length: int, concatenate_documents: bool
) -> tf.data.Dataset:
    """Ragged batches of raw segments: chunk per document, optionally concatenate, split."""
    batches = batching.batch_sequences(dataset, "targets", batching.DOCUMENTS_PER_BATCH)
    batches = chunking.chunk_batches(batches, "targets", chunking.MAX_CHUNK_LENGTH)
    if concatenate_documents:
        batches = chunking.concat_batches(batches, "targets")
    return chunking.split_batches(batches, "targets", segment_length)


def _drop_single_tokens(batch):
    """Drops 1-token segments: they cannot hold both a kept and a noise span."""
    tokens = batch["targets"]
    return {"targets": tf.ragged.boolean_mask(tokens, tokens.row_lengths() > 1)}


def shared_vocabulary(output_features: OutputFeatures) -> seqio.Vocabulary:
    """The `targets` vocabulary, which must also be the `inputs` vocabulary when there is one."""
    if "targets" not in output_features:
        raise ValueError(
            f"objectives read the tokenized 'targets' feature, but output_features has only "
            f"{sorted(output_features)}; add a 'targets' seqio.Feature"
        )
    vocabulary = output_features["targets"].vocabulary
    if "inputs" in output_features and output_features["inputs"].vocabulary != vocabulary:
        raise ValueError(
            "objectives build inputs from the targets' tokens, so 'inputs' and 'targets' must "
            f"share one vocabulary; got {output_features['inputs'].vocabulary} and {vocabulary}"
        )
    return vocabulary


def _required_length(sequence_length: SequenceLength, key: str, objective: str) -> int:
    if sequence_length is None or sequence_length.get(key) is None:
        raise ValueError(
            f"{objective} needs sequence_length[{key!r}], got {sequence_length}; pass "
            f"sequence_length to Task.get_dataset"
        )
    return int(sequence_length[key])


def _check_sentinels(
    vocabulary: seqio.Vocabulary, raw_length: int, noise_density: float, mean_span: float
) -> None:
    """Raises when a full segment would need more sentinels than the vocabulary's extra ids."""
    num_noise = min(max(int(round(raw_length * noise_density)), 1), raw_length - 1)
    num_spans = max(int(round(num_noise / mean_span)), 1)
    if num_spans > vocabulary.extra_ids:
        raise ValueError(
            f"span corruption of {raw_length}-token segments makes {num_spans} spans, one sentinel "
            f"each, but the vocabulary has {vocabulary.extra_ids} extra ids; use a vocabulary "
            f"with more extra ids (seqio.SentencePieceVocabulary(path, extra_ids=100)) or "
            f"longer spans"
        )
