"""`t2t vocab` and `t2t cache`: the data made before training (a SentencePiece vocabulary, the
built-in corpus, seqio caches of registered tasks)."""

from __future__ import annotations

import time

from t2t.errors import UserError

# `t2t vocab`'s flags: (name, add_argument keywords).
_VOCAB_FLAGS = (
    ("--output", dict(required=True, help="path of the .model file to write")),
    (
        "--source",
        dict(
            action="append",
            required=True,
            help="English (or any) text: a file glob or tfds:NAME[#FEATURE]; repeatable",
        ),
    ),
    ("--german", dict(help="German text source, e.g. tfds:wmt_t2t_translate/de-en:1.0.0#de")),
    ("--french", dict(help="French text source, e.g. tfds:wmt15_translate/fr-en:1.0.0#fr")),
    ("--romanian", dict(help="Romanian text source, e.g. tfds:wmt16_translate/ro-en:1.0.0#ro")),
    (
        "--ratio",
        dict(
            default="10:1:1:1",
            help="documents English:German:French:Romanian (default: the paper's 10:1:1:1)",
        ),
    ),
    (
        "--num_pieces",
        dict(
            type=int,
            default=32_000,
            help="SentencePiece pieces; the vocabulary adds 100 sentinels (default 32000)",
        ),
    ),
    (
        "--max_characters",
        dict(type=int, default=500_000_000, help="stop reading sources after this many characters"),
    ),
    ("--character_coverage", dict(type=float, default=0.9995)),
    ("--seed", dict(type=int, default=0)),
)


def add_vocab(subparsers) -> None:
    parser = subparsers.add_parser(
        "vocab",
        help="train a SentencePiece vocabulary (T5 ids: PAD 0, EOS 1, UNK 2; +100 sentinels)",
        description="Train a SentencePiece unigram model from text files (one document per line) "
        "or TFDS datasets ('tfds:NAME[#FEATURE]', e.g. 'tfds:c4/en:3.1.0'). Give German, French "
        "or Romanian sources to mix them with the English ones by --ratio, as the T5 paper did.",
    )
    for name, keywords in _VOCAB_FLAGS:
        parser.add_argument(name, **keywords)
    parser.set_defaults(handler=_run_vocab)


def _run_vocab(args) -> None:
    from t2t.data import vocab

    start = time.time()
    path = vocab.train_vocabulary(
        args.output,
        args.source,
        german=args.german,
        french=args.french,
        romanian=args.romanian,
        ratio=args.ratio,
        num_pieces=args.num_pieces,
        max_characters=args.max_characters,
        character_coverage=args.character_coverage,
        seed=args.seed,
    )
    size = vocab.load_vocabulary(path).vocab_size
    print(
        f"wrote {path}: {args.num_pieces} pieces, vocabulary size {size} with sentinels "
        f"({time.time() - start:.0f} s)"
    )


# `t2t cache`'s flags: (name, add_argument keywords).
_CACHE_FLAGS = (
    ("--cache_dir", dict(help="built-in corpus root (default $T2T_CACHE_DIR or ~/.cache/t2t)")),
    (
        "--num_pieces",
        dict(
            type=int, default=None, help="vocabulary pieces (default: the built-in corpus's 1948)"
        ),
    ),
    (
        "--task",
        dict(
            dest="tasks",
            action="append",
            default=[],
            help="a task or mixture to cache (repeatable or comma-separated)",
        ),
    ),
    ("--output_cache_dir", dict(help="the seqio cache root to write (with --task)")),
    (
        "--module",
        dict(
            dest="modules",
            action="append",
            default=[],
            help="a module registering the tasks (repeatable; Beam workers import "
            "it too), e.g. t2t.data.tasks.glue",
        ),
    ),
    (
        "--pipeline_option",
        dict(
            dest="pipeline_options",
            action="append",
            default=[],
            help="a Beam pipeline option (repeatable), e.g. "
            "--pipeline_option=--runner=DataflowRunner; default: DirectRunner",
        ),
    ),
    ("--overwrite", dict(action="store_true", help="rebuild tasks already cached")),
    ("--tfds_data_dir", dict(help="where the TFDS datasets are prepared")),
)


def add_cache(subparsers) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="build the built-in corpus, or preprocess registered tasks into a seqio cache",
        description="Without --task: gather, clean, deduplicate and split the documentation "
        "shipped with this Python, write it with its supervised tasks under $T2T_CACHE_DIR "
        "(default ~/.cache/t2t) and train its SentencePiece vocabulary (nothing if already "
        "built). With --task: run the tasks' preprocessing up to their "
        "seqio.CacheDatasetPlaceholder with Apache Beam (locally by default) into "
        "--output_cache_dir, which training then reads with --seqio_cache_dir and "
        "use_cached=True.",
    )
    for name, keywords in _CACHE_FLAGS:
        parser.add_argument(name, **keywords)
    parser.set_defaults(handler=_run_cache)


def _run_cache(args) -> None:
    start = time.time()

    def report(line: str) -> None:
        print(f"[{time.time() - start:5.1f} s] {line}", flush=True)

    if args.tasks:
        _cache_tasks(args, report)
        return
    from t2t.data.builtin import cache

    kwargs = {} if args.num_pieces is None else {"num_pieces": args.num_pieces}
    corpus = cache.get_or_build(args.cache_dir, report=report, **kwargs)
    stats = corpus.stats
    for split in cache.SPLITS:
        c = stats[f"corpus_{split}"]
        print(
            f"{split:>10}: {c['documents']} documents, {c['words']} words, {c['tokens']} tokens; "
            f"summarize {stats[f'summarize_{split}']['examples']}, "
            f"package {stats[f'package_{split}']['examples']} examples"
        )
    print(f"vocabulary: {corpus.vocabulary_path} ({stats['vocab_size']} ids with sentinels)")


def _cache_tasks(args, report) -> None:
    from t2t import runs
    from t2t.data import caching

    if not args.output_cache_dir:
        raise UserError(
            "t2t cache --task needs --output_cache_dir, the seqio cache root to "
            "write (e.g. --output_cache_dir=/data/seqio_cache)."
        )
    runs.helpers.refuse_overwriting_inputs(
        {"--output_cache_dir": args.output_cache_dir},
        {"--tfds_data_dir": args.tfds_data_dir, "--cache_dir": args.cache_dir},
    )
    if args.tfds_data_dir:
        import seqio

        seqio.set_tfds_data_dir_override(args.tfds_data_dir)
    names = [n.strip() for item in args.tasks for n in item.split(",") if n.strip()]
    runs.import_task_modules(args.modules, names)
    directories = caching.cache_tasks(
        names,
        args.output_cache_dir,
        modules=args.modules,
        pipeline_options=args.pipeline_options,
        overwrite=args.overwrite,
        report=report,
    )
    for name, directory in directories.items():
        print(f"{name}: {directory}")
    print(
        f"train on them with --seqio_cache_dir={args.output_cache_dir} "
        "--gin.t2t.runs.DataOptions.use_cached=True"
    )
