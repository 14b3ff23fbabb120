"""A model directory carries its tokenizer: copied to another place (the original vocabulary
gone) it infers with no flags, and the tasks with the default vocabulary read the directory's
copy; a HF directory's `spiece.model` is the tokenizer of a run that starts from it."""

import json
import shutil

from t2t import cli, runs
from t2t.checkpoints import model_dir as model_dir_lib
from t2t.data import vocab

from .conftest import write_model_dir


def test_a_copied_model_dir_infers_with_no_flags(tmp_path, config, params_b, vocabulary_file):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    original = elsewhere / "tiny.model"
    shutil.copyfile(vocabulary_file, original)
    run = write_model_dir(tmp_path / "run", config, {10: params_b}, str(original))
    runs.write_run_files(run, config, vocabulary_file=str(original))
    copy = tmp_path / "run" / model_dir_lib.VOCABULARY_FILE
    assert copy.read_bytes() == original.read_bytes()

    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    shutil.rmtree(run)
    shutil.rmtree(elsewhere)  # the recorded path no longer exists anywhere
    assert model_dir_lib.ModelDir(str(moved)).vocabulary_file()[0] == str(
        moved / model_dir_lib.VOCABULARY_FILE
    )
    source, output = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps({"inputs": "def f(x): return x"}) + "\n")
    assert (
        cli.main(
            [
                "infer",
                f"--model_dir={moved}",
                f"--input_file={source}",
                f"--output_file={output}",
                "--max_decode_length=4",
            ]
        )
        == 0
    )
    (record,) = [json.loads(line) for line in output.read_text().splitlines()]
    assert "prediction" in record

    # Tasks registered with the default vocabulary read the directory's copy when evaluated.
    default = vocab.default_vocabulary()
    assert runs.use_carried_vocabulary(str(moved)) == str(moved / model_dir_lib.VOCABULARY_FILE)
    assert default.sentencepiece_model_file == str(moved / model_dir_lib.VOCABULARY_FILE)
    assert default.vocab_size == vocab.load_vocabulary(vocabulary_file).vocab_size == 512


def test_a_hf_directory_tokenizer_is_the_runs_tokenizer(tmp_path, vocabulary_file):
    hf = tmp_path / "t5-tiny"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    shutil.copyfile(vocabulary_file, hf / "spiece.model")
    assert runs.use_carried_vocabulary(str(tmp_path / "new_run"), str(hf)) == str(
        hf / "spiece.model"
    )
    assert vocab.default_vocabulary().sentencepiece_model_file == str(hf / "spiece.model")
    assert runs.use_carried_vocabulary(str(tmp_path / "new_run")) is None  # nothing carried
