"""`t2t eval`, `t2t infer`, `t2t export`, `t2t convert` and `t2t average`: subcommands whose flags override the
gin bindings of one run function (`t2t.runs`); the decoding flags become one `DecodingConfig`."""

from __future__ import annotations

from t2t.cli.gin_flags import add_gin_flags, configure, ints, lengths

# The decoding and sharding flags of `eval` and `infer`: (name, add_argument keywords).
_DECODING_FLAGS = (
    ("--batch_size", dict(type=int, help="rows per decoding batch (default 32)")),
    (
        "--method",
        dict(choices=("greedy", "beam", "sample"), help="decoding method (default greedy)"),
    ),
    ("--beam_size", dict(type=int, help="beam width (default 4; implies --method=beam)")),
    ("--alpha", dict(type=float, help="beam length penalty alpha (default 0.6)")),
    (
        "--beam_rule",
        dict(
            choices=("t5x", "hf"),
            help="which beam candidates may finish: t5x (T5X / Mesh TensorFlow, the "
            "paper's; default) or hf (HF transformers generate)",
        ),
    ),
    (
        "--max_decode_length",
        dict(type=int, help="output tokens to decode (default: the targets length)"),
    ),
    (
        "--first_cache_length",
        dict(
            type=int,
            help="self-attention cache positions of the first decoding phase; "
            "longer decodes grow it in phases (default 32; speed only)",
        ),
    ),
    (
        "--mesh_shape",
        dict(
            type=ints, help="DATA,MODEL device mesh (e.g. -1,2) to run sharded; default one device"
        ),
    ),
    ("--sharding_mode", dict(choices=("data_parallel", "tensor_parallel", "fsdp"))),
    (
        "--module",
        dict(
            dest="modules",
            action="append",
            help="task registration module to import, e.g. t2t.data.tasks.glue",
        ),
    ),
)
# Flags that are fields of `t2t.decoding.DecodingConfig`, passed to the run as one config.
_DECODING_FIELDS = (
    "method",
    "beam_size",
    "alpha",
    "beam_rule",
    "max_decode_length",
    "min_length",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "first_cache_length",
)


def add_run_flags(
    parser, function_name: str, flags, *, one_of: tuple[str, ...] = (), decoding: bool = False
) -> None:
    """Adds `flags` ((name, add_argument keywords); those named in `one_of` as alternatives),
    the decoding flags if `decoding`, and the gin flags to `parser`, whose handler calls
    `t2t.runs.<function_name>` with the flags given (`run_handler`)."""
    group = parser.add_mutually_exclusive_group() if one_of else None
    names, exclusive = [], {}
    for name, keywords in (*flags, *(_DECODING_FLAGS if decoding else ())):
        (group if name in one_of else parser).add_argument(name, **keywords)
        dest = keywords.get("dest", name.lstrip("-"))
        names.append(dest)
        if name in one_of:  # its "unset" value: False for a switch
            exclusive[dest] = False if keywords.get("action") == "store_true" else None
    add_gin_flags(parser)
    handler = run_handler(function_name, tuple(names), exclusive=exclusive or None)
    parser.set_defaults(precheck=check_model_dir, handler=handler)


def run_handler(
    function_name: str, flag_names: tuple[str, ...], exclusive: dict[str, object] | None = None
):
    """A handler that parses gin and calls `t2t.runs.<function_name>` with the flags given.

    Flags left out are not passed, so gin bindings supply them. `exclusive` maps alternative
    flags to their "unset" values: giving one passes the others unset, so a flag overrides a gin
    binding of its alternative (e.g. --step over `evaluate.all_steps = True`).
    """

    def handler(args) -> None:
        from t2t import runs

        configure(args)
        # `is` tests: a flag given as 0 (0 == False) is passed, only unset ones are left out.
        kwargs = {
            name: getattr(args, name)
            for name in flag_names
            if getattr(args, name, None) is not None and getattr(args, name) is not False
        }
        if exclusive and set(exclusive) & set(kwargs):
            kwargs = {**exclusive, **kwargs}
        if "beam_size" in kwargs and "method" not in kwargs:
            kwargs["method"] = "beam"
        fields = {name: kwargs.pop(name) for name in list(kwargs) if name in _DECODING_FIELDS}
        if fields:  # the fields not given keep their gin bindings
            kwargs["decoding_config"] = runs.externals.decoding_config(**fields)
        getattr(runs, function_name)(**kwargs)

    return handler


def check_model_dir(args) -> None:
    """Refuses a --model_dir on local disk that is not a directory (a store's path is checked
    when read): a command's `precheck`, run before TensorFlow and JAX load (seconds)."""
    import os

    from t2t.errors import UserError

    directory = getattr(args, "model_dir", None)
    if not directory or "://" in directory:
        return
    if not os.path.isdir(directory):  # local path: checked before TensorFlow loads
        raise UserError(
            f"--model_dir {directory} is not a directory: give the model directory a run "
            "trained in (its MODEL_DIR), which holds checkpoints/."
        )


_MODEL_DIR = ("--model_dir", dict(help="the run's model directory"))
_EVAL_FLAGS = (
    _MODEL_DIR,
    ("--tasks", dict(help="task or mixture names, comma-separated")),
    ("--step", dict(type=int, help="evaluate this step (default: the latest)")),
    ("--steps", dict(type=ints, help="evaluate these steps (comma-separated)")),
    ("--all_steps", dict(action="store_true", help="evaluate every saved step")),
    ("--split", dict(help="the split to evaluate (default validation)")),
    (
        "--task_feature_lengths",
        dict(type=lengths, help="cut examples, e.g. inputs=512,targets=114 (default: no cut)"),
    ),
    ("--num_examples", dict(type=int, help="at most this many examples per task")),
    ("--output_file", dict(help="results JSON (default <model_dir>/eval/results.json)")),
    (
        "--log_predictions",
        dict(
            action="store_true", help="write predictions per task and step under <model_dir>/eval"
        ),
    ),
    (
        "--rank_classification",
        dict(
            nargs="?",
            const=True,
            default=None,
            metavar="TASKS",
            help="score every label of a classification task and predict the likeliest instead "
            "of decoding: all tasks, or these (comma-separated)",
        ),
    ),
    (
        "--checkpoints",
        dict(
            help="evaluate an ensemble of these checkpoints: steps of --model_dir and/or model "
            "directories (DIR or DIR@STEP), comma-separated; writes "
            "<model_dir>/eval/ensemble_results.json"
        ),
    ),
)


def add_eval(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate checkpoints on seqio tasks; report the best checkpoint per task",
        description="Run the seqio Evaluator (decode, postprocess, metrics) for the latest, a "
        "given, or every checkpoint of a model directory. Prints a table per step and the best "
        "checkpoint per task, writes TensorBoard summaries and <model_dir>/eval/results.json.",
    )
    add_run_flags(
        parser, "evaluate", _EVAL_FLAGS, one_of=("--step", "--steps", "--all_steps"), decoding=True
    )


_INFER_FLAGS = (
    _MODEL_DIR,
    ("--step", dict(type=int, help="checkpoint step (default: the latest)")),
    (
        "--checkpoints",
        dict(
            help="ensemble members, comma-separated: steps of --model_dir and/or model "
            "directories (DIR or DIR@STEP)"
        ),
    ),
    ("--input_file", dict(help="JSONL or TSV examples")),
    ("--task", dict(help="a registered task or mixture")),
    ("--split", dict(help="the task's split (default validation)")),
    ("--output_file", dict(help="the JSONL file to write")),
    ("--mode", dict(choices=("predict", "score"), help="default predict")),
    ("--vocabulary_file", dict(help="SentencePiece model (default: the checkpoint's)")),
    ("--inputs_length", dict(type=int, help="cut inputs to this many tokens")),
    ("--targets_length", dict(type=int, help="cut targets to this many tokens")),
    ("--num_examples", dict(type=int, help="at most this many examples")),
    ("--temperature", dict(type=float, help="sampling temperature")),
    ("--top_k", dict(type=int, help="sampling: keep the k most likely tokens")),
    ("--top_p", dict(type=float, help="sampling: nucleus mass")),
    ("--seed", dict(type=int, help="sampling seed")),
)


def add_infer(subparsers) -> None:
    parser = subparsers.add_parser(
        "infer",
        help="predict or score a JSONL/TSV file or a task; writes JSONL",
        description="Decode (or score the targets of) examples from a JSONL file "
        '({"inputs": ..., "targets"?: ...}), a TSV file (inputs[<TAB>targets]) or a registered '
        "task or mixture, with one checkpoint or an ensemble (logits averaged), and write "
        '{"inputs", "prediction"|"score", "target"?} records as JSON lines.',
    )
    add_run_flags(parser, "infer", _INFER_FLAGS, one_of=("--input_file", "--task"), decoding=True)


_EXPORT_FLAGS = (
    _MODEL_DIR,
    ("--output_dir", dict(help="the release directory to write")),
    ("--step", dict(type=int, help="checkpoint step (default: the latest)")),
    ("--vocabulary_file", dict(help="SentencePiece model (default: the checkpoint's)")),
    (
        "--eval_results",
        dict(
            help="results JSON of `t2t eval` for the model card "
            "(default <model_dir>/eval/results.json if present)"
        ),
    ),
    (
        "--overwrite",
        dict(
            action="store_true",
            help="write into a non-empty --output_dir, replacing same-named files",
        ),
    ),
)


def add_export(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a HF transformers release directory from a checkpoint",
        description="Write safetensors weights, config.json, the SentencePiece tokenizer files, "
        "the run's gin config and a model card, loadable with "
        "T5ForConditionalGeneration.from_pretrained and T5Tokenizer.from_pretrained.",
    )
    add_run_flags(parser, "export", _EXPORT_FLAGS)


_CONVERT_FLAGS = (
    (
        "source",
        dict(
            help="the checkpoint: a t2t model directory, a HF T5 directory, a T5X "
            "checkpoint (legacy or Orbax) or a Mesh TensorFlow checkpoint"
        ),
    ),
    ("destination", dict(help="the new directory to write")),
    ("--to", dict(choices=("t2t", "hf", "t5x"), required=True, help="the format to write")),
    ("--step", dict(type=int, help="which checkpoint of a model directory (default: the newest)")),
    (
        "--dtype",
        dict(choices=("float32", "bfloat16"), help="parameters' dtype (default: as stored)"),
    ),
    (
        "--vocabulary_file",
        dict(help="the SentencePiece model to carry (t2t and hf; default: the source's own)"),
    ),
)


def add_convert(subparsers) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a checkpoint between t2t, HF, T5X and Mesh TensorFlow formats",
        description="Read a checkpoint in any format t2t reads (detected from its files) and "
        "write it as a t2t model directory, a HF T5 directory or a legacy T5X checkpoint "
        "(with Adafactor slots, which T5X's fine-tuning restores).",
    )
    add_run_flags(parser, "convert", _CONVERT_FLAGS)


_AVERAGE_FLAGS = (
    _MODEL_DIR,
    ("--output_dir", dict(help="the new model directory")),
    ("--last", dict(type=int, help="average the last N checkpoints")),
    ("--steps", dict(type=ints, help="average these steps (comma-separated)")),
)


def add_average(subparsers) -> None:
    parser = subparsers.add_parser(
        "average",
        help="average the parameters of the last N (or given) checkpoints",
        description="Write the element-wise mean of checkpoints' parameters as a new model "
        "directory (one checkpoint, parameters only), read one checkpoint at a time.",
    )
    add_run_flags(parser, "average", _AVERAGE_FLAGS, one_of=("--last", "--steps"))
