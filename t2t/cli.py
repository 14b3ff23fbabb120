"""The `t2t` command: a thin dispatcher to importable functions, one subcommand each.

Each subcommand is a function `_<name>(subparsers)` below that declares its flags and binds
`handler`, a small function that imports the module doing the work (so `t2t --help` stays fast)
and calls it. To add a subcommand, write such a function and list it in SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import sys
import time


def _vocab(subparsers) -> None:
    parser = subparsers.add_parser(
        "vocab",
        help="train a SentencePiece vocabulary (T5 ids: PAD 0, EOS 1, UNK 2; +100 sentinels)",
        description="Train a SentencePiece unigram model from text files (one document per line) "
        "or TFDS datasets ('tfds:NAME[#FEATURE]', e.g. 'tfds:c4/en:3.1.0'). Give German, French "
        "or Romanian sources to mix them with the English ones by --ratio, as the T5 paper did.",
    )
    parser.add_argument("--output", required=True, help="path of the .model file to write")
    parser.add_argument("--source", action="append", required=True,
                        help="English (or any) text: a file glob or tfds:NAME[#FEATURE]; repeatable")
    parser.add_argument("--german", help="German text source, e.g. tfds:wmt_t2t_translate/de-en:1.0.0#de")
    parser.add_argument("--french", help="French text source, e.g. tfds:wmt15_translate/fr-en:1.0.0#fr")
    parser.add_argument("--romanian", help="Romanian text source, e.g. tfds:wmt16_translate/ro-en:1.0.0#ro")
    parser.add_argument("--ratio", default="10:1:1:1",
                        help="documents English:German:French:Romanian (default: the paper's 10:1:1:1)")
    parser.add_argument("--num_pieces", type=int, default=32_000,
                        help="SentencePiece pieces; the vocabulary adds 100 sentinels (default 32000)")
    parser.add_argument("--max_characters", type=int, default=500_000_000,
                        help="stop reading sources after this many characters")
    parser.add_argument("--character_coverage", type=float, default=0.9995)
    parser.add_argument("--seed", type=int, default=0)

    def handler(args) -> None:
        from t2t.data import vocab

        start = time.time()
        path = vocab.train_vocabulary(
            args.output, args.source, german=args.german, french=args.french,
            romanian=args.romanian, ratio=args.ratio, num_pieces=args.num_pieces,
            max_characters=args.max_characters, character_coverage=args.character_coverage,
            seed=args.seed,
        )
        size = vocab.load_vocabulary(path).vocab_size
        print(f"wrote {path}: {args.num_pieces} pieces, vocabulary size {size} with sentinels "
              f"({time.time() - start:.0f} s)")

    parser.set_defaults(handler=handler)


def _cache(subparsers) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="build the built-in corpus (Python's documentation) and its vocabulary into the cache",
        description="Gather, clean, deduplicate and split the documentation shipped with this "
        "Python, write it with its supervised tasks under $T2T_CACHE_DIR (default ~/.cache/t2t), "
        "and train its SentencePiece vocabulary. Does nothing if already built.",
    )
    parser.add_argument("--cache_dir", help="cache root (default $T2T_CACHE_DIR or ~/.cache/t2t)")
    parser.add_argument("--num_pieces", type=int, default=None,
                        help="vocabulary pieces (default: the built-in corpus's 1948)")

    def handler(args) -> None:
        from t2t.data.builtin import cache

        start = time.time()

        def report(line: str) -> None:
            print(f"[{time.time() - start:5.1f} s] {line}", flush=True)

        kwargs = {} if args.num_pieces is None else {"num_pieces": args.num_pieces}
        corpus = cache.get_or_build(args.cache_dir, report=report, **kwargs)
        stats = corpus.stats
        for split in cache.SPLITS:
            c = stats[f"corpus_{split}"]
            print(f"{split:>10}: {c['documents']} documents, {c['words']} words, {c['tokens']} tokens; "
                  f"summarize {stats[f'summarize_{split}']['examples']}, "
                  f"package {stats[f'package_{split}']['examples']} examples")
        print(f"vocabulary: {corpus.vocabulary_path} ({stats['vocab_size']} ids with sentinels)")

    parser.set_defaults(handler=handler)


SUBCOMMANDS = [_vocab, _cache]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t2t", description="Text-to-text Transformer pretraining in JAX.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `t2t` console script."""
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except ValueError as error:
        print(f"t2t {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
