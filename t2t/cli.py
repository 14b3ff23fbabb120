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


def add_gin_flags(parser) -> None:
    """--gin_file, --gin_search_paths and --import; `--gin.NAME=VALUE` is gathered by `main`."""
    parser.add_argument("--gin_file", action="append", default=[], required=True,
                        help="a gin file (repeatable, parsed in order), e.g. "
                        "gin/experiments/tiny_builtin_demo.gin")
    parser.add_argument("--gin_search_paths", default="",
                        help="comma-separated directories to find gin files and includes in "
                        "(the checkout's gin/ is always searched)")
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        help="a Python module to import first, e.g. one registering your tasks "
                        "(repeatable; gin files may also `import` them)")


def configure_gin(args) -> None:
    """Imports --import modules, then parses the gin files and --gin.NAME=VALUE bindings."""
    import importlib

    from t2t import runs

    for module in args.imports:
        importlib.import_module(module)
    paths = [p for p in args.gin_search_paths.split(",") if p]
    runs.configure(args.gin_file, args.gin_bindings, paths)


def _train(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model configured by gin files (pretraining or fine-tuning)",
        description="Train as the gin files say (t2t.runs.train). Example: t2t train "
        "--gin_file=gin/experiments/tiny_builtin_demo.gin --gin.MODEL_DIR=\"'/tmp/demo'\" "
        "--gin.TRAIN_STEPS=100. --gin.NAME=VALUE binds any gin parameter or macro after the "
        "files; restarting with the same MODEL_DIR resumes from its latest checkpoint.",
    )
    add_gin_flags(parser)

    def handler(args) -> None:
        configure_gin(args)
        from t2t import runs

        summary = runs.train()
        first, last = summary["first_loss"], summary["last_loss"]
        if first is not None:
            print(f"trained steps {summary['first_step']} -> {summary['last_step']}: loss "
                  f"{first:.3f} -> {last:.3f}; {summary['tokens_seen']} tokens seen")
        for name, value in summary["eval"].items():
            print(f"  {name}: {value:.4f}")

    parser.set_defaults(handler=handler)


SUBCOMMANDS = [_vocab, _cache, _train]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t2t", description="Text-to-text Transformer pretraining in JAX.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def split_gin_bindings(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separates `--gin.NAME=VALUE` (or `--gin.NAME VALUE`) flags from the others.

    Example: ["train", "--gin.MODEL_DIR='/tmp/x'", "--gin_file=a.gin"] ->
    (["train", "--gin_file=a.gin"], ["MODEL_DIR='/tmp/x'"]).
    """
    rest, bindings = [], []
    items = iter(argv)
    for item in items:
        if item.startswith("--gin.") and item != "--gin.":
            name, equals, value = item[len("--gin."):].partition("=")
            if not equals:
                value = next(items, None)
                if value is None:
                    raise SystemExit(f"t2t: error: {item} needs a value (--gin.NAME=VALUE).")
            bindings.append(f"{name} = {value}")
        else:
            rest.append(item)
    return rest, bindings


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `t2t` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, gin_bindings = split_gin_bindings(argv)
    args = build_parser().parse_args(argv)
    args.gin_bindings = gin_bindings
    try:
        args.handler(args)
    except ValueError as error:
        print(f"t2t {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
