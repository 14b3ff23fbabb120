"""Span corruption + packing throughput: this project's preprocessors vs. the t5 package.

From raw text to packed (512, 114) encoder-decoder batches, both sides run the same seqio pipeline
except for the two steps under test:

    source (one document per line) -> rekey text->targets -> TOKENIZE -> SPAN CORRUPTION
    -> seqio append_eos_after_trim -> seqio EncDecFeatureConverter(pack=True) -> batch of 128

- ours: `preprocessors.tokenize` + `preprocessors.span_corruption` (this repository, /work/venv);
- reference: `seqio.preprocessors.tokenize` + `t5.data.preprocessors.span_corruption` (the t5
  package 0.9.4, the paper's implementation, in its own environment, see `--ref_python`).

Each measurement runs in a fresh subprocess; implementations alternate, and medians over rounds
are reported. Before any speed is compared, the statistics of the examples each side produces
(noise density, noise spans per example, targets length) are checked to agree.

Workloads:
- `concat`: the paper's pipeline (documents concatenated, then split into 568-token segments):
  nearly every example fills (512, 114) exactly.
- `variable`: documents are not concatenated (t5's `merge_examples_to_reduce_padding=False`,
  our `concatenate_documents=False`): each document is split on its own, so most examples are
  short and packing decides how full the batches are; the fill ratio is reported.

Corpus: English text shipped with the interpreter (`pydoc_data.topics` and standard-library
docstrings), one document per line, unless `--corpus` names another file (one document per line).
Vocabulary: a SentencePiece unigram model trained once on the corpus into `--cache_dir`, unless
`--spm_model` names one. The built-in corpus supports at most ~14k pieces, so the default is 8000.

    python benchmarks/span_corruption_bench.py                 # both workloads, 3 rounds
    python benchmarks/span_corruption_bench.py --rounds 5 --batches 60
"""

import argparse
import ast
import functools
import json
import os
import pathlib
import statistics
import subprocess
import sys
import sysconfig
import time

from common import REPO  # importing it puts the repository on sys.path

LENGTHS = {"inputs": 512, "targets": 114}
IMPLEMENTATIONS = ("ours", "reference")
WORKLOADS = ("concat", "variable")
NUM_SENTINELS = 100


# ----------------------------------------------------------------------------- corpus and vocab


def build_corpus(path: pathlib.Path) -> None:
    """Writes pydoc topics and stdlib docstrings (8+ words, deduplicated), one per line."""
    import pydoc_data.topics

    documents = [" ".join(text.split()) for _, text in sorted(pydoc_data.topics.topics.items())]
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "lib2to3"}
    for source in sorted(stdlib.rglob("*.py")):
        if skip & set(source.parts):
            continue
        try:
            tree = ast.parse(source.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= 8:
                    documents.append(" ".join(doc.split()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(dict.fromkeys(documents)) + "\n", encoding="utf-8")


def train_vocabulary(corpus: pathlib.Path, prefix: pathlib.Path, vocab_size: int) -> None:
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        character_coverage=1.0,
        minloglevel=2,
        max_sentence_length=1 << 20,
    )


# ---------------------------------------------------------------------------------- the worker


def _task(implementation: str, workload: str, corpus: str, spm_model: str):
    import seqio
    import tensorflow as tf

    vocabulary = seqio.SentencePieceVocabulary(spm_model, extra_ids=NUM_SENTINELS)
    features = {
        "inputs": seqio.Feature(vocabulary, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary, add_eos=True),
    }
    concatenate = workload == "concat"
    if implementation == "ours":
        import preprocessors  # the repository is on sys.path: `common` put it there

        tokenize = preprocessors.tokenize
        corrupt = functools.partial(
            preprocessors.span_corruption, concatenate_documents=concatenate
        )
    else:
        from t5.data import preprocessors as t5_preprocessors

        tokenize = seqio.preprocessors.tokenize
        corrupt = functools.partial(
            t5_preprocessors.span_corruption, merge_examples_to_reduce_padding=concatenate
        )

    def source(split, shuffle_files, seed=None):
        del split, shuffle_files, seed
        lines = tf.data.TextLineDataset(corpus).repeat()
        return lines.map(lambda line: {"text": line}, num_parallel_calls=tf.data.AUTOTUNE)

    return seqio.Task(
        f"bench_{implementation}_{workload}",
        source=seqio.FunctionDataSource(source, splits=["train"]),
        preprocessors=[
            functools.partial(
                seqio.preprocessors.rekey, key_map={"inputs": None, "targets": "text"}
            ),
            tokenize,
            corrupt,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=features,
    ), vocabulary


def _statistics(dataset, vocabulary, num_examples: int) -> dict:
    """Noise density, spans and targets length of the first examples (EOS excluded)."""
    first_sentinel = vocabulary.vocab_size - NUM_SENTINELS
    noise = raw = spans = targets_length = full = 0
    full_shapes = set()
    for example in dataset.take(num_examples).as_numpy_iterator():
        inputs, targets = example["inputs"][:-1], example["targets"][:-1]
        num_spans = int((inputs >= first_sentinel).sum())
        num_noise = len(targets) - int((targets >= first_sentinel).sum())
        noise += num_noise
        raw += len(inputs) - num_spans + num_noise
        spans += num_spans
        targets_length += len(targets) + 1
        if len(inputs) + 1 == LENGTHS["inputs"]:
            full += 1
            full_shapes.add((num_noise, num_spans, len(targets) + 1))
    return {
        "examples": num_examples,
        "noise_density": noise / raw,
        "mean_spans": spans / num_examples,
        "mean_targets_length": targets_length / num_examples,
        "full_length_fraction": full / num_examples,
        "full_length_shapes": sorted(full_shapes),
    }


def run_worker(args) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import seqio
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")
    task, vocabulary = _task(args.worker, args.workload, args.corpus, args.spm_model)
    result = {"implementation": args.worker, "workload": args.workload}
    if args.statistics:
        dataset = task.get_dataset(
            LENGTHS, split="train", shuffle=False, seed=args.seed, use_cached=False
        )
        result["statistics"] = _statistics(dataset, vocabulary, args.statistics)
    dataset = task.get_dataset(
        LENGTHS, split="train", shuffle=False, seed=args.seed, use_cached=False
    )
    packed = seqio.EncDecFeatureConverter(pack=True)(dataset, LENGTHS)
    batches = iter(packed.batch(args.batch_size, drop_remainder=True).prefetch(2))
    for _ in range(args.warmup):
        next(batches)
    examples = tokens = slots = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.batches):
        batch = next(batches)
        segments = batch["encoder_segment_ids"].numpy()
        examples += int(segments.max(axis=1).sum())
        for key in ("encoder_input_tokens", "decoder_target_tokens"):
            values = batch[key].numpy()
            tokens += int((values != 0).sum())
            slots += values.size
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    result.update(
        examples_per_s=examples / wall,
        tokens_per_s=tokens / wall,
        cpu_ms_per_example=1000 * cpu / examples,
        fill_ratio=tokens / slots,
        examples=examples,
        seconds=wall,
    )
    return result


# ------------------------------------------------------------------------------ the orchestrator


def _spawn(args, implementation: str, workload: str, with_statistics: bool) -> dict:
    python = sys.executable if implementation == "ours" else args.ref_python
    command = [
        python,
        __file__,
        "--worker",
        implementation,
        "--workload",
        workload,
        "--corpus",
        str(args.corpus),
        "--spm_model",
        str(args.spm_model),
        "--batches",
        str(args.batches),
        "--warmup",
        str(args.warmup),
        "--batch_size",
        str(args.batch_size),
        "--seed",
        str(args.seed),
        "--statistics",
        str(args.statistics if with_statistics else 0),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{implementation}/{workload} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def _check_statistics(ours: dict, reference: dict, workload: str) -> None:
    """Raises unless both sides produce examples with the same statistics."""
    problems = []
    for key, tolerance in (
        ("noise_density", 0.002),
        ("mean_spans", 0.02),
        ("mean_targets_length", 0.02),
    ):
        a, b = ours[key], reference[key]
        if abs(a - b) > tolerance * (1 if key == "noise_density" else abs(b)):
            problems.append(f"{key}: ours {a:.4f} vs reference {b:.4f}")
    if ours["full_length_shapes"] != reference["full_length_shapes"]:
        problems.append(
            f"full-length (noise, spans, targets): ours {ours['full_length_shapes']} vs "
            f"reference {reference['full_length_shapes']}"
        )
    if problems:
        raise RuntimeError(
            f"statistics differ on {workload}, speed not compared: " + "; ".join(problems)
        )


def _prepare(args) -> None:
    cache = pathlib.Path(args.cache_dir)
    if args.corpus is None:
        args.corpus = cache / "corpus.txt"
        if not args.corpus.exists():
            build_corpus(args.corpus)
    if args.spm_model is None:
        prefix = cache / f"spm_{args.vocab_size}"
        args.spm_model = prefix.with_suffix(".model")
        if not args.spm_model.exists():
            train_vocabulary(pathlib.Path(args.corpus), prefix, args.vocab_size)


def run_comparison(args) -> dict:
    _prepare(args)
    report = {
        "lengths": LENGTHS,
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "batches": args.batches,
        "corpus": str(args.corpus),
        "spm_model": str(args.spm_model),
        "workloads": {},
    }
    for workload in args.workloads:
        stats = {impl: _spawn(args, impl, workload, True)["statistics"] for impl in IMPLEMENTATIONS}
        _check_statistics(stats["ours"], stats["reference"], workload)
        runs = {impl: [] for impl in IMPLEMENTATIONS}
        for round_index in range(args.rounds):
            order = IMPLEMENTATIONS if round_index % 2 == 0 else IMPLEMENTATIONS[::-1]
            for impl in order:
                runs[impl].append(_spawn(args, impl, workload, False))
                print(
                    f"{workload} round {round_index + 1} {impl}: "
                    f"{runs[impl][-1]['examples_per_s']:.0f} examples/s",
                    flush=True,
                )
        summary = {}
        for impl in IMPLEMENTATIONS:
            summary[impl] = {
                key: statistics.median(r[key] for r in runs[impl])
                for key in ("examples_per_s", "tokens_per_s", "cpu_ms_per_example", "fill_ratio")
            }
            summary[impl]["statistics"] = stats[impl]
        summary["ratio_examples_per_s"] = (
            summary["ours"]["examples_per_s"] / summary["reference"]["examples_per_s"]
        )
        summary["ratio_cpu_per_example"] = (
            summary["reference"]["cpu_ms_per_example"] / summary["ours"]["cpu_ms_per_example"]
        )
        summary["runs"] = runs
        report["workloads"][workload] = summary
    return report


def _print_table(report: dict) -> None:
    print(
        f"\nspan corruption + packing to {report['lengths']}, batches of {report['batch_size']}, "
        f"median of {report['rounds']} rounds"
    )
    print(
        f"{'workload':10} {'implementation':14} {'examples/s':>11} {'tokens/s':>11} "
        f"{'cpu ms/ex':>10} {'fill':>6}"
    )
    for workload, summary in report["workloads"].items():
        for impl in IMPLEMENTATIONS:
            s = summary[impl]
            print(
                f"{workload:10} {impl:14} {s['examples_per_s']:11.0f} {s['tokens_per_s']:11.0f} "
                f"{s['cpu_ms_per_example']:10.3f} {s['fill_ratio']:6.3f}"
            )
        print(
            f"{workload:10} {'ratio':14} {summary['ratio_examples_per_s']:11.2f} "
            f"(cpu per example: {summary['ratio_cpu_per_example']:.2f}x less)"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus",
        type=pathlib.Path,
        default=None,
        help="text file, one document per line (default: the built-in corpus)",
    )
    parser.add_argument(
        "--spm_model",
        type=pathlib.Path,
        default=None,
        help="SentencePiece model (default: trained on the corpus, cached)",
    )
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--cache_dir", default=str(pathlib.Path.home() / ".cache" / "t2t_bench"))
    parser.add_argument(
        "--ref_python",
        default="/work/venv-t5ref/bin/python",
        help="python of an environment with the t5 package (see tests/preprocessors/data)",
    )
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40, help="timed batches per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed batches per run")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--statistics", type=int, default=3000, help=argparse.SUPPRESS)
    parser.add_argument(
        "--out", default=str(REPO / "benchmarks" / "results" / "span_corruption.json")
    )
    parser.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--workload", choices=WORKLOADS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(args)))
        return
    report = run_comparison(args)
    _print_table(report)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
