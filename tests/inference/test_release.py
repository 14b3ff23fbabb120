"""`t2t export`: the release directory loads in HF transformers (model and tokenizer) and gives the
same greedy output as t2t for the same text inputs."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from t2t import cli, inference, models, release

from .conftest import NUM_PIECES, random_params, tiny_config, write_model_dir

TEXTS = [
    "Return the absolute value of a number.",
    "The quick brown fox jumps over the lazy dog.",
    "if x == 1: return y",
]
LENGTH = 8


def ordinary_text_params(config, seed):
    """Random parameters whose greedy outputs are ordinary pieces (never PAD, UNK or a sentinel),
    so both tokenizers render them as the same text.

    NOTE: every embedding row gets a large constant in dimension 0, so the decoder's final
    normalized state has a large positive dimension 0 at every position; a negative weight in
    that row of the logits kernel then rules a token out whatever the input.
    """
    params = random_params(config, seed)
    pure = params.to_pure_dict()
    pure["token_embedder"]["embedding"][:, 0] = 8.0
    kernel = pure["decoder"]["logits_dense"]["kernel"]  # [D, V]
    kernel[0, :] = 0.0
    kernel[0, [0, 2, *range(NUM_PIECES, config.vocab_size)]] = -30.0
    nnx.replace_by_pure_dict(params, pure)
    return params


@pytest.fixture(scope="module")
def released(tmp_path_factory, config, vocabulary_file):
    root = tmp_path_factory.mktemp("release")
    params = ordinary_text_params(config, 3)
    model_dir = write_model_dir(root / "run", config, {500: params}, vocabulary_file)
    os.makedirs(os.path.join(model_dir, "eval"))
    with open(os.path.join(model_dir, "eval", "results.json"), "w") as f:
        json.dump(
            {
                "split": "validation",
                "steps": {"500": {"eval_x/accuracy": 61.5}},
                "best": {
                    "tasks": {
                        "eval_x": {"best_step": 500, "score": 61.5, "metrics": {"accuracy": 61.5}}
                    },
                    "averages": {},
                },
            },
            f,
        )
    output = str(root / "t2t-tiny-release")
    assert (
        cli.main(
            [
                "export",
                "--gin_file=gin/runs/export.gin",
                f"--gin.MODEL_DIR='{model_dir}'",
                f"--output_dir={output}",
            ]
        )
        == 0
    )
    return output, params


def test_release_files_and_model_card(released, config):
    output, _ = released
    assert sorted(os.listdir(output)) == sorted(
        [
            "README.md",
            "config.gin",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "special_tokens_map.json",
            "spiece.model",
            "t2t_metadata.json",
            "tokenizer_config.json",
        ]
    )
    card = open(os.path.join(output, "README.md")).read()
    num_params = sum(
        int(np.prod(x.shape)) for x in jax.tree.leaves(models.model_for(config).abstract_params())
    )
    for expected in (
        f"| parameters | {num_params:,} |",
        "| steps | 500 |",
        "| tokens seen | 500,000 |",
        "| training data | builtin_span_corruption |",
        "| eval_x | 500 | accuracy 61.50 | accuracy 61.50 |",
        "T5ForConditionalGeneration.from_pretrained",
    ):
        assert expected in card
    assert json.load(open(os.path.join(output, "t2t_metadata.json")))["step"] == 500


def test_hf_loads_the_release_and_decodes_like_t2t(released, config, vocabulary):
    import torch
    from transformers import T5ForConditionalGeneration, T5Tokenizer

    output, params = released
    tokenizer = T5Tokenizer.from_pretrained(output)
    hf_model = T5ForConditionalGeneration.from_pretrained(output).eval()
    for text in TEXTS:  # the same ids, EOS appended
        assert tokenizer(text).input_ids == list(vocabulary.encode(text)) + [1]
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == NUM_PIECES + 99
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        generated = hf_model.generate(**batch, max_new_tokens=LENGTH, do_sample=False, num_beams=1)
    hf_texts = tokenizer.batch_decode(generated, skip_special_tokens=True)

    predictor = inference.Predictor(
        models.model_for(config), batch_size=4, max_decode_length=LENGTH
    )
    records = inference.predict_examples(
        predictor, params, vocabulary, [{"inputs": t} for t in TEXTS]
    )
    assert hf_texts == [r["prediction"] for r in records]
    assert len(set(hf_texts)) == len(TEXTS) and all(hf_texts)  # varied, non-empty outputs


@pytest.mark.parametrize("architecture", ["decoder_only", "encoder_decoder_shared"])
def test_architectures_without_a_hf_t5_layout_are_refused(tmp_path, vocabulary_file, architecture):
    extra = {"num_encoder_layers": 0} if architecture == "decoder_only" else {}
    config = tiny_config(architecture=architecture, **extra)
    model_dir = write_model_dir(
        tmp_path / "run", config, {1: random_params(config, 0)}, vocabulary_file
    )
    with pytest.raises(ValueError, match="T5ForConditionalGeneration holds only the plain"):
        release.export(model_dir, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")
