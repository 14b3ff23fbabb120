"""`t2t train` fine-tunes every released-checkpoint fixture (micro scale), continues one's
Adafactor state and step, and refuses a checkpoint that contradicts the run's network."""

import json
import random

import pytest

from t2t import cli
from t2t.data import vocab
from t2t.data.tasks import text

from .test_released import WITH_LOGITS, fixture

TASK_PREFIX = "released_fixture_text"
TASK = f"{TASK_PREFIX}_span_corruption"


@pytest.fixture(scope="module")
def small_vocabulary_task(tmp_path_factory):
    """Registers TASK, span corruption over text of eight letters tokenized with 20 pieces +
    100 sentinels, which fits the fixtures' 128-row embeddings (a real run brings the
    release's own vocabulary; the fixtures come with none); returns the SentencePiece model."""
    root = tmp_path_factory.mktemp("text")
    rng = random.Random(0)
    lines = [
        " ".join(
            "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5))) for _ in range(30)
        )
        for _ in range(200)
    ]
    for split in ("train", "validation"):
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n")
    model = vocab.train_sentencepiece(lines, str(root / "letters.model"), num_pieces=20)
    splits = {split: str(root / f"{split}.txt") for split in ("train", "validation")}
    text.register_text_file_tasks(
        TASK_PREFIX, splits, vocab.load_vocabulary(model), objectives=("span_corruption",)
    )
    return model  # the registered task is TASK


def finetune(model_dir, init, steps, *extra) -> int:
    return cli.main(
        [
            "train",
            "--gin_file=gin/runs/finetune.gin",
            f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.INIT_CHECKPOINT='{init}'",
            f"--gin.MIXTURE_OR_TASK='{TASK}'",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}",
            f"--gin.TRAIN_STEPS={steps}",
            "--gin.BATCH_SIZE=8",
            "--gin.t2t.runs.EvalOptions.every=None",
            "--gin.EVAL_TASKS=[]",
            "--gin.t2t.runs.EvalOptions.evaluators=[]",
            "--gin.t2t.runs.EvalOptions.num_predictions=0",
            "--gin.t2t.runs.LoopOptions.log_every=1",
            "--gin.t2t.runs.LoopOptions.progress=False",
            "--gin.t2t.runs.CheckpointOptions.every=2",
            "--gin.t2t.models.model_for.loss_normalizing_factor='num_real_target_tokens'",
            *extra,
        ]
    )


def _metadata(model_dir, step):
    return json.loads((model_dir / "checkpoints" / str(step) / "metadata" / "metadata").read_text())


# t5x_legacy_tensorstore: fine-tuned below with its optimizer state, and from a bucket
# (tests/object_store/test_released_on_gcs.py).
@pytest.mark.parametrize("name", [n for n in WITH_LOGITS if n != "t5x_legacy_tensorstore"])
def test_finetuning_starts_from_each_fixture(name, small_vocabulary_task, tmp_path, capsys):
    extra = ["--gin.t2t.runs.checkpoint_model_config.scan_layers=True"] if name == "mtf_v11" else []
    assert finetune(tmp_path, fixture(name), 2, *extra) == 0
    out = capsys.readouterr().out
    assert f"Starting from {'mtf' if name.startswith('mtf') else 't5x'}" in out
    assert "trained steps 0 -> 2" in out
    origin = _metadata(tmp_path, 2)["initialized_from"]
    assert origin["kind"] in ("t5x", "t5x_orbax", "mtf") and origin["path"].startswith(
        fixture(name)
    )


def test_a_release_continues_with_its_own_adafactor_state_and_step(
    small_vocabulary_task, tmp_path, capsys
):
    state = [
        "--gin.t2t.runs.train.init_optimizer_state=True",
        "--gin.t2t.optim.adafactor.min_dim_size_to_factor=32",  # as the fixture was trained
    ]
    assert finetune(tmp_path / "run", fixture("t5x_legacy_tensorstore"), 4, *state) == 0
    assert "trained steps 2 -> 4" in capsys.readouterr().out
    assert _metadata(tmp_path / "run", 4)["initialized_from"]["optimizer_state"] is True
    # The run's default factoring keeps other slots than the checkpoint: said, nothing trained.
    assert finetune(tmp_path / "other", fixture("t5x_legacy_tensorstore"), 4, state[0]) == 2
    assert "factors this parameter differently" in capsys.readouterr().err
    assert not list((tmp_path / "other" / "checkpoints").glob("*/"))


def test_a_release_that_contradicts_the_runs_network_is_refused(
    small_vocabulary_task, tmp_path, capsys
):
    preset = [
        "--gin.MODEL_CONFIG=@t2t.nn.get_preset()",
        "--gin.t2t.nn.get_preset.name='tiny'",
        "--gin.t2t.nn.get_preset.vocab_size=512",
        "--gin.t2t.nn.get_preset.d_model=32",
        "--gin.t2t.nn.get_preset.num_heads=4",
        "--gin.t2t.nn.get_preset.d_kv=12",
        "--gin.t2t.nn.get_preset.d_ff=64",  # the checkpoint's is 80
    ]
    assert finetune(tmp_path, fixture("t5x_orbax"), 2, *preset) == 2
    err = capsys.readouterr().err
    assert "mlp/wi_0/kernel has shape (32, 80), but the model's" in err and "(32, 64)" in err
    assert "Traceback" not in err


def test_infer_reads_a_release_as_it_is(small_vocabulary_task, tmp_path, capsys):
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"inputs": "abc dea"}\n{"inputs": "hhg"}\n')
    argv = [
        "infer",
        f"--model_dir={fixture('mtf_v11')}",
        f"--input_file={inputs}",
        f"--output_file={tmp_path / 'out.jsonl'}",
        "--max_decode_length=4",
    ]
    assert cli.main(argv) == 2  # a release carries no vocabulary
    assert "carries no vocabulary; pass its SentencePiece model" in capsys.readouterr().err
    assert cli.main([*argv, f"--vocabulary_file={small_vocabulary_task}"]) == 0
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["inputs"] for r in records] == ["abc dea", "hhg"]
    assert all(isinstance(r["prediction"], str) for r in records)
    evaluate = ["eval", f"--model_dir={fixture('t5x_orbax')}", f"--tasks={TASK}"]
    assert cli.main(evaluate) == 2
    assert "released checkpoint, and nothing is written beside it" in capsys.readouterr().err
