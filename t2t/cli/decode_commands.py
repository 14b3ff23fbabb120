"""`t2t eval`, `t2t infer`, `t2t export` and `t2t average`: subcommands whose flags override the
gin bindings of one run function (`t2t.runs`); the decoding flags become one `DecodingConfig`."""

from __future__ import annotations

from t2t.cli.gin_flags import add_gin_flags, configure, ints, lengths


def add_decoding_flags(parser) -> None:
    parser.add_argument("--batch_size", type=int, help="rows per decoding batch (default 32)")
    parser.add_argument(
        "--method", choices=("greedy", "beam", "sample"), help="decoding method (default greedy)"
    )
    parser.add_argument(
        "--beam_size", type=int, help="beam width (default 4; implies --method=beam)"
    )
    parser.add_argument("--alpha", type=float, help="beam length penalty alpha (default 0.6)")
    parser.add_argument(
        "--beam_rule",
        choices=("t5x", "hf"),
        help="which beam candidates may finish: t5x (T5X / Mesh TensorFlow, the "
        "paper's; default) or hf (HF transformers generate)",
    )
    parser.add_argument(
        "--max_decode_length",
        type=int,
        help="output tokens to decode (default: the targets length)",
    )
    parser.add_argument(
        "--first_cache_length",
        type=int,
        help="self-attention cache positions of the first decoding phase; "
        "longer decodes grow it in phases (default 32; speed only)",
    )
    parser.add_argument(
        "--mesh_shape",
        type=ints,
        help="DATA,MODEL device mesh (e.g. -1,2) to run sharded; default one device",
    )
    parser.add_argument("--sharding_mode", choices=("data_parallel", "tensor_parallel", "fsdp"))
    parser.add_argument(
        "--module",
        dest="modules",
        action="append",
        help="task registration module to import, e.g. t2t.data.tasks.glue",
    )


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


_DECODING = (
    "batch_size",
    "method",
    "beam_size",
    "alpha",
    "beam_rule",
    "max_decode_length",
    "first_cache_length",
    "mesh_shape",
    "sharding_mode",
    "modules",
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


def add_eval(subparsers) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate checkpoints on seqio tasks; report the best checkpoint per task",
        description="Run the seqio Evaluator (decode, postprocess, metrics) for the latest, a "
        "given, or every checkpoint of a model directory. Prints a table per step and the best "
        "checkpoint per task, writes TensorBoard summaries and <model_dir>/eval/results.json.",
    )
    parser.add_argument("--model_dir", help="the run's model directory")
    parser.add_argument("--tasks", help="task or mixture names, comma-separated")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, help="evaluate this step (default: the latest)")
    which.add_argument("--steps", type=ints, help="evaluate these steps (comma-separated)")
    which.add_argument("--all_steps", action="store_true", help="evaluate every saved step")
    parser.add_argument("--split", help="the split to evaluate (default validation)")
    parser.add_argument(
        "--task_feature_lengths",
        type=lengths,
        help="cut examples, e.g. inputs=512,targets=114 (default: no cut)",
    )
    parser.add_argument("--num_examples", type=int, help="at most this many examples per task")
    parser.add_argument(
        "--output_file", help="results JSON (default <model_dir>/eval/results.json)"
    )
    parser.add_argument(
        "--log_predictions",
        action="store_true",
        help="write predictions per task and step under <model_dir>/eval",
    )
    parser.add_argument(
        "--rank_classification",
        nargs="?",
        const=True,
        default=None,
        metavar="TASKS",
        help="score every label of a classification task and "
        "predict the likeliest instead of decoding: all tasks, or these "
        "(comma-separated)",
    )
    parser.add_argument(
        "--checkpoints",
        help="evaluate an ensemble of these checkpoints: steps "
        "of --model_dir and/or model directories (DIR or DIR@STEP), "
        "comma-separated; writes <model_dir>/eval/ensemble_results.json",
    )
    add_decoding_flags(parser)
    add_gin_flags(parser)
    parser.set_defaults(
        precheck=check_model_dir,
        handler=run_handler(
            "evaluate",
            (
                "model_dir",
                "tasks",
                "step",
                "steps",
                "all_steps",
                "split",
                "task_feature_lengths",
                "num_examples",
                "output_file",
                "log_predictions",
                "rank_classification",
                "checkpoints",
                *_DECODING,
            ),
            exclusive={"step": None, "steps": None, "all_steps": False},
        ),
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
    parser.add_argument("--model_dir", help="the run's model directory")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument(
        "--checkpoints",
        help="ensemble members, comma-separated: steps of "
        "--model_dir and/or model directories (DIR or DIR@STEP)",
    )
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
    add_decoding_flags(parser)
    add_gin_flags(parser)
    parser.set_defaults(
        precheck=check_model_dir,
        handler=run_handler(
            "infer",
            (
                "output_file",
                "model_dir",
                "step",
                "checkpoints",
                "input_file",
                "task",
                "split",
                "mode",
                "vocabulary_file",
                "inputs_length",
                "targets_length",
                "num_examples",
                "temperature",
                "top_k",
                "top_p",
                "seed",
                *_DECODING,
            ),
            exclusive={"input_file": None, "task": None},
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
    parser.add_argument("--model_dir", help="the run's model directory")
    parser.add_argument("--output_dir", help="the release directory to write")
    parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
    parser.add_argument("--vocabulary_file", help="SentencePiece model (default: the checkpoint's)")
    parser.add_argument(
        "--eval_results",
        help="results JSON of `t2t eval` for the model card "
        "(default <model_dir>/eval/results.json if present)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="write into a non-empty --output_dir, replacing same-named files",
    )
    add_gin_flags(parser)
    parser.set_defaults(
        precheck=check_model_dir,
        handler=run_handler(
            "export",
            ("model_dir", "output_dir", "step", "vocabulary_file", "eval_results", "overwrite"),
        ),
    )


def add_average(subparsers) -> None:
    parser = subparsers.add_parser(
        "average",
        help="average the parameters of the last N (or given) checkpoints",
        description="Write the element-wise mean of checkpoints' parameters as a new model "
        "directory (one checkpoint, parameters only), read one checkpoint at a time.",
    )
    parser.add_argument("--model_dir", help="the run's model directory")
    parser.add_argument("--output_dir", help="the new model directory")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--last", type=int, help="average the last N checkpoints")
    which.add_argument("--steps", type=ints, help="average these steps (comma-separated)")
    add_gin_flags(parser)
    parser.set_defaults(
        precheck=check_model_dir,
        handler=run_handler(
            "average",
            ("model_dir", "output_dir", "last", "steps"),
            exclusive={"last": None, "steps": None},
        ),
    )
