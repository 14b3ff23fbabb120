"""Vocabulary: T5's special ids and sentinels, checked against seqio and SentencePiece."""

import os

import pytest
import sentencepiece as spm
import seqio

from t2t.data import text_sources, vocab

TEXT = "Return the number of items in a container. The argument may be a sequence."


def test_special_ids_are_t5s(builtin_vocabulary):
    processor = spm.SentencePieceProcessor(model_file=builtin_vocabulary.sentencepiece_model_file)
    assert [processor.id_to_piece(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert processor.bos_id() == -1
    assert (builtin_vocabulary.pad_id, builtin_vocabulary.eos_id, builtin_vocabulary.unk_id) == (
        0,
        1,
        2,
    )


def test_sentinels_count_down_from_the_last_id(builtin_vocabulary):
    size = builtin_vocabulary.vocab_size
    assert size == 1948 + 100
    for i in (0, 1, 57, 99):
        (encoded,) = builtin_vocabulary.encode(f"<extra_id_{i}>")
        assert encoded == vocab.sentinel_id(builtin_vocabulary, i) == size - 1 - i
        assert builtin_vocabulary.decode([size - 1 - i]) == f"<extra_id_{i}>"
    with pytest.raises(ValueError, match="100 extra ids"):
        vocab.sentinel_id(builtin_vocabulary, 100)


def test_round_trip_matches_sentencepiece_and_seqio_tf(builtin_vocabulary):
    processor = spm.SentencePieceProcessor(model_file=builtin_vocabulary.sentencepiece_model_file)
    ids = builtin_vocabulary.encode(TEXT)
    assert ids == processor.encode(TEXT)
    assert max(ids) < processor.get_piece_size()  # text never lands on a sentinel
    assert builtin_vocabulary.decode(ids) == TEXT
    assert builtin_vocabulary.encode_tf(TEXT).numpy().tolist() == ids
    with_sentinel = builtin_vocabulary.encode("Return <extra_id_0> items.")
    assert builtin_vocabulary.vocab_size - 1 in with_sentinel
    assert builtin_vocabulary.decode(with_sentinel) == "Return <extra_id_0> items."


def test_padded_vocab_size():
    class Fake:
        vocab_size = 32100

    assert vocab.padded_vocab_size(Fake()) == 32128


def test_training_lines_split_long_documents():
    # Same numbers as the `training_lines` docstring.
    assert list(vocab.training_lines(["One two. Three four five."], max_bytes=12)) == [
        "One two.",
        "Three four",
        "five.",
    ]
    long_document = " ".join(["word"] * 3000)
    lines = list(vocab.training_lines([long_document]))
    assert all(len(line.encode()) <= 4000 for line in lines)
    assert " ".join(lines) == long_document


def test_train_from_files_with_language_mixture(tmp_path, builtin_corpus):
    english = builtin_corpus.corpus_path("train")
    other = []
    for language, word in (("de", "Zeichenkette"), ("fr", "chaîne"), ("ro", "șir")):
        path = tmp_path / f"{language}.txt"
        path.write_text("".join(f"{word} {language} numéro {i} ist gut.\n" for i in range(200)))
        other.append(str(path))
    weights = text_sources.parse_ratio("10:1:1:1", 4)
    sources = [text_sources.TextSource(s, w) for s, w in zip([english] + other, weights)]
    documents = list(text_sources.mix_documents(sources, weighted=True))
    # Romanian runs out first (200 documents), which ends the mixture with exact proportions.
    ro = sum(d.endswith("gut.") and " ro " in d for d in documents)
    de = sum(d.endswith("gut.") and " de " in d for d in documents)
    assert ro == 200 and abs(de - 200) <= 1
    assert abs((len(documents) - 3 * 200) - 10 * 200) <= 10
    model = vocab.train_sentencepiece(documents, str(tmp_path / "mixed.model"), num_pieces=600)
    mixed = seqio.SentencePieceVocabulary(model, extra_ids=100)
    assert mixed.vocab_size == 700
    assert mixed.decode(mixed.encode("șir chaîne Zeichenkette")) == "șir chaîne Zeichenkette"
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp-")]


def test_weighted_round_robin_order(tmp_path):
    # Same as the `mix_documents` docstring: weights 2:1 give A B A A B A A B A.
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("A\n" * 6)
    b.write_text("B\n" * 3)
    sources = [text_sources.TextSource(str(a), 2), text_sources.TextSource(str(b), 1)]
    assert "".join(text_sources.mix_documents(sources, weighted=True)) == "ABAABAABA"
    assert "".join(text_sources.mix_documents(sources, weighted=False)) == "AAAAAABBB"
    assert "".join(text_sources.mix_documents(sources, weighted=False, max_characters=2)) == "AA"


def test_bad_inputs_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="No file matches"):
        list(text_sources.TextSource(str(tmp_path / "missing*.txt")).documents())
    with pytest.raises(ValueError, match="needs 4 positive parts"):
        text_sources.parse_ratio("10:1:1", 4)
    with pytest.raises(ValueError, match="weight must be > 0"):
        text_sources.TextSource("x.txt", 0)
    tiny = ["just a few words here"] * 3
    with pytest.raises(ValueError, match="too small for 5000 pieces"):
        vocab.train_sentencepiece(tiny, str(tmp_path / "tiny.model"), num_pieces=5000)


def test_the_default_vocabulary_takes_a_vocabulary_that_holds_its_sentinels(
    builtin_corpus, monkeypatch
):
    # mT5's mc4.250000.100extra holds its 100 sentinels as pieces: no extra ids go on top.
    path = builtin_corpus.vocabulary_path
    pieces = spm.SentencePieceProcessor(model_file=path).get_piece_size()
    registered = vocab.DefaultVocabulary()  # as a task registers it, before the run chose
    monkeypatch.setenv("T2T_VOCABULARY", path)
    assert registered.vocab_size == pieces + 100
    monkeypatch.setenv("T2T_VOCABULARY_EXTRA_IDS", "0")
    vocab.set_default_vocabulary(None)  # drops the loaded model
    assert registered.vocab_size == pieces and registered.extra_ids == 0
    assert registered.decode(registered.encode("def f(): pass")) == "def f(): pass"
    vocab.set_default_vocabulary(path, extra_ids=100)
    assert registered.vocab_size == pieces + 100 and vocab.sentinel_id(registered, 0) == pieces + 99
    monkeypatch.setenv("T2T_VOCABULARY_EXTRA_IDS", "some")
    vocab.set_default_vocabulary(None)
    with pytest.raises(ValueError, match="expected a count"):
        registered.extra_ids
