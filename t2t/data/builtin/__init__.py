"""The built-in corpus: English documentation shipped with the Python interpreter.

With no download at all, t2t can pretrain, fine-tune and evaluate on text every Python install
carries: the `pydoc_data` topics (the language reference as plain text) and the docstrings of the
standard library, read from source with `ast` (nothing is imported, so no module's import-time
side effect runs). `sources` gathers the raw text, `cleaning` turns it into prose documents and
supervised examples, `cache` writes the corpus, its supervised tasks and a SentencePiece
vocabulary once under `$T2T_CACHE_DIR` (default `~/.cache/t2t`).
"""
