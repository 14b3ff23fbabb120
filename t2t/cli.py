"""The `t2t` command: a thin dispatcher to importable functions, one subcommand each.

Each subcommand is a function `_<name>(subparsers)` below that declares its flags and binds
`handler`, a small function that imports the module doing the work (so `t2t --help` stays fast)
and calls it. To add a subcommand, write such a function and list it in SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import tokenize

from t2t import terminal
from t2t.errors import UserError


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
        help="build the built-in corpus, or preprocess registered tasks into a seqio cache",
        description="Without --task: gather, clean, deduplicate and split the documentation "
        "shipped with this Python, write it with its supervised tasks under $T2T_CACHE_DIR "
        "(default ~/.cache/t2t) and train its SentencePiece vocabulary (nothing if already "
        "built). With --task: run the tasks' preprocessing up to their "
        "seqio.CacheDatasetPlaceholder with Apache Beam (locally by default) into "
        "--output_cache_dir, which training then reads with --seqio_cache_dir and "
        "use_cached=True.",
    )
    parser.add_argument("--cache_dir", help="built-in corpus root (default $T2T_CACHE_DIR or "
                        "~/.cache/t2t)")
    parser.add_argument("--num_pieces", type=int, default=None,
                        help="vocabulary pieces (default: the built-in corpus's 1948)")
    parser.add_argument("--task", dest="tasks", action="append", default=[],
                        help="a task or mixture to cache (repeatable or comma-separated)")
    parser.add_argument("--output_cache_dir", help="the seqio cache root to write (with --task)")
    parser.add_argument("--module", dest="modules", action="append", default=[],
                        help="a module registering the tasks (repeatable; Beam workers import "
                        "it too), e.g. t2t.data.tasks.glue")
    parser.add_argument("--pipeline_option", dest="pipeline_options", action="append",
                        default=[], help="a Beam pipeline option (repeatable), e.g. "
                        "--pipeline_option=--runner=DataflowRunner; default: DirectRunner")
    parser.add_argument("--overwrite", action="store_true", help="rebuild tasks already cached")
    parser.add_argument("--tfds_data_dir", help="where the TFDS datasets are prepared")

    def handler(args) -> None:
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
            print(f"{split:>10}: {c['documents']} documents, {c['words']} words, {c['tokens']} tokens; "
                  f"summarize {stats[f'summarize_{split}']['examples']}, "
                  f"package {stats[f'package_{split}']['examples']} examples")
        print(f"vocabulary: {corpus.vocabulary_path} ({stats['vocab_size']} ids with sentinels)")

    parser.set_defaults(handler=handler)


def _cache_tasks(args, report) -> None:
    from t2t import runs
    from t2t.data import caching

    if not args.output_cache_dir:
        raise UserError("t2t cache --task needs --output_cache_dir, the seqio cache root to "
                        "write (e.g. --output_cache_dir=/data/seqio_cache).")
    if args.tfds_data_dir:
        import seqio

        seqio.set_tfds_data_dir_override(args.tfds_data_dir)
    names = [n.strip() for item in args.tasks for n in item.split(",") if n.strip()]
    runs.import_task_modules(args.modules, names)
    directories = caching.cache_tasks(names, args.output_cache_dir, modules=args.modules,
                                      pipeline_options=args.pipeline_options,
                                      overwrite=args.overwrite, report=report)
    for name, directory in directories.items():
        print(f"{name}: {directory}")
    print(f"train on them with --seqio_cache_dir={args.output_cache_dir} "
          "--gin.t2t.runs.train.use_cached=True")


# -- the gin-configured run subcommands ---------------------------------------------------------


def _add_gin_flags(parser) -> None:
    """--gin_file, --gin_search_paths and --import; `--gin.NAME=VALUE` is gathered by `main`."""
    parser.add_argument("--gin_file", action="append", default=[],
                        help="gin file configuring the run (repeatable, parsed in order), e.g. "
                        "gin/experiments/tiny_builtin_demo.gin")
    parser.add_argument("--gin_search_paths", action="append", default=[],
                        help="directories to look up gin files and their includes in "
                        "(repeatable or comma-separated; the checkout's gin/ is always searched)")
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        help="a Python module to import first, e.g. one registering your tasks "
                        "(repeatable; the working directory is searched; gin files may also "
                        "`import` them)")
    parser.add_argument("--tfds_data_dir",
                        help="where TFDS datasets are prepared (default $TFDS_DATA_DIR or "
                        "~/tensorflow_datasets); prepare one with `tfds build NAME --data_dir=DIR`")
    parser.add_argument("--seqio_cache_dir", dest="seqio_cache_dirs", action="append",
                        default=[], help="a seqio cache root written by `t2t cache --task` "
                        "(repeatable), read by tasks with use_cached=True")
    parser.epilog = ("Gin bindings: --gin.NAME=VALUE (e.g. --gin.MODEL_DIR=\"'/tmp/run'\"). "
                     "Flags override gin bindings of the same argument. --traceback shows the "
                     "stack of an error; --verbose keeps the libraries' own log lines.")


def _configure(args, *, finalize: bool = True) -> None:
    """Imports the --import modules, then parses the gin files and --gin.NAME=VALUE bindings.

    `finalize=False` leaves required macros of runs that are not called (MODEL_DIR for
    `t2t compile`) unchecked."""
    import importlib

    from t2t import runs

    if args.imports and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--import mytasks` finds ./mytasks.py, as python -m
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise UserError(
                f"--import {module}: {type(error).__name__}: {error}. The module must be "
                "importable from the working directory or $PYTHONPATH (e.g. ./mytasks.py for "
                "--import mytasks, or an installed package).") from error
    if getattr(args, "tfds_data_dir", None):
        import seqio

        seqio.set_tfds_data_dir_override(args.tfds_data_dir)
        os.environ["TFDS_DATA_DIR"] = args.tfds_data_dir
    if getattr(args, "seqio_cache_dirs", None):
        import seqio

        seqio.add_global_cache_dirs([d for item in args.seqio_cache_dirs
                                     for d in item.split(",") if d])
    paths = [p for item in args.gin_search_paths for p in item.split(",") if p]
    try:
        runs.configure(args.gin_file, args.gin_bindings, paths, finalize=finalize)
    except tokenize.TokenError as error:  # e.g. a bracket never closed: gin reads to the end
        raise ValueError(
            f"gin could not parse {_unbalanced(args.gin_file, args.gin_bindings, paths)}: "
            f"{error.args[0]} (a bracket or quote opened and never closed).") from None
    except SyntaxError as error:  # gin could not parse a file or a --gin.NAME=VALUE binding
        where = f"{error.filename}, line {error.lineno}" if error.filename else "a binding"
        # gin's message ends with its own reason ("Failed to parse token 'runs'"); the lines
        # before it repeat Python's parser, object addresses included.
        reason = ((error.msg or "").strip().splitlines() or ["invalid syntax"])[-1].strip()
        quote = ("quote strings, e.g. MODEL_DIR = 'runs/x'" if error.filename else
                 "quote strings inside the flag, e.g. --gin.MODEL_DIR=\"'runs/x'\"")
        raise ValueError(
            f"gin could not parse {where}: {(error.text or '').strip()!r} ({reason.rstrip('.')}). "
            f"Values are Python literals, %MACROS or @references: {quote}."
        ) from error


def _unbalanced(gin_files: list[str], bindings: list[str], search_paths: list[str]) -> str:
    """Which gin file (or binding) has a bracket or string left open."""
    import io

    from t2t import runs

    def opens_unclosed(text: str) -> bool:
        try:
            list(tokenize.generate_tokens(io.StringIO(text).readline))
        except tokenize.TokenError:
            return True
        except SyntaxError:
            return False
        return False

    for binding in bindings:
        if opens_unclosed(binding):
            return f"the binding --gin.{binding.replace(' = ', '=', 1)}"
    for name in gin_files:
        for root in ["", *search_paths, *runs.default_search_paths()]:
            path = os.path.join(root, name)
            if os.path.isfile(path):
                with open(path) as f:
                    if opens_unclosed(f.read()):
                        return path
                break
    return "a gin file included by " + ", ".join(gin_files)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _lengths(text: str) -> dict[str, int]:
    """'inputs=512,targets=114' -> {"inputs": 512, "targets": 114}."""
    try:
        return {k.strip(): int(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected FEATURE=LENGTH[,FEATURE=LENGTH], e.g. inputs=512,targets=114; got {text!r}"
        ) from None


def _add_decoding_flags(parser) -> None:
    parser.add_argument("--batch_size", type=int, help="rows per decoding batch (default 32)")
    parser.add_argument("--method", choices=("greedy", "beam", "sample"),
                        help="decoding method (default greedy)")
    parser.add_argument("--beam_size", type=int,
                        help="beam width (default 4; implies --method=beam)")
    parser.add_argument("--alpha", type=float, help="beam length penalty alpha (default 0.6)")
    parser.add_argument("--beam_rule", choices=("t5x", "hf"),
                        help="which beam candidates may finish: t5x (T5X / Mesh TensorFlow, the "
                        "paper's; default) or hf (HF transformers generate)")
    parser.add_argument("--max_decode_length", type=int,
                        help="output tokens to decode (default: the targets length)")
    parser.add_argument("--first_cache_length", type=int,
                        help="self-attention cache positions of the first decoding phase; "
                        "longer decodes grow it in phases (default 32; speed only)")
    parser.add_argument("--mesh_shape", type=_ints,
                        help="DATA,MODEL device mesh (e.g. -1,2) to run sharded; "
                        "default one device")
    parser.add_argument("--sharding_mode", choices=("data_parallel", "tensor_parallel", "fsdp"))
    parser.add_argument("--module", dest="modules", action="append",
                        help="task registration module to import, e.g. t2t.data.tasks.glue")


def _run_handler(function_name: str, flag_names: tuple[str, ...],
                 exclusive: dict[str, object] | None = None):
    """A handler that parses gin and calls `t2t.runs.<function_name>` with the flags given.

    Flags left out are not passed, so gin bindings supply them. `exclusive` maps alternative
    flags to their "unset" values: giving one passes the others unset, so a flag overrides a gin
    binding of its alternative (e.g. --step over `evaluate.all_steps = True`).
    """

    def handler(args) -> None:
        from t2t import runs

        _configure(args)
        # `is` tests: a flag given as 0 (0 == False) is passed, only unset ones are left out.
        kwargs = {name: getattr(args, name) for name in flag_names
                  if getattr(args, name, None) is not None and getattr(args, name) is not False}
        if exclusive and set(exclusive) & set(kwargs):
            kwargs = {**exclusive, **kwargs}
        if "beam_size" in kwargs and "method" not in kwargs:
            kwargs["method"] = "beam"
        fields = {name: kwargs.pop(name) for name in list(kwargs) if name in _DECODING_FIELDS}
        if fields:  # the fields not given keep their gin bindings
            from t2t import decoding

            kwargs["decoding_config"] = decoding.DecodingConfig(**fields)
        getattr(runs, function_name)(**kwargs)

    return handler


_DECODING = ("batch_size", "method", "beam_size", "alpha", "beam_rule", "max_decode_length",
             "first_cache_length", "mesh_shape", "sharding_mode", "modules")
# Flags that are fields of `t2t.decoding.DecodingConfig`, passed to the run as one config.
_DECODING_FIELDS = ("method", "beam_size", "alpha", "beam_rule", "max_decode_length",
                    "min_length", "temperature", "top_k", "top_p", "seed", "first_cache_length")


def _eval(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval", help="evaluate checkpoints on seqio tasks; report the best checkpoint per task",
        description="Run the seqio Evaluator (decode, postprocess, metrics) for the latest, a "
        "given, or every checkpoint of a model directory. Prints a table per step and the best "
        "checkpoint per task, writes TensorBoard summaries and <model_dir>/eval/results.json.",
    )
    parser.add_argument("--model_dir", help="the run's model directory")
    parser.add_argument("--tasks", help="task or mixture names, comma-separated")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="evaluate this step (default: the latest)")
    which.add_argument("--steps", type=_ints, help="evaluate these steps (comma-separated)")
    which.add_argument("--all_steps", action="store_true", help="evaluate every saved step")
    parser.add_argument("--split", help="the split to evaluate (default validation)")
    parser.add_argument("--task_feature_lengths", type=_lengths,
                        help="cut examples, e.g. inputs=512,targets=114 (default: no cut)")
    parser.add_argument("--num_examples", type=int, help="at most this many examples per task")
    parser.add_argument("--output_file",
                        help="results JSON (default <model_dir>/eval/results.json)")
    parser.add_argument("--log_predictions", action="store_true",
                        help="write predictions per task and step under <model_dir>/eval")
    parser.add_argument("--rank_classification", nargs="?", const=True, default=None,
                        metavar="TASKS", help="score every label of a classification task and "
                        "predict the likeliest instead of decoding: all tasks, or these "
                        "(comma-separated)")
    parser.add_argument("--checkpoints", help="evaluate an ensemble of these checkpoints: steps "
                        "of --model_dir and/or model directories (DIR or DIR@STEP), "
                        "comma-separated; writes <model_dir>/eval/ensemble_results.json")
    _add_decoding_flags(parser)
    _add_gin_flags(parser)
    parser.set_defaults(handler=_run_handler("evaluate", (
        "model_dir", "tasks", "step", "steps", "all_steps", "split", "task_feature_lengths",
        "num_examples", "output_file", "log_predictions", "rank_classification", "checkpoints",
        *_DECODING),
        exclusive={"step": None, "steps": None, "all_steps": False}))


def _infer(subparsers) -> None:
    parser = subparsers.add_parser(
        "infer", help="predict or score a JSONL/TSV file or a task; writes JSONL",
        description="Decode (or score the targets of) examples from a JSONL file "
        '({"inputs": ..., "targets"?: ...}), a TSV file (inputs[<TAB>targets]) or a registered '
        "task or mixture, with one checkpoint or an ensemble (logits averaged), and write "
        '{"inputs", "prediction"|"score", "target"?} records as JSON lines.',
    )
    parser.add_argument("--model_dir", help="the run's model directory")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--checkpoints", help="ensemble members, comma-separated: steps of "
                        "--model_dir and/or model directories (DIR or DIR@STEP)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--input_file", help="JSONL or TSV examples")
    source.add_argument("--task", help="a registered task or mixture")
    parser.add_argument("--split", help="the task's split (default validation)")
    parser.add_argument("--output_file", help="the JSONL file to write")
    parser.add_argument("--mode", choices=("predict", "score"), help="default predict")
    parser.add_argument("--vocabulary_file", help="SentencePiece model (default: the checkpoint's)")
    parser.add_argument("--inputs_length", type=int, help="cut inputs to this many tokens")
    parser.add_argument("--targets_length", type=int, help="cut targets to this many tokens")
    parser.add_argument("--num_examples", type=int, help="at most this many examples")
    parser.add_argument("--temperature", type=float, help="sampling temperature")
    parser.add_argument("--top_k", type=int, help="sampling: keep the k most likely tokens")
    parser.add_argument("--top_p", type=float, help="sampling: nucleus mass")
    parser.add_argument("--seed", type=int, help="sampling seed")
    _add_decoding_flags(parser)
    _add_gin_flags(parser)
    parser.set_defaults(handler=_run_handler("infer", (
        "output_file", "model_dir", "step", "checkpoints", "input_file", "task", "split", "mode",
        "vocabulary_file", "inputs_length", "targets_length", "num_examples", "temperature",
        "top_k", "top_p", "seed", *_DECODING), exclusive={"input_file": None, "task": None}))


def _export(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write a HF transformers release directory from a checkpoint",
        description="Write safetensors weights, config.json, the SentencePiece tokenizer files, "
        "the run's gin config and a model card, loadable with "
        "T5ForConditionalGeneration.from_pretrained and T5Tokenizer.from_pretrained.",
    )
    parser.add_argument("--model_dir", help="the run's model directory")
    parser.add_argument("--output_dir", help="the release directory to write")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--vocabulary_file", help="SentencePiece model (default: the checkpoint's)")
    parser.add_argument("--eval_results", help="results JSON of `t2t eval` for the model card "
                        "(default <model_dir>/eval/results.json if present)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --output_dir, replacing same-named files")
    _add_gin_flags(parser)
    parser.set_defaults(handler=_run_handler("export", (
        "model_dir", "output_dir", "step", "vocabulary_file", "eval_results", "overwrite")))


def _average(subparsers) -> None:
    parser = subparsers.add_parser(
        "average", help="average the parameters of the last N (or given) checkpoints",
        description="Write the element-wise mean of checkpoints' parameters as a new model "
        "directory (one checkpoint, parameters only), read one checkpoint at a time.",
    )
    parser.add_argument("--model_dir", help="the run's model directory")
    parser.add_argument("--output_dir", help="the new model directory")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--last", type=int, help="average the last N checkpoints")
    which.add_argument("--steps", type=_ints, help="average these steps (comma-separated)")
    _add_gin_flags(parser)
    parser.set_defaults(handler=_run_handler(
        "average", ("model_dir", "output_dir", "last", "steps"),
        exclusive={"last": None, "steps": None}))


def _train(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model configured by gin files (pretraining or fine-tuning)",
        description="Train as the gin files say (t2t.runs.train). Example: t2t train "
        "--gin_file=gin/experiments/tiny_builtin_demo.gin --gin.MODEL_DIR=\"'/tmp/demo'\" "
        "--gin.TRAIN_STEPS=100. --gin.NAME=VALUE binds any gin parameter or macro after the "
        "files; restarting with the same MODEL_DIR resumes from its latest checkpoint.",
    )
    _add_gin_flags(parser)

    def handler(args) -> None:
        from t2t import runs

        if not args.gin_file:
            raise ValueError("t2t train needs at least one --gin_file, e.g. "
                             "--gin_file=gin/experiments/tiny_builtin_demo.gin")
        _configure(args)
        summary = runs.train()
        first, last = summary["first_loss"], summary["last_loss"]
        if first is not None:
            print(f"trained steps {summary['first_step']} -> {summary['last_step']}: loss "
                  f"{first:.3f} -> {last:.3f}; {summary['tokens_seen']} tokens seen")
        for name, value in summary["eval"].items():
            print(f"  {name}: {value:.4f}")

    parser.set_defaults(handler=handler)


def _chain(subparsers) -> None:
    parser = subparsers.add_parser(
        "chain", help="train a chain of stages (pretrain -> intermediate -> target) in one go",
        description="Run the stages a chain file lists (t2t.chain.run.stages), each an ordinary "
        "training run in <MODEL_DIR>/<stage>, each starting from the previous stage's selected "
        "checkpoint (best by a metric, or the last). Rerunning resumes: finished stages are "
        "skipped. Example: t2t chain --gin_file=gin/chains/stilts_builtin.gin "
        "--gin.MODEL_DIR=\"'runs/stilts'\" --gin.INIT_CHECKPOINT=\"'runs/demo'\"",
    )
    parser.add_argument("--stage_gin", action="append", default=[], metavar="BINDING",
                        help="a gin binding added to every stage, e.g. --stage_gin="
                        "\"t2t.runs.train.progress = False\" (repeatable)")
    parser.add_argument("--dry_run", action="store_true",
                        help="print each stage's t2t train command; train nothing")
    _add_gin_flags(parser)

    def handler(args) -> None:
        from t2t import chain

        if not args.gin_file:
            raise ValueError("t2t chain needs a chain file, e.g. "
                             "--gin_file=gin/chains/stilts_builtin.gin")
        _configure(args)
        paths = [p for item in args.gin_search_paths for p in item.split(",") if p]
        result = chain.run(bindings=args.stage_gin, dry_run=args.dry_run, search_paths=paths)
        if not args.dry_run:
            for record in result["stages"]:
                print(f"  {record['name']}: {record['model_dir']} -> step "
                      f"{record['selected_step']} ({record['selection'].rsplit('@', 1)[1]})")

    parser.set_defaults(handler=handler)


def _study(subparsers) -> None:
    parser = subparsers.add_parser(
        "study", help="run a study (arms x tasks x seeds) and aggregate it: study.md/json/png",
        description="Run the grid a study file declares (gin/studies/NAME.gin, or --gin_file), "
        "each run an ordinary model directory under the study directory; rerunning skips "
        "finished runs and resumes the rest. Then aggregate: per arm and task mean +- std over "
        "seeds, degenerate runs, the suite average, a t-test against the baseline arm and the "
        "ordering beside the paper's, in study.md, study.json and study.png. Example: t2t study "
        "finetuning_methods --study_dir=runs/studies/finetuning_methods",
    )
    parser.add_argument("name", nargs="?", help="a study of gin/studies/ (without .gin); "
                        "--gin_file adds files after it, e.g. a profile of "
                        "gin/studies/profiles/ for the real benchmarks")
    parser.add_argument("--study_dir", help="where runs and results go (default: the file's "
                        "STUDY_DIR)")
    parser.add_argument("--seeds", type=_ints, help="restarts, e.g. 0,1,2 (default: the file's)")
    parser.add_argument("--arms", type=lambda s: [a.strip() for a in s.split(",") if a.strip()],
                        help="only these arms, comma-separated names (default: all the file's)")
    parser.add_argument("--print_commands", action="store_true",
                        help="print every run's t2t train commands; train nothing")
    parser.add_argument("--aggregate_only", action="store_true",
                        help="train nothing; aggregate the runs that have results")
    parser.add_argument("--stage_gin", action="append", default=[], metavar="BINDING",
                        help="a gin binding added to every stage of every run (repeatable)")
    _add_gin_flags(parser)

    def handler(args) -> None:
        from t2t.studies import runner

        if args.name:  # the study's file first; --gin_file ones (a profile) after it
            args.gin_file = [_study_file(args.name), *args.gin_file]
        if not args.gin_file:
            raise ValueError("t2t study needs a study: a name from gin/studies/ (e.g. t2t study "
                             "finetuning_methods) or --gin_file=FILE.")
        _configure(args)
        overrides = {"print_commands": args.print_commands,
                     "aggregate_only": args.aggregate_only}
        if args.study_dir:
            overrides["study_dir"] = args.study_dir
        if args.seeds:
            overrides["seeds"] = args.seeds
        if args.arms:
            overrides["only_arms"] = args.arms
        if args.stage_gin:
            import gin

            bound = gin.get_bindings("t2t.studies.run").get("bindings", ())
            overrides["bindings"] = [*bound, *args.stage_gin]
        paths = [p for item in args.gin_search_paths for p in item.split(",") if p]
        result = runner.run(search_paths=paths, **overrides)
        if result is not None:
            print(f"study written to {result['study_dir']}/study.md (and study.json, "
                  "study.png)")

    parser.set_defaults(handler=handler)


def _study_file(name: str) -> str:
    from t2t import runs

    for root in runs.default_search_paths():
        path = os.path.join(root, "studies", f"{name}.gin")
        if os.path.exists(path):
            return path
    root = runs.default_search_paths()[0]
    known = sorted(f[:-4] for f in os.listdir(os.path.join(root, "studies"))
                   if f.endswith(".gin")) if os.path.isdir(os.path.join(root, "studies")) else []
    raise ValueError(f"No study {name!r}; gin/studies/ has {known}.")


def _compile(subparsers) -> None:
    parser = subparsers.add_parser(
        "compile",
        help="compile a training run for a TPU slice or CPU devices ahead of time: memory, "
        "FLOPs, collectives, and what would make it fit",
        description="Lower and compile the train step (and greedy decoding) that `t2t train` "
        "would run under the same gin files, with their real shardings, on abstract inputs: "
        "nothing runs and no data is read. --topology uses libtpu's compiler (pip install -e "
        "'.[tpu]'; no TPU needed). Reports memory per device against the device's, compiled vs. "
        "model FLOPs, the collectives and a roofline bound; exits 1 when the step does not fit, "
        "with settings that would make it fit. Example: t2t compile --gin_file="
        "gin/experiments/t5_1_1_base_c4.gin --topology=v5e:4x4 --batch_size=2048 "
        "--sharding_mode=fsdp --remat_policy=full --scan_layers",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--topology", help="a Cloud TPU slice: GENERATION:CHIPS, e.g. v5e:4x4, "
                        "v4:4x4x4, v5p:8x8x16, v3:16x32 (v2, v3, v4, v5e, v5p, v6e)")
    target.add_argument("--cpu_devices", type=int, help="compile for N CPU devices instead")
    parser.add_argument("--device_memory_gib", type=float,
                        help="with --cpu_devices: memory per device to check against")
    parser.add_argument("--batch_size", type=int, help="global batch (default: the run's)")
    parser.add_argument("--mesh_shape", type=_ints, help="DATA,MODEL (default: the run's)")
    parser.add_argument("--sharding_mode", choices=("data_parallel", "tensor_parallel", "fsdp"))
    parser.add_argument("--num_microbatches", type=int)
    parser.add_argument("--remat_policy",
                        choices=("none", "full", "dots", "dots_with_no_batch_dims"))
    parser.add_argument("--scan_layers", action="store_true", default=None,
                        help="scan the layers (default: the model config's)")
    parser.add_argument("--no_decode", dest="decode", action="store_false", default=None,
                        help="compile the train step only")
    parser.add_argument("--output_json", help="write the report there as JSON")
    _add_gin_flags(parser)

    def handler(args) -> int:
        if args.cpu_devices is not None:
            from t2t.aot import targets

            targets.ensure_cpu_devices(args.cpu_devices)
        from t2t import runs

        if not args.gin_file:
            raise ValueError("t2t compile needs the run's --gin_file, e.g. "
                             "--gin_file=gin/experiments/t5_1_1_base_c4.gin")
        _configure(args, finalize=False)
        names = ("topology", "cpu_devices", "device_memory_gib", "batch_size", "mesh_shape",
                 "sharding_mode", "num_microbatches", "remat_policy", "scan_layers", "decode",
                 "output_json")
        kwargs = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
        report = runs.compile_train(**kwargs)
        return 1 if report.fits is False else 0

    parser.set_defaults(handler=handler)


def _check(subparsers) -> None:
    parser = subparsers.add_parser(
        "check", help="verify every checkpoint of a model directory against its checksums",
        description="Read every array and data-iterator file of every checkpoint of a model "
        "directory and compare them with the checksums saved with them. Prints one line per "
        "checkpoint; exits 1 when any is damaged (damaged checkpoints are skipped by train, "
        "eval, infer and export, which use the newest intact one).",
    )
    parser.add_argument("model_dir", help="the run's model directory")

    def handler(args) -> int:
        from t2t.checkpoints import model_dir as model_dir_lib

        directory = model_dir_lib.ModelDir(args.model_dir)
        if not directory.steps():
            raise ValueError(f"{args.model_dir} holds no checkpoint to check.")

        def report(step: int, status: str, problems: list[str]) -> None:
            note = {"ok": "", "unverified": " (saved without checksums: read back without "
                    "error, values not verified)"}.get(status, "")
            print(f"step {step}: {status}{note}", flush=True)
            for problem in problems:
                print(f"    {problem}", flush=True)

        results = directory.check(report)
        damaged = [step for step, (status, _) in results.items() if status == "damaged"]
        print(f"{len(results)} checkpoints, {len(damaged)} damaged"
              + (f" (steps {', '.join(map(str, damaged))})" if damaged else ""))
        return 1 if damaged else 0

    parser.set_defaults(handler=handler)


SUBCOMMANDS = [_vocab, _cache, _train, _chain, _study, _eval, _infer, _export, _average,
               _compile, _check]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t2t", description="Text-to-text Transformer pretraining in JAX.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def split_gin_bindings(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separates `--gin.NAME=VALUE` (or `--gin.NAME VALUE`) flags from the others.

    Example: ["train", "--gin.MODEL_DIR='/tmp/x'", "--gin_file=a.gin"] ->
    (["train", "--gin_file=a.gin"], ["MODEL_DIR = '/tmp/x'"]).
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


_TRAINING_COMMANDS = ("train", "chain", "study")
_PREEMPTED_EXIT_CODE = 75  # t2t.trainer.loop.PREEMPTED_EXIT_CODE, without importing it here


@contextlib.contextmanager
def _stop_at_once_on_signals(command: str):
    """SIGTERM or SIGINT outside the training loop (start-up: imports, gin, data; or the end,
    after the last checkpoint is committed) stops the process at once with exit 75: nothing
    unsaved is lost there, and the trainer handles them itself while it trains (it saves, then
    stops). `os._exit`, not an exception: an exception raised into a half-initialized runtime
    (XLA, TensorFlow) can crash the interpreter's shutdown (seen as SIGSEGV under the fault
    injection harness). The previous handlers are put back when the command returns.
    """
    import signal

    def handler(signum, frame):
        from t2t.checkpoints import lock

        lock.release_all()  # the model directory is free again at once
        print(f"t2t {command}: stopped by {signal.Signals(signum).name} outside the training "
              "loop (starting up or finishing); every checkpoint reported saved is kept. Run "
              "the same command again to go on.", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(_PREEMPTED_EXIT_CODE)

    previous = {number: signal.signal(number, handler)
                for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def _preempted() -> tuple[type[BaseException], ...]:
    """`t2t.trainer.loop.Preempted` once the trainer is loaded (`except` evaluates this when
    an exception arrives), so commands that never train do not import it."""
    loop = sys.modules.get("t2t.trainer.loop")
    return (loop.Preempted,) if loop is not None else ()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `t2t` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    show_traceback = "--traceback" in argv or os.environ.get("T2T_TRACEBACK") == "1"
    verbose = "--verbose" in argv or os.environ.get("T2T_VERBOSE") == "1"
    argv = [a for a in argv if a not in ("--traceback", "--verbose")]
    argv, gin_bindings = split_gin_bindings(argv)
    args = build_parser().parse_args(argv)
    if not verbose:
        terminal.quiet_libraries()
    args.gin_bindings = gin_bindings
    if gin_bindings and not hasattr(args, "gin_file"):
        print(f"t2t {args.command}: error: this command takes no gin bindings", file=sys.stderr)
        return 2
    signals = (_stop_at_once_on_signals(args.command) if args.command in _TRAINING_COMMANDS
               else contextlib.nullcontext())
    try:
        with signals:  # the trainer takes over while it trains (saves, then stops)
            code = args.handler(args)
    except _preempted() as stopped:  # SIGTERM / SIGINT: a checkpoint was saved, a clean stop
        print(f"t2t {args.command}: {terminal.error_message(stopped)}", file=sys.stderr)
        return _PREEMPTED_EXIT_CODE
    except KeyboardInterrupt:  # a second Ctrl-C
        print(f"t2t {args.command}: interrupted; nothing was saved after the last checkpoint "
              "reported saved.", file=sys.stderr)
        return 130
    except FloatingPointError as error:  # a diverged run (NonFiniteError): what was kept, what next
        terminal.print_traceback(show_traceback)
        print(f"t2t {args.command}: error: {terminal.error_message(error)}", file=sys.stderr)
        return 1
    except Exception as error:  # noqa: BLE001 (sorted into bad input and bugs)
        if terminal.is_user_error(error):  # bad input: a message, not a traceback
            terminal.print_traceback(show_traceback)
            print(f"t2t {args.command}: error: {terminal.error_message(error)}", file=sys.stderr)
            return 2
        terminal.print_traceback(True)
        print(f"t2t {args.command}: internal error: {type(error).__name__}: "
              f"{terminal.error_message(error)}\nThis is a bug in t2t (or an input it failed to "
              "check); please report it with the command and the stack above.", file=sys.stderr)
        return 1
    return code if isinstance(code, int) else 0


def console() -> None:
    """The `t2t` console script: `main`, then an exit during which SIGTERM/SIGINT end the
    process with the command's own status (the interpreter's shutdown after a training run can
    take seconds; a scheduler's SIGTERM then must not turn a finished run into a killed one)."""
    import signal

    code = main()

    def exit_now(signum, frame):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, exit_now)
    sys.exit(code)


if __name__ == "__main__":
    console()
