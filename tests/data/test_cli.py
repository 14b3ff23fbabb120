"""`t2t vocab` and `t2t cache` through the CLI entry point."""

import os

import pytest
import seqio

from t2t import cli


def test_vocab_trains_from_files(tmp_path, builtin_corpus, capsys):
    output = tmp_path / "spm" / "my.model"
    german = tmp_path / "de.txt"
    german.write_text(
        "".join(f"Das ist der Satz Nummer {i} in deutscher Sprache.\n" for i in range(300))
    )
    code = cli.main(
        [
            "vocab",
            "--output",
            str(output),
            "--source",
            builtin_corpus.corpus_path("validation"),
            "--german",
            str(german),
            "--ratio",
            "10:1:1:1",
            "--num_pieces",
            "500",
        ]
    )
    assert code == 0
    assert "vocabulary size 600 with sentinels" in capsys.readouterr().out
    vocabulary = seqio.SentencePieceVocabulary(str(output), extra_ids=100)
    assert vocabulary.encode("<extra_id_0>") == [599]


def test_vocab_reports_bad_sources(tmp_path, capsys):
    code = cli.main(
        ["vocab", "--output", str(tmp_path / "x.model"), "--source", str(tmp_path / "none*.txt")]
    )
    assert code == 2
    assert "No file matches" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["vocab", "--output", "x.model"])  # --source is required


def test_cache_shows_the_corpus(builtin_corpus, capsys):
    root = os.path.dirname(os.path.dirname(builtin_corpus.directory))
    assert cli.main(["cache", "--cache_dir", root]) == 0
    out = capsys.readouterr().out
    stats = builtin_corpus.stats
    assert f"{stats['corpus_train']['documents']} documents" in out
    assert "2048 ids with sentinels" in out
