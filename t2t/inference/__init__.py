"""Batched prediction and scoring of tasks, mixtures and files of examples; models or ensembles.

A `Predictor` runs a model wrapper's `predict_batch` (greedy, beam or sampling) and `score_batch`
over any number of examples in fixed-size batches, so each function compiles once; the last
batch is padded with copies of its last row and the copies' outputs dropped. Parameters are an
argument of every call, so evaluation reuses one `Predictor` for every checkpoint, and a tuple of
parameter sets decodes an ensemble whose logits are averaged before the softmax (paper section
3.6, `t2t.decoding.ensemble_tokens_to_logits`).

Examples reach the model through the same unpacked seqio feature converter evaluation uses
(`model.feature_converter`): task examples as their task makes them, file examples (JSONL
`{"inputs": ..., "targets"?: ...}` or TSV `inputs[<TAB>targets]`) tokenized with the checkpoint's
vocabulary and followed by EOS, as seqio tasks do. Results are written as JSONL records:

    {"inputs": "...", "prediction": "...", "target": "..."}      (predict; target when given)
    {"inputs": "...", "target": "...", "score": -3.21}           (score: log-likelihood)

Multi-host: with a `Partitioner`, every host walks the same examples, feeds its slice of each
global batch, and receives the whole batch's outputs (replicated), so all hosts write the same
records; write files from process 0 only.

Modules: `predictor` (the engine), `files` (text examples from JSONL/TSV files, and JSONL
records out), `tasks` (examples of registered tasks and mixtures), `run` (`infer`, the whole run).
"""

from t2t.inference.files import (
    DEFAULT_INPUTS_LENGTH,
    INPUT_FORMATS,
    convert,
    encode_examples,
    predict_examples,
    read_examples,
    score_examples,
    write_jsonl,
)
from t2t.inference.predictor import DEFAULT_MAX_DECODE_LENGTH, Example, Params, Predictor
from t2t.inference.run import infer
from t2t.inference.tasks import task_examples, task_records

__all__ = [
    "DEFAULT_INPUTS_LENGTH",
    "DEFAULT_MAX_DECODE_LENGTH",
    "INPUT_FORMATS",
    "Example",
    "Params",
    "Predictor",
    "convert",
    "encode_examples",
    "infer",
    "predict_examples",
    "read_examples",
    "score_examples",
    "task_examples",
    "task_records",
    "write_jsonl",
]
