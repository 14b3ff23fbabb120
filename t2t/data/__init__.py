"""The data side of t2t: vocabulary, built-in corpus, mixing, feature conversion, input pipeline.

- `vocab`: T5's SentencePiece vocabulary (PAD 0, EOS 1, UNK 2, 100 sentinels) and its training;
- `text_sources`: text files / TFDS features mixed by weight (the paper's 10:1:1:1 recipe);
- `builtin`: the offline corpus made from Python's own documentation, cached with a vocabulary;
- `mixing`: the paper's mixing rates as seqio rate functions;
- `features`: the seqio feature converter of each architecture (packing included);
- `pipeline`: per-host batches of numpy arrays, deterministic, with exact save/restore;
- `batches`: fixed-shape batches from finite data, padded for sums or for decoding;
- `registry`: name -> task or mixture, listing near names on a miss;
- `tasks`: the registration modules (imported explicitly; importing `t2t.data` registers nothing).
"""
