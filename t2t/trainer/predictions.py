"""A few examples decoded by the trained model, shown as text at the end of a run.

For denoising objectives this shows the corrupted input with its sentinels, the target (the
dropped spans after their sentinels) and what the model predicts, greedily decoded by the
inference engine.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import seqio

from t2t.data import pipeline
from t2t.decoding import EOS_ID, DecodingConfig
from t2t.partitioning import Partitioner


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


def show_examples(
    model,
    params,
    partitioner: Partitioner,
    config: pipeline.PipelineConfig,
    vocabulary: seqio.Vocabulary,
    num_examples: int,
) -> list[Prediction]:
    """Greedily decodes the first `num_examples` examples of `config`'s data, for display.

    Every host reads the same examples (the first of the whole split, not of its shard) and
    decodes them with the inference engine (`t2t.inference.Predictor`), as `t2t infer` would.

    Args:
      model: an encoder-decoder `t2t.models` wrapper.
      params: its parameters (sharded as the partitioner says).
      partitioner: the run's partitioner.
      config: the data (read unpacked, unshuffled, unsharded); its batch size is replaced.
      vocabulary: decodes ids to text.
      num_examples: how many examples to show.

    Raises:
      ValueError: for a decoder-only model (its prompts come from a prefix-LM batch; use
        `t2t infer`).
    """
    from t2t import inference

    if model.config.is_decoder_only:
        raise ValueError(
            "Showing predictions here supports encoder-decoder models; decoder-only "
            "models decode after a prompt (use the inference tools)."
        )
    data_size = partitioner.mesh.shape[partitioner.batch_axis] if partitioner.batch_axis else 1
    size = -(-num_examples // data_size) * data_size  # a multiple of the data axis
    config = dataclasses.replace(
        config,
        global_batch_size=num_examples,
        pack=False,
        shuffle=False,
        num_epochs=1,
        shard_index=0,
        num_shards=1,
    )
    # One batch of at most num_examples rows (fewer when the split is smaller), split into rows.
    batch = next(pipeline.build_dataset(config).as_numpy_iterator())
    count = len(batch["decoder_target_tokens"])
    rows = [{name: value[i] for name, value in batch.items()} for i in range(count)]
    predictor = inference.Predictor(
        model, DecodingConfig(method="greedy"), batch_size=size, partitioner=partitioner
    )
    tokens, _ = predictor.predict(params, rows)
    return [
        Prediction(
            inputs=_text(vocabulary, row["encoder_input_tokens"]),
            targets=_text(vocabulary, row["decoder_target_tokens"]),
            prediction=_text(vocabulary, output),
        )
        for row, output in zip(rows, tokens)
    ]


def format_predictions(predictions: list[Prediction]) -> str:
    """The predictions as indented text blocks, one per example."""
    blocks = []
    for i, p in enumerate(predictions, 1):
        blocks.append(
            f"[{i}] input:      {p.inputs}\n    target:     {p.targets}\n"
            f"    prediction: {p.prediction}"
        )
    return "\n".join(blocks)
