"""`t2t.inference`: records written for JSONL/TSV files and tasks, scoring equal to `score_batch`,
and ensembles equal to greedy decoding on hand-averaged logits."""

import functools
import json

import jax
import numpy as np
import pytest
import seqio

from t2t import cli, inference, models
from t2t.checkpoints import model_dir as model_dir_lib

from .conftest import random_params, tiny_config, uncached_greedy, write_model_dir

TEXTS = [
    ("The quick brown fox jumps over the lazy dog.", "A fox."),
    ("Return the value of the named attribute of object.", "getattr"),
    ("if x == 1: return y", "branch"),
]
LENGTH = 6  # output tokens decoded


@pytest.fixture(scope="module")
def model(config):
    return models.model_for(config)


@pytest.fixture(scope="module")
def predictor(model):
    return inference.Predictor(model, batch_size=2, max_decode_length=LENGTH)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, config, params_a, params_b, vocabulary_file):
    return write_model_dir(
        tmp_path_factory.mktemp("run"), config, {10: params_a, 20: params_b}, vocabulary_file
    )


def _input_ids(vocabulary):
    return [list(vocabulary.encode(text)) + [1] for text, _ in TEXTS]


def _write_jsonl(path, with_targets=True):
    with open(path, "w") as f:
        for text, target in TEXTS:
            f.write(
                json.dumps({"inputs": text, **({"targets": target} if with_targets else {})}) + "\n"
            )


def test_infer_jsonl_writes_inputs_predictions_and_targets(
    model_dir, model, params_b, vocabulary, tmp_path
):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_jsonl(source)
    code = cli.main(
        [
            "infer",
            "--gin_file=gin/runs/infer.gin",
            f"--gin.MODEL_DIR='{model_dir}'",
            f"--input_file={source}",
            f"--output_file={output}",
            "--batch_size=2",
            f"--max_decode_length={LENGTH}",
        ]
    )  # the latest step: params_b
    assert code == 0
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(records) == len(TEXTS)
    expected = uncached_greedy(model, [params_b], _input_ids(vocabulary), LENGTH)
    for record, (text, target), tokens in zip(records, TEXTS, expected):
        assert record == {"inputs": text, "target": target, "prediction": vocabulary.decode(tokens)}
        assert record["prediction"]  # a non-empty text, so the comparison above means something


def test_infer_first_cache_length_reaches_the_predictor(
    model_dir, model, params_b, vocabulary, tmp_path, capsys
):
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_jsonl(source)
    args = [
        "infer",
        "--gin_file=gin/runs/infer.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--input_file={source}",
        f"--output_file={output}",
        "--batch_size=2",
        f"--max_decode_length={LENGTH}",
    ]
    assert cli.main(args + ["--first_cache_length=0"]) == 2
    assert "Expected first_cache_length to be a positive int, got 0" in capsys.readouterr().err
    # Phases of 2, 4 and 6 cached positions: the same tokens as decoding without a cache.
    assert cli.main(args + ["--first_cache_length=2"]) == 0
    records = [json.loads(line) for line in output.read_text().splitlines()]
    expected = uncached_greedy(model, [params_b], _input_ids(vocabulary), LENGTH)
    assert [r["prediction"] for r in records] == [vocabulary.decode(t) for t in expected]


def test_tsv_without_targets_gives_the_same_predictions(predictor, params_a, vocabulary, tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"{text}\n" for text, _ in TEXTS))
    examples = inference.read_examples(str(path))
    assert examples == [{"inputs": text} for text, _ in TEXTS]
    records = inference.predict_examples(predictor, params_a, vocabulary, examples)
    labeled = inference.predict_examples(
        predictor, params_a, vocabulary, [{"inputs": t, "targets": g} for t, g in TEXTS]
    )
    assert [sorted(r) for r in records] == [["inputs", "prediction"]] * len(TEXTS)
    assert [r["prediction"] for r in records] == [r["prediction"] for r in labeled]


def test_scores_equal_score_batch(predictor, model, params_a, vocabulary):
    records = inference.score_examples(
        predictor, params_a, vocabulary, [{"inputs": t, "targets": g} for t, g in TEXTS]
    )
    inputs = np.zeros((len(TEXTS), 64), np.int32)  # padded wider than the predictor's rows
    targets = np.zeros((len(TEXTS), 16), np.int32)
    for row, (text, target) in enumerate(TEXTS):
        ids, target_ids = list(vocabulary.encode(text)) + [1], list(vocabulary.encode(target)) + [1]
        inputs[row, : len(ids)], targets[row, : len(target_ids)] = ids, target_ids
    batch = {
        "encoder_input_tokens": inputs,
        "decoder_target_tokens": targets,
        "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_loss_weights": (targets > 0).astype(np.int32),
    }
    expected = np.asarray(jax.jit(model.score_batch)(params_a, batch))
    np.testing.assert_allclose([r["score"] for r in records], expected, rtol=1e-5)
    assert [r["target"] for r in records] == [g for _, g in TEXTS]
    assert len(set(np.round(expected, 3))) == len(TEXTS)  # different targets, different scores


def test_ensemble_of_identical_checkpoints_is_the_single_model(
    predictor, model, params_a, vocabulary
):
    examples = [{"inputs": text} for text, _ in TEXTS]
    single = inference.predict_examples(predictor, params_a, vocabulary, examples)
    doubled = inference.predict_examples(predictor, (params_a, params_a), vocabulary, examples)
    assert single == doubled


def test_ensemble_of_two_averages_logits(predictor, model, params_a, params_b, vocabulary):
    examples = [{"inputs": text} for text, _ in TEXTS]
    ensemble = [
        r["prediction"]
        for r in inference.predict_examples(predictor, (params_a, params_b), vocabulary, examples)
    ]
    expected = uncached_greedy(model, [params_a, params_b], _input_ids(vocabulary), LENGTH)
    assert ensemble == [vocabulary.decode(tokens) for tokens in expected]
    for params in (params_a, params_b):
        alone = inference.predict_examples(predictor, params, vocabulary, examples)
        assert ensemble != [r["prediction"] for r in alone]


def test_ensemble_members_from_model_dir_steps(model_dir, params_a, params_b):
    loaded, params = model_dir_lib.load_members(model_dir, ["10", "20"])
    assert loaded.step == 10 and len(params) == 2
    np.testing.assert_array_equal(
        params[1].to_pure_dict()["decoder"]["logits_dense"]["kernel"],
        params_b.to_pure_dict()["decoder"]["logits_dense"]["kernel"],
    )
    loaded, params = model_dir_lib.load_members(None, [f"{model_dir}@10"])
    assert loaded.step == 10
    assert model_dir_lib.parse_member("/runs/b", None) == ("/runs/b", None)
    with pytest.raises(ValueError, match="is a step; pass model_dir"):
        model_dir_lib.load_members(None, ["10"])


def test_task_records_carry_task_inputs_targets(predictor, model, params_a, vocabulary, tmp_path):
    from t2t.data.tasks import text

    path = tmp_path / "task.tsv"
    path.write_text("".join(f"{t}\t{g}\n" for t, g in TEXTS))
    name = "infer_test_tsv_task"
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.TextLineDataSource({"validation": str(path)}),
        preprocessors=[
            functools.partial(text.parse_tsv, field_names=("inputs", "targets")),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=text.output_features(vocabulary),
    )
    records = list(inference.task_records(predictor, params_a, name))
    expected = uncached_greedy(model, [params_a], _input_ids(vocabulary), LENGTH)
    assert records == [
        {"task": name, "inputs": t, "target": g, "prediction": vocabulary.decode(tokens)}
        for (t, g), tokens in zip(TEXTS, expected)
    ]
    scored = list(inference.task_records(predictor, params_a, name, mode="score"))
    direct = inference.score_examples(
        predictor, params_a, vocabulary, [{"inputs": t, "targets": g} for t, g in TEXTS]
    )
    np.testing.assert_allclose(
        [r["score"] for r in scored], [r["score"] for r in direct], rtol=1e-5
    )


def test_a_vocabulary_larger_than_the_embedding_is_refused(
    vocabulary, vocabulary_file, tmp_path, capsys
):
    # Ids past the embedding's last row read NaN: every prediction and score would be garbage.
    from t2t.data.tasks import text

    config = tiny_config(vocab_size=256)  # the vocabulary has 512 ids
    small = write_model_dir(tmp_path / "small", config, {1: random_params(config, 0)}, None)
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write_jsonl(source)
    name = "infer_test_large_vocabulary"
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.TextLineDataSource({"validation": str(source)}),
        preprocessors=[],
        output_features=text.output_features(vocabulary),
    )
    common = ["infer", "--gin_file=gin/runs/infer.gin", f"--gin.MODEL_DIR='{small}'"]
    for flags, expected in (
        (
            [f"--input_file={source}", f"--vocabulary_file={vocabulary_file}"],
            f"The vocabulary {vocabulary_file} has 512 ids but the model's embedding only 256",
        ),
        (
            [f"--task={name}"],
            f"Task {name}'s 'inputs' vocabulary has 512 ids but the model's embedding only 256",
        ),
    ):
        assert cli.main([*common, *flags, f"--output_file={output}"]) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err, err
        assert not output.exists()


@pytest.mark.parametrize(
    "content,match",
    [
        ('{"inputs": "a"}\n{"input": "b"}\n', r"in\.jsonl:2: expected"),
        ('{"inputs": "a"}\nnot json\n', r"in\.jsonl:2: not a JSON object"),
    ],
)
def test_malformed_input_files_name_the_line(tmp_path, content, match):
    path = tmp_path / "in.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        inference.read_examples(str(path))


def test_sharded_prediction_equals_single_device(model_dir, predictor, vocabulary):
    from t2t import partitioning

    partitioner = partitioning.make_partitioner(data=-1, model=2)  # 4 x 2 on 8 CPU devices
    loaded, params = model_dir_lib.load_members(model_dir, step=10, partitioner=partitioner)
    kernel = params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert len(kernel.sharding.device_set) == 8  # restored straight into the mesh
    sharded = inference.Predictor(
        models.model_for(loaded.config),
        batch_size=4,
        max_decode_length=LENGTH,
        partitioner=partitioner,
    )
    examples = [{"inputs": text} for text, _ in TEXTS]
    single, _ = model_dir_lib.load_members(model_dir, step=10)
    assert inference.predict_examples(
        sharded, params, vocabulary, examples
    ) == inference.predict_examples(predictor, single.params, vocabulary, examples)


def test_decoding_flags_reach_the_run_as_one_config(monkeypatch, tmp_path):
    from t2t import decoding, runs

    seen = {}
    monkeypatch.setattr(runs, "infer", lambda **kwargs: seen.update(kwargs))
    assert (
        cli.main(
            [
                "infer",
                f"--model_dir={tmp_path}",
                "--input_file=in.jsonl",
                "--output_file=out.jsonl",
                "--beam_size=3",
                "--beam_rule=hf",
                "--top_k=5",
                "--batch_size=2",
            ]
        )
        == 0
    )
    assert seen["decoding_config"] == decoding.DecodingConfig(
        method="beam", beam_size=3, beam_rule="hf", top_k=5
    )
    assert seen["batch_size"] == 2 and "beam_size" not in seen
