"""A few examples decoded by the trained model, shown as text at the end of a run.

For denoising objectives this shows the corrupted input with its sentinels, the target (the
dropped spans after their sentinels) and what the model predicts, greedily decoded with the
model wrapper's `predict_batch`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np
import seqio

from t2t.data import pipeline
from t2t.decoding import EOS_ID
from t2t.partitioning import Partitioner
from t2t.trainer import batches


@dataclasses.dataclass(frozen=True)
class Prediction:
    inputs: str
    targets: str
    prediction: str


def _text(vocabulary: seqio.Vocabulary, tokens: np.ndarray) -> str:
    """Decodes ids up to (not including) the first EOS, padding dropped."""
    ids = [int(t) for t in tokens]
    if EOS_ID in ids:
        ids = ids[: ids.index(EOS_ID)]
    return vocabulary.decode([t for t in ids if t != 0])


def predict_examples(
    model, params, partitioner: Partitioner, config: pipeline.PipelineConfig,
    vocabulary: seqio.Vocabulary, num_examples: int,
) -> list[Prediction]:
    """Greedily decodes the first `num_examples` examples of `config`'s data.

    Args:
      model: an encoder-decoder `t2t.models` wrapper.
      params: its parameters (sharded as the partitioner says).
      partitioner: the run's partitioner.
      config: the data (read unpacked, unshuffled); its batch size is replaced.
      vocabulary: decodes ids to text.
      num_examples: how many examples to show.

    Raises:
      ValueError: for a decoder-only model (its prompts come from a prefix-LM batch; use
        `t2t infer`).
    """
    if model.config.is_decoder_only:
        raise ValueError("Showing predictions here supports encoder-decoder models; decoder-only "
                         "models decode after a prompt (use the inference tools).")
    data_size = partitioner.mesh.shape[partitioner.batch_axis] if partitioner.batch_axis else 1
    size = -(-num_examples // data_size) * data_size  # a multiple of the data axis
    config = dataclasses.replace(config, global_batch_size=size, pack=False, shuffle=False,
                                 num_epochs=1)
    local = next(batches.eval_batches(config, num_batches=1)())
    batch = partitioner.make_global_batch(local)
    decode = jax.jit(functools.partial(model.predict_batch, method="greedy"))
    with partitioner.context():
        tokens = np.asarray(jax.device_get(decode(params, batch)))
    rows = min(num_examples, int(np.sum(np.any(local["decoder_target_tokens"] != 0, axis=1))))
    return [
        Prediction(
            inputs=_text(vocabulary, local["encoder_input_tokens"][i]),
            targets=_text(vocabulary, local["decoder_target_tokens"][i]),
            prediction=_text(vocabulary, tokens[i]),
        )
        for i in range(rows)
    ]


def format_predictions(predictions: list[Prediction]) -> str:
    """The predictions as indented text blocks, one per example."""
    blocks = []
    for i, p in enumerate(predictions, 1):
        blocks.append(f"[{i}] input:      {p.inputs}\n    target:     {p.targets}\n"
                      f"    prediction: {p.prediction}")
    return "\n".join(blocks)
