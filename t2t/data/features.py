"""Which seqio feature converter turns task examples into model features, per architecture.

The paper's Table 2 architectures read different features:
  - `encoder_decoder`, `encoder_decoder_shared`: seqio `EncDecFeatureConverter` (encoder inputs,
    decoder targets shifted right, segment ids and positions when packed);
  - `prefix_lm`: seqio `PrefixLMFeatureConverter` concatenates inputs and targets into one decoder
    sequence, with `decoder_causal_attention` marking the fully visible input prefix;
  - `decoder_only`: the same concatenation under a plain causal mask (no
    `decoder_causal_attention`), `CausalConcatFeatureConverter` below;
  - a targets-only task (language modeling) on either decoder-only architecture: seqio
    `LMFeatureConverter`.
Packing is greedy and order-preserving: an example joins the current row only if all of its
features fit.

Over-length examples are trimmed, not refused: seqio's converters assert that every task feature
fits its length (seqio trims earlier, in `Task.get_dataset`), so examples that reach a converter
untrimmed (a dataset built by hand, a task read with `trim_output_features=False`) failed with a
tf.data assertion. t2t's converters cut each feature to its length first, as seqio's
`trim_and_pack` would, and with `count_trimmed=True` count the examples cut (`trimmed`) and say so
once. Counting is off where the data iterator is checkpointed (training): a counter is state that
tf.data cannot save with the iterator.

Worked example (docs/spec.md section 5), encoder-decoder, packed, lengths inputs 10 / targets 7:
  inputs [7,8,5,1], [8,4,9,3,1]; targets [3,9,1], [4,1] ->
  encoder_input_tokens  [7,8,5,1,8,4,9,3,1,0]   encoder_segment_ids [1,1,1,1,2,2,2,2,2,0]
  encoder_positions     [0,1,2,3,0,1,2,3,4,0]
  decoder_target_tokens [3,9,1,4,1,0,0]         decoder_input_tokens [0,3,9,0,4,0,0]
  decoder_loss_weights  [1,1,1,1,1,0,0]         decoder_segment_ids [1,1,1,2,2,0,0]
  decoder_positions     [0,1,2,0,1,0,0]
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import seqio
import tensorflow as tf

ARCHITECTURES = ("encoder_decoder", "encoder_decoder_shared", "decoder_only", "prefix_lm")


def trim_to_lengths(
    dataset: tf.data.Dataset, lengths: Mapping[str, int], counter: tf.Variable | None = None
) -> tf.data.Dataset:
    """Cuts each feature named in `lengths` to its length; counts cut examples in `counter`."""

    def trim(example):
        example = dict(example)
        cut = tf.constant(False)
        for name, length in lengths.items():
            if name in example and length is not None:
                cut = tf.logical_or(cut, tf.shape(example[name])[0] > length)
                example[name] = example[name][:length]
        if counter is not None:
            tf.cond(cut, lambda: counter.assign_add(1), lambda: tf.identity(counter))
        return example

    return dataset.map(trim, num_parallel_calls=tf.data.AUTOTUNE)


class _TrimsFirst:
    """Mixin for seqio converters: over-length examples are trimmed (see the module doc)."""

    def __init__(self, *args, count_trimmed: bool = False, trim: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self._counter = tf.Variable(0, dtype=tf.int64, trainable=False) if count_trimmed else None
        self._trim = trim
        self._reported = False

    @property
    def trimmed(self) -> int:
        """How many examples this converter has cut so far (0 unless `count_trimmed`)."""
        count = 0 if self._counter is None else int(self._counter.numpy())
        if count and not self._reported:
            self._reported = True
            print(
                f"note: {count} example(s) longer than the feature lengths were trimmed to fit "
                "(as seqio's trim_and_pack does).",
                file=sys.stderr,
            )
        return count

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]):
        if self._trim:
            ds = trim_to_lengths(ds, task_feature_lengths, self._counter)
        return super().__call__(ds, task_feature_lengths)


class EncDecFeatureConverter(_TrimsFirst, seqio.EncDecFeatureConverter):
    """seqio's encoder-decoder converter, trimming over-length examples."""


class LMFeatureConverter(_TrimsFirst, seqio.LMFeatureConverter):
    """seqio's language-model converter, trimming over-length examples."""


class PrefixLMFeatureConverter(_TrimsFirst, seqio.PrefixLMFeatureConverter):
    """seqio's prefix-LM converter, trimming over-length examples."""


class CausalConcatFeatureConverter(PrefixLMFeatureConverter):
    """Inputs and targets as one causally masked decoder sequence (the paper's "LM" row).

    Identical to seqio's prefix-LM conversion except that no `decoder_causal_attention` feature
    is produced, so the model applies its causal mask everywhere. By default the loss covers the
    targets only, as in the prefix LM.
    """

    MODEL_FEATURES = {
        name: spec
        for name, spec in seqio.PrefixLMFeatureConverter.MODEL_FEATURES.items()
        if name != "decoder_causal_attention"
    }

    def _convert_example(self, features: Mapping[str, tf.Tensor]) -> Mapping[str, tf.Tensor]:
        converted = dict(super()._convert_example(features))
        del converted["decoder_causal_attention"]
        return converted

    def get_model_feature_lengths(
        self, task_feature_lengths: Mapping[str, int]
    ) -> Mapping[str, int]:
        lengths = dict(super().get_model_feature_lengths(task_feature_lengths))
        del lengths["decoder_causal_attention"]
        return lengths


def feature_converter(
    architecture: str,
    *,
    has_inputs: bool = True,
    pack: bool = True,
    loss_on_targets_only: bool = True,
    count_trimmed: bool = False,
    trim: bool = True,
) -> seqio.FeatureConverter:
    """The feature converter for `architecture` on a task with or without an `inputs` feature.

    Args:
      architecture: one of ARCHITECTURES.
      has_inputs: whether the task has `inputs` (False for a targets-only LM task).
      pack: pack several examples per row (training) or pad each one (evaluation).
      loss_on_targets_only: for decoder-only architectures on an inputs/targets task, whether the
        loss skips the input part of the concatenated sequence.
      count_trimmed: count the over-length examples trimmed (not where the iterator is saved).
      trim: cut over-length examples; False for data `seqio.get_dataset` already trimmed (the
        training pipeline), which keeps the pipeline's tf.data graph, and so its saved
        iterator positions, as they were before converters trimmed.

    Raises:
      ValueError: for an unknown architecture, or an encoder-decoder with no inputs.
    """
    if architecture not in ARCHITECTURES:
        raise ValueError(f"Unknown architecture {architecture!r}; expected one of {ARCHITECTURES}.")
    if architecture.startswith("encoder_decoder"):
        if not has_inputs:
            raise ValueError(
                f"Architecture {architecture!r} needs tasks with an 'inputs' feature; this task has "
                "only 'targets'. Use a denoising or prefix objective, or a decoder-only architecture."
            )
        return EncDecFeatureConverter(pack=pack, count_trimmed=count_trimmed, trim=trim)
    if not has_inputs:
        return LMFeatureConverter(pack=pack, count_trimmed=count_trimmed, trim=trim)
    cls = PrefixLMFeatureConverter if architecture == "prefix_lm" else CausalConcatFeatureConverter
    return cls(
        loss_on_targets_only=loss_on_targets_only, pack=pack, count_trimmed=count_trimmed, trim=trim
    )


def task_has_inputs(provider: seqio.Task | seqio.Mixture) -> bool:
    """Whether a task (or every task of a mixture) has an `inputs` output feature."""
    return "inputs" in provider.output_features


def model_feature_lengths(
    converter: seqio.FeatureConverter, task_feature_lengths: Mapping[str, int]
) -> dict[str, int]:
    """The length of each model feature the converter emits (e.g. 512/114 -> encoder 512, decoder 114)."""
    return dict(converter.get_model_feature_lengths(task_feature_lengths))
