"""The T5 vocabulary: a SentencePiece unigram model with 100 sentinel ids appended.

T5 shares one SentencePiece model between inputs and targets, reserves PAD 0, EOS 1 and UNK 2 (no
BOS), and appends 100 extra ids used as span-corruption sentinels in reverse order: `<extra_id_0>`
is the last id, `<extra_id_i>` is `vocab_size - 1 - i`. seqio's `SentencePieceVocabulary` does the
appending; this module trains compatible SentencePiece models and loads them.

Worked example (`num_pieces` 32,000 as in the paper): vocab_size = 32,000 + 100 = 32,100;
`<extra_id_0>` = 32,099, `<extra_id_99>` = 32,000; the model pads its embedding to 32,128.
"""

from __future__ import annotations

import io
import logging
import os
import weakref
from collections.abc import Iterable, Iterator

import sentencepiece as spm
import seqio

from t2t import files

NUM_SENTINELS = 100
PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
# The public vocabulary of the T5 paper (32,000 pieces on C4 + De/Fr/Ro, 10:1:1:1).
T5_VOCABULARY_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
# NOTE: SentencePiece skips training lines longer than its max_sentence_length (4192 bytes by
# default) instead of truncating them, so documents are cut into shorter lines first.
_MAX_LINE_BYTES = 4000


def load_vocabulary(path: str, extra_ids: int = NUM_SENTINELS) -> seqio.SentencePieceVocabulary:
    """Returns the seqio vocabulary for a SentencePiece model file, with `extra_ids` sentinels."""
    return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)


def check_model_file(path: str, flag: str = "--vocabulary_file") -> None:
    """Raises UserError unless `path` (local or gs://) is a SentencePiece model that loads."""
    from t2t.errors import UserError

    if not files.exists(path) or files.isdir(path):
        raise UserError(
            f"{flag} {path} is not a file. Give a SentencePiece model (.model), e.g. the "
            "spiece.model a t2t model directory carries, or one `t2t vocab` trains."
        )
    try:
        spm.SentencePieceProcessor(model_proto=files.read_bytes(path))
    except Exception as error:  # noqa: BLE001 (protobuf's DecodeError, SentencePiece's RuntimeError)
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise UserError(
            f"{flag} {path} is not a SentencePiece model ({reason}). Give the .model file "
            "that spm_train or `t2t vocab` writes (a t2t model directory carries its own as "
            "spiece.model), not a text or .vocab file."
        ) from None


_default_override: str | None = None
_default_extra_ids: int | None = None
_default_instances: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id -> vocab


def default_vocabulary_path() -> str:
    """The file `default_vocabulary()` reads now: the run's choice (`set_default_vocabulary`),
    else `$T2T_VOCABULARY`, else T5's public model."""
    return _default_override or os.environ.get("T2T_VOCABULARY", T5_VOCABULARY_PATH)


def default_vocabulary_extra_ids() -> int | None:
    """The sentinels the default vocabulary appends: the run's choice, else
    `$T2T_VOCABULARY_EXTRA_IDS`, else None (each task's own, T5's 100). mT5's vocabulary holds
    its 100 sentinels already (`mc4.250000.100extra`): 0 there."""
    if _default_extra_ids is not None:
        return _default_extra_ids
    value = os.environ.get("T2T_VOCABULARY_EXTRA_IDS")
    if value is None:
        return None
    if not value.isdigit():
        raise ValueError(f"T2T_VOCABULARY_EXTRA_IDS={value!r}: expected a count, e.g. 0 or 100.")
    return int(value)


def set_default_vocabulary(path: str | None, extra_ids: int | None = None) -> None:
    """Makes `default_vocabulary()` read `path` (None: back to `$T2T_VOCABULARY` / T5's), with
    `extra_ids` sentinels (None: `$T2T_VOCABULARY_EXTRA_IDS`, else the tasks' 100).

    A run that starts from a checkpoint carrying its tokenizer (a HF directory's `spiece.model`,
    a t2t model directory's copy) calls this, so the tasks registered with the default
    vocabulary tokenize as the checkpoint was trained. Already loaded models are dropped.
    """
    global _default_override, _default_extra_ids
    _default_override = path
    _default_extra_ids = extra_ids
    for vocabulary in list(_default_instances.values()):
        vocabulary._model = None


class DefaultVocabulary(seqio.SentencePieceVocabulary):
    """T5's vocabulary for tasks that name no other, its file decided when first used
    (`default_vocabulary_path`), not when the task is registered."""

    def __init__(self, extra_ids: int = NUM_SENTINELS):
        super().__init__(T5_VOCABULARY_PATH, extra_ids=extra_ids)
        _default_instances[id(self)] = self

    @property
    def _sentencepiece_model_file(self) -> str:
        return default_vocabulary_path()

    @_sentencepiece_model_file.setter
    def _sentencepiece_model_file(self, value: str) -> None:
        del value  # decided at use, above

    @property
    def _extra_ids(self) -> int:
        chosen = default_vocabulary_extra_ids()
        return self._registered_extra_ids if chosen is None else chosen

    @_extra_ids.setter
    def _extra_ids(self, value: int) -> None:
        self._registered_extra_ids = value

    def __setstate__(self, state):
        super().__setstate__(state)
        _default_instances[id(self)] = self


def default_vocabulary() -> seqio.SentencePieceVocabulary:
    """The vocabulary the TFDS-backed tasks use: `$T2T_VOCABULARY` if set, else the T5 one
    (or the tokenizer of the checkpoint a run starts from: `set_default_vocabulary`).

    The T5 model lives on Google Cloud Storage; point `T2T_VOCABULARY` at a local copy (or at a
    model trained with `t2t vocab`) to run without network access.
    """
    return DefaultVocabulary()


def sentinel_id(vocabulary: seqio.Vocabulary, index: int) -> int:
    """Id of `<extra_id_{index}>`: `vocab_size - 1 - index` (T5 counts sentinels down)."""
    if not 0 <= index < vocabulary.extra_ids:
        raise ValueError(
            f"Sentinel index {index} out of range: the vocabulary has {vocabulary.extra_ids} "
            "extra ids."
        )
    return vocabulary.vocab_size - 1 - index


def padded_vocab_size(vocabulary: seqio.Vocabulary, multiple: int = 128) -> int:
    """The embedding size for `vocabulary`: its size rounded up to `multiple` (32,100 -> 32,128)."""
    return -(-vocabulary.vocab_size // multiple) * multiple


def training_lines(documents: Iterable[str], max_bytes: int = _MAX_LINE_BYTES) -> Iterator[str]:
    """Cuts documents into lines SentencePiece will train on (each at most `max_bytes` UTF-8).

    Lines break at newlines, then at sentence ends ('. '), then at spaces when still too long.
    Example with max_bytes 12: "One two. Three four five." -> "One two.", "Three four", "five."
    """
    for document in documents:
        for line in document.splitlines():
            line = line.strip()
            if line:
                yield from _split_to_bytes(line, max_bytes)


def _split_to_bytes(line: str, max_bytes: int) -> Iterator[str]:
    if len(line.encode("utf-8")) <= max_bytes:
        yield line
        return
    for separator in (". ", " "):
        pieces = line.split(separator)
        if len(pieces) > 1:
            current = ""
            for i, piece in enumerate(pieces):
                piece = piece + (separator.rstrip() if i < len(pieces) - 1 else "")
                candidate = f"{current} {piece}" if current else piece
                if current and len(candidate.encode("utf-8")) > max_bytes:
                    yield from _split_to_bytes(current, max_bytes)
                    current = piece
                else:
                    current = candidate
            if current:
                yield from _split_to_bytes(current, max_bytes)
            return
    # One unbroken run of characters: cut it by characters.
    encoded = line.encode("utf-8")
    yield encoded[:max_bytes].decode("utf-8", errors="ignore")
    rest = encoded[max_bytes:].decode("utf-8", errors="ignore")
    if rest:
        yield from _split_to_bytes(rest, max_bytes)


def train_sentencepiece(
    documents: Iterable[str],
    model_path: str,
    *,
    num_pieces: int,
    character_coverage: float = 0.9995,
    max_sentences: int = 10_000_000,
    seed: int = 0,
) -> str:
    """Trains a T5-compatible SentencePiece unigram model and writes it atomically.

    Args:
      documents: training text, one document per item.
      model_path: where the `.model` file goes; written to a temporary file and renamed, so a
        crash never leaves a half-written model.
      num_pieces: SentencePiece pieces including PAD/EOS/UNK; the seqio vocabulary adds
        100 sentinels on top (32,000 -> 32,100).
      character_coverage: share of characters the model covers without UNK (SentencePiece's).
      max_sentences: SentencePiece samples at most this many lines (0: all of them).
      seed: seed of SentencePiece's line sampling.

    Returns:
      `model_path`.

    Raises:
      ValueError: when the text cannot support `num_pieces` pieces.
    """
    if num_pieces < 8:
        raise ValueError(
            f"num_pieces must be at least 8 (PAD, EOS, UNK and text), got {num_pieces}."
        )
    spm.set_random_generator_seed(seed)
    model = _train_unigram(documents, num_pieces, character_coverage, max_sentences)
    _write_atomically(model_path, model)
    logging.info("Wrote a %d-piece SentencePiece model to %s", num_pieces, model_path)
    return model_path


def _train_unigram(
    documents: Iterable[str], num_pieces: int, character_coverage: float, max_sentences: int
) -> bytes:
    """The serialized unigram model; an error raised while reading `documents` is re-raised."""
    model = io.BytesIO()
    # NOTE: SentencePiece swallows an exception raised by the sentence iterator and reports an
    # empty corpus instead; keep the real error to raise it.
    source_errors: list[Exception] = []

    def lines():
        try:
            yield from training_lines(documents)
        except Exception as error:  # noqa: BLE001 - re-raised below
            source_errors.append(error)

    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=lines(),
            model_writer=model,
            model_type="unigram",
            vocab_size=num_pieces,
            pad_id=PAD_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            bos_id=-1,
            character_coverage=character_coverage,
            input_sentence_size=max_sentences,
            shuffle_input_sentence=True,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as error:
        if source_errors:
            raise source_errors[0] from error
        raise _training_error(error, num_pieces) from error
    if source_errors:
        raise source_errors[0]
    return model.getvalue()


def _training_error(error: RuntimeError, num_pieces: int) -> Exception:
    """A caller-facing error for SentencePiece's internal training failures."""
    if "Vocabulary size" in str(error):
        return ValueError(
            f"The training text is too small for {num_pieces} pieces ({error}). Pass a smaller "
            "num_pieces or more text."
        )
    if "sentences_.empty()" in str(error):
        return ValueError("The training text is empty; pass sources with text.")
    return RuntimeError(f"SentencePiece training failed: {error}")


def _write_atomically(path: str, data: bytes) -> None:
    files.makedirs(files.parent(files.absolute(path)))
    files.write_bytes(path, data)


def train_vocabulary(
    model_path: str,
    sources: list[str],
    *,
    german: str | None = None,
    french: str | None = None,
    romanian: str | None = None,
    ratio: str = "10:1:1:1",
    num_pieces: int = 32_000,
    max_characters: int | None = 500_000_000,
    character_coverage: float = 0.9995,
    seed: int = 0,
) -> str:
    """Trains a vocabulary from text files or TFDS datasets (the logic of `t2t vocab`).

    With German, French or Romanian sources, documents are mixed by `ratio` (English : German :
    French : Romanian, the paper's 10:1:1:1; parts of absent languages are ignored). Otherwise
    the `sources` are read in order. Sources are file globs or `tfds:NAME[#FEATURE]`.

    Returns:
      `model_path`.
    """
    from t2t.data import text_sources

    if not sources:
        raise ValueError("No source given; pass at least one text file glob or 'tfds:NAME'.")
    weights = text_sources.parse_ratio(ratio, 4)
    languages = [(german, weights[1]), (french, weights[2]), (romanian, weights[3])]
    weighted = any(spec for spec, _ in languages)
    # Several English sources share the English part of the ratio equally.
    mixed = [text_sources.TextSource(spec, weights[0] / len(sources)) for spec in sources]
    mixed += [text_sources.TextSource(spec, weight) for spec, weight in languages if spec]
    documents = text_sources.mix_documents(mixed, weighted=weighted, max_characters=max_characters)
    return train_sentencepiece(
        documents,
        model_path,
        num_pieces=num_pieces,
        character_coverage=character_coverage,
        seed=seed,
    )
