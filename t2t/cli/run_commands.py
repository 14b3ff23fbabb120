"""`t2t train`, `t2t chain`, `t2t study`, `t2t compile` and `t2t check`: the gin-configured
training runs, their ahead-of-time compilation, and the checksum check of a model directory."""

from __future__ import annotations

import os

from t2t.cli.gin_flags import add_gin_flags, configure, ints
from t2t.errors import UserError


def add_train(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a model configured by gin files (pretraining or fine-tuning)",
        description="Train as the gin files say (t2t.runs.train). Example: t2t train "
        "--gin_file=gin/experiments/tiny_builtin_demo.gin --gin.MODEL_DIR=\"'/tmp/demo'\" "
        "--gin.TRAIN_STEPS=100. --gin.NAME=VALUE binds any gin parameter or macro after the "
        "files; restarting with the same MODEL_DIR resumes from its latest checkpoint.",
    )
    parser.add_argument(
        "--start_over",
        action="store_true",
        help="train from step 0 although MODEL_DIR's checkpoints are all damaged (without it "
        "such a directory is refused, so a retry never starts over silently)",
    )
    add_gin_flags(parser)

    def handler(args) -> None:
        from t2t import runs

        if not args.gin_file:
            raise ValueError(
                "t2t train needs at least one --gin_file, e.g. "
                "--gin_file=gin/experiments/tiny_builtin_demo.gin"
            )
        if args.start_over:
            args.gin_bindings = [*args.gin_bindings, "t2t.runs.CheckpointOptions.start_over = True"]
        configure(args)
        summary = runs.train()
        first, last = summary["first_loss"], summary["last_loss"]
        if first is not None:
            print(
                f"trained steps {summary['first_step']} -> {summary['last_step']}: loss "
                f"{first:.3f} -> {last:.3f}; {summary['tokens_seen']} tokens seen"
            )
        for name, value in summary["eval"].items():
            print(f"  {name}: {value:.4f}")

    parser.set_defaults(handler=handler)


def add_chain(subparsers) -> None:
    parser = subparsers.add_parser(
        "chain",
        help="train a chain of stages (pretrain -> intermediate -> target) in one go",
        description="Run the stages a chain file lists (t2t.chain.run.stages), each an ordinary "
        "training run in <MODEL_DIR>/<stage>, each starting from the previous stage's selected "
        "checkpoint (best by a metric, or the last). Rerunning resumes: finished stages are "
        "skipped. Example: t2t chain --gin_file=gin/chains/stilts_builtin.gin "
        "--gin.MODEL_DIR=\"'runs/stilts'\" --gin.INIT_CHECKPOINT=\"'runs/demo'\"",
    )
    parser.add_argument(
        "--stage_gin",
        action="append",
        default=[],
        metavar="BINDING",
        help="a gin binding added to every stage, e.g. --stage_gin="
        '"t2t.runs.LoopOptions.progress = False" (repeatable)',
    )
    parser.add_argument(
        "--dry_run", action="store_true", help="print each stage's t2t train command; train nothing"
    )
    add_gin_flags(parser)

    def handler(args) -> None:
        from t2t import chain

        if not args.gin_file:
            raise ValueError(
                "t2t chain needs a chain file, e.g. --gin_file=gin/chains/stilts_builtin.gin"
            )
        configure(args)
        paths = [p for item in args.gin_search_paths for p in item.split(",") if p]
        result = chain.run(bindings=args.stage_gin, dry_run=args.dry_run, search_paths=paths)
        if not args.dry_run:
            for record in result["stages"]:
                print(
                    f"  {record['name']}: {record['model_dir']} -> step "
                    f"{record['selected_step']} ({record['selection'].rsplit('@', 1)[1]})"
                )

    parser.set_defaults(handler=handler)


def _comma_list(text: str) -> list[str]:
    """ "a, b,c" -> ["a", "b", "c"] (a flag's comma-separated names)."""
    return [item.strip() for item in text.split(",") if item.strip()]


# `t2t study`'s flags: (name, add_argument keywords).
_STUDY_FLAGS = (
    (
        "name",
        dict(
            nargs="?",
            help="a study of gin/studies/ (without .gin); "
            "--gin_file adds files after it, e.g. a profile of "
            "gin/studies/profiles/ for the real benchmarks",
        ),
    ),
    ("--study_dir", dict(help="where runs and results go (default: the file's STUDY_DIR)")),
    ("--seeds", dict(type=ints, help="restarts, e.g. 0,1,2 (default: the file's)")),
    (
        "--pretrainings",
        dict(
            type=ints,
            help="pretraining seeds, e.g. 0,1,2: each arm's shared stages trained once per seed, "
            "each fine-tuned with every --seeds restart (default: the file's)",
        ),
    ),
    (
        "--arms",
        dict(
            help="only these arms, comma-separated names (default: all the file's); a name "
            'with a comma in it is matched whole, e.g. --arms="32 examples (1,000 repeats)"',
        ),
    ),
    (
        "--print_commands",
        dict(action="store_true", help="print every run's t2t train commands; train nothing"),
    ),
    (
        "--plan",
        dict(
            metavar="STUDY_JSON",
            nargs="?",
            const="",
            help="train nothing; print the grid's size and the wall time of what is left to train "
            "(from the stages timed under --plan_timing); given a finished study's study.json, "
            "also the seeds each pair of arms the paper scores needs, from that study's per-seed "
            "spread",
        ),
    ),
    (
        "--plan_timing",
        dict(
            type=_comma_list,
            default=[],
            metavar="DIR[,DIR]",
            help="with --plan: study directories whose finished stages (their chain.json) give the "
            "seconds per step (default: the study's own directory and that of --plan's study)",
        ),
    ),
    (
        "--plan_arms",
        dict(
            type=_comma_list,
            default=[],
            help="with --plan: only these arms of the finished study give the spread "
            "(comma-separated names; default: all of them)",
        ),
    ),
    (
        "--aggregate_only",
        dict(action="store_true", help="train nothing; aggregate the runs that have results"),
    ),
    (
        "--reuse",
        dict(
            type=_comma_list,
            default=[],
            metavar="DIR[,DIR]",
            help="other studies' directories: a finished run there that repeats one of this "
            "study's (the same commands, code up to comments, environment) is taken instead of "
            "trained, its score.json naming it",
        ),
    ),
    (
        "--stage_gin",
        dict(
            action="append",
            default=[],
            metavar="BINDING",
            help="a gin binding added to every stage of every run (repeatable)",
        ),
    ),
)


def add_study(subparsers) -> None:
    parser = subparsers.add_parser(
        "study",
        help="run a study (arms x tasks x seeds) and aggregate it: study.md/json/png",
        description="Run the grid a study file declares (gin/studies/NAME.gin, or --gin_file), "
        "each run an ordinary model directory under the study directory; rerunning skips "
        "finished runs and resumes the rest. Then aggregate: per arm and task mean +- std over "
        "seeds, degenerate runs, the suite average, a t-test against the baseline arm and the "
        "ordering beside the paper's, in study.md, study.json and study.png. Example: t2t study "
        "finetuning_methods --study_dir=runs/studies/finetuning_methods",
    )
    for name, keywords in _STUDY_FLAGS:
        parser.add_argument(name, **keywords)
    add_gin_flags(parser)
    parser.set_defaults(handler=_run_study)


def _run_study(args) -> None:
    """`t2t study`: the study file (and profiles) configured, the flags over its bindings."""
    from t2t.studies import runner

    if args.name:  # the study's file first; --gin_file ones (a profile) after it
        args.gin_file = [_study_file(args.name), *args.gin_file]
    if not args.gin_file:
        raise ValueError(
            "t2t study needs a study: a name from gin/studies/ (e.g. t2t study "
            "finetuning_methods) or --gin_file=FILE."
        )
    configure(args)
    overrides = {"print_commands": args.print_commands, "aggregate_only": args.aggregate_only}
    if args.plan is not None:
        overrides["plan"] = True
        overrides["plan_timing"] = args.plan_timing
    if args.plan:
        from t2t import files

        if not files.exists(args.plan) or files.isdir(args.plan):
            raise UserError(
                f"--plan needs a finished study's study.json; {args.plan!r} is not a file "
                "(e.g. studies/results/builtin_tiny/pretraining/study.json)."
            )
        overrides["plan_from"] = args.plan
        overrides["plan_arms"] = args.plan_arms
    if args.study_dir:
        overrides["study_dir"] = args.study_dir
    if args.seeds:
        overrides["seeds"] = args.seeds
    if args.pretrainings:
        overrides["pretrainings"] = args.pretrainings
    if args.reuse:
        overrides["reuse"] = args.reuse
    if args.arms:
        import gin

        try:
            names = [arm["name"] for arm in gin.query_parameter("t2t.studies.run.arms")]
        except (ValueError, KeyError, TypeError):  # no arms bound: run() says what is missing
            names = []
        overrides["only_arms"] = runner.split_arm_names(args.arms, names)
    if args.stage_gin:
        import gin

        bound = gin.get_bindings("t2t.studies.run").get("bindings", ())
        overrides["bindings"] = [*bound, *args.stage_gin]
    paths = [p for item in args.gin_search_paths for p in item.split(",") if p]
    result = runner.run(search_paths=paths, **overrides)
    if result is not None:
        print(f"study written to {result['study_dir']}/study.md (and study.json, study.png)")


def _study_file(name: str) -> str:
    from t2t import runs

    for root in runs.default_search_paths():
        path = os.path.join(root, "studies", f"{name}.gin")
        if os.path.exists(path):  # local path: gin files
            return path
    root = runs.default_search_paths()[0]
    studies = os.path.join(root, "studies")
    known = (
        sorted(f[:-4] for f in os.listdir(studies) if f.endswith(".gin"))  # local path: gin files
        if os.path.isdir(studies)  # local path: gin files
        else []
    )
    raise ValueError(f"No study {name!r}; gin/studies/ has {known}.")


def add_compile(subparsers) -> None:
    parser = subparsers.add_parser(
        "compile",
        help="compile a training run for a TPU slice, GPUs or CPU devices ahead of time: memory, "
        "FLOPs, collectives, and what would make it fit",
        description="Lower and compile the train step (and greedy decoding) that `t2t train` "
        "would run under the same gin files, with their real shardings, on abstract inputs: "
        "nothing runs and no data is read. --topology uses libtpu's compiler (pip install -e "
        "'.[tpu]'; no TPU needed). Reports memory per device against the device's, compiled vs. "
        "model FLOPs, the collectives, the compute dtype and attention implementation, and the "
        "step's estimated time from its matmul FLOPs and memory traffic with its largest "
        "memory-bound operations; exits 1 when the step does not fit, with settings that would "
        "make it fit. Example: t2t compile --gin_file="
        "gin/experiments/t5_1_1_base_c4.gin --topology=v5e:4x4 --batch_size=2048 "
        "--sharding_mode=fsdp --remat_policy=full --scan_layers",
    )
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--topology",
        help="a Cloud TPU slice: GENERATION:CHIPS, e.g. v5e:4x4, "
        "v4:4x4x4, v5p:8x8x16, v3:16x32 (v2, v3, v4, v5e, v5p, v6e); or NVIDIA GPUs: h100, "
        "h200, h100:8 (one host of 8), h100:4x8 (4 hosts of 8), compiled through JAX's CUDA "
        "plugin (pip install -e '.[cuda]'; no GPU needed)",
    )
    target.add_argument("--cpu_devices", type=int, help="compile for N CPU devices instead")
    for name, keywords in _COMPILE_FLAGS:
        parser.add_argument(name, **keywords)
    add_gin_flags(parser)
    parser.set_defaults(handler=_run_compile)


# `t2t compile`'s flags besides its target: (name, add_argument keywords); each one given is
# passed to `t2t.runs.compile_train` under its name, over the run's gin bindings.
_COMPILE_FLAGS = (
    (
        "--device_memory_gib",
        dict(type=float, help="with --cpu_devices: memory per device to check against"),
    ),
    ("--batch_size", dict(type=int, help="global batch (default: the run's)")),
    ("--mesh_shape", dict(type=ints, help="DATA,MODEL (default: the run's)")),
    ("--sharding_mode", dict(choices=("data_parallel", "tensor_parallel", "fsdp"))),
    ("--num_microbatches", dict(type=int)),
    ("--remat_policy", dict(choices=("none", "full", "dots", "dots_with_no_batch_dims"))),
    (
        "--scan_layers",
        dict(
            action="store_true", default=None, help="scan the layers (default: the model config's)"
        ),
    ),
    (
        "--unroll_layers",
        dict(
            action="store_true",
            default=None,
            help="with --scan_layers: keep the stacked parameters, unroll the loop (default: "
            "the model config's)",
        ),
    ),
    (
        "--attention_impl",
        dict(
            choices=("auto", "xla", "cudnn", "flash"),
            help="how attention is computed (default: the model config's, normally auto)",
        ),
    ),
    (
        "--no_decode",
        dict(dest="decode", action="store_false", default=None, help="compile the train step only"),
    ),
    ("--output_json", dict(help="write the report there as JSON")),
)


def _run_compile(args) -> int:
    """`t2t compile`: the target's devices described before JAX starts, then the run's gin
    files configured and `t2t.runs.compile_train` called with the flags given."""
    from t2t.aot import targets

    if args.cpu_devices is not None:
        targets.ensure_cpu_devices(args.cpu_devices)
    elif targets.is_gpu_topology(args.topology):
        targets.prepare_gpu_compile()
    from t2t import runs

    if not args.gin_file:
        raise ValueError(
            "t2t compile needs the run's --gin_file, e.g. "
            "--gin_file=gin/experiments/t5_1_1_base_c4.gin"
        )
    configure(args, finalize=False)
    names = ["topology", "cpu_devices"]
    names += [keywords.get("dest", name[2:]) for name, keywords in _COMPILE_FLAGS]
    kwargs = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    report = runs.compile_train(**kwargs)
    return 1 if report.fits is False else 0


def add_check(subparsers) -> None:
    parser = subparsers.add_parser(
        "check",
        help="verify every checkpoint of a model directory against its checksums",
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
            note = {
                "ok": "",
                "unverified": " (saved without checksums: read back without "
                "error, values not verified)",
            }.get(status, "")
            print(f"step {step}: {status}{note}", flush=True)
            for problem in problems:
                print(f"    {problem}", flush=True)

        results = directory.check(report)
        damaged = [step for step, (status, _) in results.items() if status == "damaged"]
        print(
            f"{len(results)} checkpoints, {len(damaged)} damaged"
            + (f" (steps {', '.join(map(str, damaged))})" if damaged else "")
        )
        return 1 if damaged else 0

    parser.set_defaults(handler=handler)
