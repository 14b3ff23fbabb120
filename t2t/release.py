"""Release directories: a checkpoint as HF transformers files, with its tokenizer, config and card.

`export` turns one checkpoint of a model directory into a directory anyone can load without t2t:

  config.json, model.safetensors      `T5ForConditionalGeneration.from_pretrained(dir)`
  generation_config.json              decoder start 0, EOS 1, PAD 0 (docs/spec.md section 1)
  spiece.model, tokenizer_config.json, special_tokens_map.json
                                      `T5Tokenizer.from_pretrained(dir)`: the SentencePiece model
                                      plus the 100 sentinels `<extra_id_0>` = last id, ...
  config.gin                          the run's operative gin config (when the run wrote one)
  t2t_metadata.json                   the checkpoint's metadata (step, data, tokens seen, ...)
  README.md                           the model card

Weights go through `t2t.checkpoints.hf.export_hf` (numpy only, no torch). Only the plain
encoder-decoder has a HF T5 layout; other architectures are refused with a clear error.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from t2t import files
from t2t.checkpoints import hf
from t2t.checkpoints import manager as manager_lib
from t2t.checkpoints import model_dir as model_dir_lib
from t2t.nn.config import TransformerConfig

TOKENIZER_FILE = "spiece.model"
METADATA_FILE = "t2t_metadata.json"
CARD_FILE = "README.md"


def export(
    model_dir: str,
    output_dir: str,
    *,
    step: int | None = None,
    vocabulary_file: str | None = None,
    eval_results: str | None = None,
    overwrite: bool = False,
) -> str:
    """Writes the release directory of one checkpoint (see the module docstring for its files).

    Every file gets the same permissions (0666 less the umask, as `open` gives).

    Args:
      model_dir: the run's model directory.
      output_dir: the release directory: new or empty (or, with `overwrite`, any directory
        outside the model directory; files of the same names are replaced).
      step: the checkpoint (default: the latest).
      vocabulary_file: the SentencePiece model (default: the one in the checkpoint metadata).
      eval_results: a `t2t eval` results JSON for the model card (default:
        `<model_dir>/eval/results.json` when it exists).
      overwrite: allow a non-empty `output_dir`.

    Returns:
      `output_dir`.

    Raises:
      ValueError: an architecture HF T5 cannot hold, or a vocabulary larger than the embedding.
    """
    _check_output_dir(model_dir, output_dir, overwrite)
    directory = model_dir_lib.ModelDir(model_dir)
    if step is not None:
        _check_architecture(directory.config(directory.resolve_step(step)))
    loaded = directory.load(step)  # the newest intact checkpoint when step is None
    step, config = loaded.step, loaded.config
    _check_architecture(config)
    vocabulary_file, extra_ids, pieces = _release_vocabulary(
        directory, step, config, vocabulary_file
    )
    metadata = loaded.metadata
    pure = loaded.params.to_pure_dict()
    hf.export_hf(output_dir, config, pure)
    _write_generation_config(output_dir)
    _write_tokenizer(output_dir, vocabulary_file, extra_ids, pieces, metadata)
    gin_config = directory.gin_config_path()
    if gin_config:
        files.copy(gin_config, files.join(output_dir, model_dir_lib.CONFIG_GIN))
    files.write_text(files.join(output_dir, METADATA_FILE), manager_lib.dumps_metadata(metadata))
    results_file = eval_results or files.join(directory.path, "eval", "results.json")
    results = _read_results(results_file, required=eval_results is not None)
    name, has_gin = files.basename(files.absolute(output_dir)), gin_config is not None
    card = model_card(
        config, metadata, num_params=_count(pure), results=results, has_gin=has_gin, name=name
    )
    files.write_text(files.join(output_dir, CARD_FILE), card)
    _uniform_modes(output_dir)
    return output_dir


def write_hf_directory(
    output_dir: str,
    config: TransformerConfig,
    params: dict,
    *,
    vocabulary_file: str | None = None,
    extra_ids: int = 100,
) -> str:
    """The HF files of a network and its parameters (no model card): `config.json`,
    `model.safetensors`, `generation_config.json` and, given a SentencePiece model, the
    tokenizer's files. What `t2t convert --to hf` writes for a checkpoint of another framework.
    """
    _check_architecture(config)
    hf.export_hf(output_dir, config, params)
    _write_generation_config(output_dir)
    if vocabulary_file is not None:
        pieces = _piece_names(vocabulary_file)
        _write_tokenizer(output_dir, vocabulary_file, extra_ids, pieces, {})
    _uniform_modes(output_dir)
    return output_dir


def _release_vocabulary(directory, step: int, config, vocabulary_file: str | None):
    """(file, sentinels, piece names) of the released vocabulary: `vocabulary_file` or the
    checkpoint's, refused when it has more ids than the model's embedding rows."""
    if vocabulary_file is None:
        vocabulary_file, extra_ids = directory.vocabulary_file(step)
    else:
        extra_ids = int(directory.metadata(step).get("vocabulary", {}).get("extra_ids", 100))
    pieces = _piece_names(vocabulary_file)
    if pieces["size"] + extra_ids > config.vocab_size:
        raise ValueError(
            f"The vocabulary {vocabulary_file} has {pieces['size']} pieces + {extra_ids} "
            f"sentinels, more than the model's {config.vocab_size} embedding rows; pass the "
            "vocabulary the model was trained with."
        )
    return vocabulary_file, extra_ids, pieces


def _check_output_dir(model_dir: str, output_dir: str, overwrite: bool) -> None:
    """A release never goes into the model directory, nor over files unless told to."""
    source, target = files.real(model_dir), files.real(output_dir)
    if target == source or target.startswith(source.rstrip("/") + "/"):
        raise ValueError(
            f"The release directory {output_dir} is inside the model directory {model_dir}; "
            "give --output_dir outside it (a release is a copy meant to be shared)."
        )
    held = files.listdir(output_dir) if files.isdir(output_dir) else []
    if held and not overwrite:
        raise FileExistsError(
            f"The release directory {output_dir} is not empty "
            f"({', '.join(held[:5])}...). Give a new or empty "
            "--output_dir, or pass --overwrite to replace files of the same names."
        )
    if not held and files.exists(output_dir) and not files.isdir(output_dir):
        raise FileExistsError(f"--output_dir {output_dir} is a file, not a directory.")


def _uniform_modes(directory: str) -> None:
    """Gives every file the mode `open` would (some writers make private 0600 temp files); an
    object store has no modes."""
    if files.is_remote(directory):
        return
    umask = os.umask(0)
    os.umask(umask)
    for name in files.listdir(directory):
        path = os.path.join(directory, name)
        if not files.isdir(path):
            os.chmod(
                path, 0o666 & ~umask
            )  # local path: checked local above (local path (checked above))


def _check_architecture(config: TransformerConfig) -> None:
    if config.architecture != "encoder_decoder":
        kind = {
            "decoder_only": "a decoder-only language model",
            "prefix_lm": "a decoder-only prefix LM",
            "encoder_decoder_shared": "an encoder-decoder sharing its stacks' parameters",
        }
        raise ValueError(
            f"This checkpoint is {kind.get(config.architecture, config.architecture)} "
            f"(architecture {config.architecture!r}); T5ForConditionalGeneration holds only the "
            "plain encoder-decoder (architecture 'encoder_decoder'), so it cannot be exported "
            "as a HF T5 release. Use the t2t checkpoint itself (t2t infer / t2t eval)."
        )


def _piece_names(vocabulary_file: str) -> dict[str, Any]:
    """The PAD/EOS/UNK piece strings and the piece count of a SentencePiece model."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=files.read_bytes(vocabulary_file))
    ids = {"pad": processor.pad_id(), "eos": processor.eos_id(), "unk": processor.unk_id()}
    if ids != {"pad": 0, "eos": 1, "unk": 2}:
        raise ValueError(
            f"{vocabulary_file} has PAD/EOS/UNK ids {ids}; T5 (and HF's T5Tokenizer) need 0, 1 "
            "and 2. Train vocabularies with `t2t vocab`."
        )
    return {
        "size": processor.get_piece_size(),
        **{name: processor.id_to_piece(i) for name, i in ids.items()},
    }


def _write_tokenizer(output_dir, vocabulary_file, extra_ids, pieces, metadata) -> None:
    files.copy(vocabulary_file, files.join(output_dir, TOKENIZER_FILE))
    sentinels = [f"<extra_id_{i}>" for i in range(extra_ids)]
    special = {
        "eos_token": pieces["eos"],
        "unk_token": pieces["unk"],
        "pad_token": pieces["pad"],
        "additional_special_tokens": sentinels,
    }
    lengths = metadata.get("task_feature_lengths") or {}
    tokenizer_config = {
        "tokenizer_class": "T5Tokenizer",
        "extra_ids": extra_ids,
        "model_max_length": int(lengths.get("inputs", 512)),
        **special,
    }
    for name, value in (
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", special),
    ):
        files.write_text(files.join(output_dir, name), json.dumps(value, indent=2))


def _write_generation_config(output_dir: str) -> None:
    generation = {"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}
    files.write_text(
        files.join(output_dir, "generation_config.json"), json.dumps(generation, indent=2)
    )


def _count(tree) -> int:
    if isinstance(tree, dict):
        return sum(_count(v) for v in tree.values())
    return int(np.prod(np.shape(tree)))


def _read_results(path: str, *, required: bool) -> dict[str, Any] | None:
    if not files.exists(path):
        if required:
            raise FileNotFoundError(f"No evaluation results at {path} (written by `t2t eval`).")
        return None
    return json.loads(files.read_text(path))


# -- the model card ------------------------------------------------------------------------------


def model_card(
    config: TransformerConfig,
    metadata: dict[str, Any],
    *,
    num_params: int,
    results: dict[str, Any] | None = None,
    has_gin: bool = False,
    name: str = "t2t model",
) -> str:
    """The README.md of a release: architecture, size, training, metrics, how to load it."""
    lines = [
        f"# {name}",
        "",
        "A T5-style text-to-text Transformer trained with t2t and exported in the HF "
        "transformers T5 format.",
        "",
        "## Architecture",
        "",
        "| field | value |",
        "|---|---|",
        f"| architecture | encoder-decoder, {_layout(config)} |",
        f"| parameters | {num_params:,} |",
        f"| layers (encoder / decoder) | {config.num_encoder_layers} / "
        f"{config.num_decoder_layers} |",
        f"| d_model / d_ff / d_kv / heads | {config.d_model} / {config.d_ff} / {config.d_kv} / "
        f"{config.num_heads} |",
        f"| feed-forward activations | {', '.join(config.mlp_activations)} |",
        f"| logits via the embedding | {config.logits_via_embedding} |",
        f"| vocabulary (embedding rows) | {config.vocab_size} |",
        f"| relative position buckets / max distance | {config.relative_attention_num_buckets} "
        f"/ {config.relative_attention_max_distance} |",
        "",
        "## Training",
        "",
        "| field | value |",
        "|---|---|",
    ]
    for key, label in (
        ("step", "steps"),
        ("tokens_seen", "tokens seen"),
        ("examples_seen", "examples seen"),
        ("mixture_or_task", "training data"),
        ("task_feature_lengths", "feature lengths"),
        ("averaged_steps", "averaged checkpoints"),
    ):
        if metadata.get(key) is not None:
            value = metadata[key]
            if isinstance(value, dict):
                value = ", ".join(f"{k} {v}" for k, v in value.items())
            elif isinstance(value, int):
                value = f"{value:,}"
            lines.append(f"| {label} | {value} |")
    lines += ["", *_metrics_section(results), *_loading_section(has_gin)]
    return "\n".join(lines) + "\n"


def _layout(config: TransformerConfig) -> str:
    if config.mlp_activations == ("relu",) and config.logits_via_embedding:
        return "T5 v1.0 layout (ReLU feed-forward, logits via the embedding)"
    if config.mlp_activations == ("gelu", "linear") and not config.logits_via_embedding:
        return "T5 v1.1 layout (gated GELU feed-forward, separate logits layer)"
    return "T5 layout"


def _metrics_section(results: dict[str, Any] | None) -> list[str]:
    if not results:
        return ["## Evaluation", "", "No `t2t eval` results were found for this run.", ""]
    steps = results.get("steps", {})
    final_step = max(steps, key=int) if steps else None
    lines = [
        "## Evaluation",
        "",
        f"Split `{results.get('split', 'validation')}`. Best checkpoint per task (as the T5 "
        f"paper reports results) and the metrics of the last evaluated step ({final_step}).",
        "",
        "| task | best step | best metrics | final metrics |",
        "|---|---|---|---|",
    ]
    for task, report in results.get("best", {}).get("tasks", {}).items():
        best = ", ".join(f"{m} {v:.2f}" for m, v in report["metrics"].items())
        final = ", ".join(
            f"{k.rpartition('/')[2]} {v:.2f}"
            for k, v in sorted(steps.get(final_step, {}).items())
            if k.rpartition("/")[0] == task
        )
        lines.append(f"| {task} | {report['best_step']} | {best} | {final} |")
    for benchmark, value in results.get("best", {}).get("averages", {}).items():
        lines.append(f"\n{benchmark} average of the best checkpoints: {value:.2f}")
    return lines + [""]


def _loading_section(has_gin: bool) -> list[str]:
    lines = [
        "## Loading",
        "",
        "```python",
        "from transformers import T5ForConditionalGeneration, T5Tokenizer",
        "",
        'model = T5ForConditionalGeneration.from_pretrained("path/to/this/directory")',
        'tokenizer = T5Tokenizer.from_pretrained("path/to/this/directory")',
        'inputs = tokenizer(["summarize: ..."], return_tensors="pt", padding=True)',
        "outputs = model.generate(**inputs, max_new_tokens=64)  # greedy, as t2t decodes",
        "print(tokenizer.batch_decode(outputs, skip_special_tokens=True))",
        "```",
        "",
        "Beam search as in the paper (width 4, length penalty alpha 0.6) is `t2t infer "
        "--beam_size=4 --alpha=0.6`; HF's `length_penalty` is a different formula.",
        "",
        "## Files",
        "",
        "- `config.json`, `model.safetensors`, `generation_config.json`: the HF T5 model",
        "- `spiece.model`, `tokenizer_config.json`, `special_tokens_map.json`: the SentencePiece "
        "vocabulary with 100 sentinels (`<extra_id_0>` is the last id)",
        f"- `{METADATA_FILE}`: the t2t checkpoint metadata",
    ]
    if has_gin:
        lines.append("- `config.gin`: the operative gin config of the training run")
    return lines
