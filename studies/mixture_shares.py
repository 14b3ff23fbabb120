"""What a seqio mixture feeds each task: its share of the examples, of the loss and of a batch.

    python studies/mixture_shares.py builtin_glue_mt_equal [--lengths=128,32] [--examples=2000]

For each mixture (or task) and each of its tasks: the share of the examples (the mixture's
rates), of the target tokens (the loss is a mean over target tokens, so this is each task's
weight in the gradient) and of the input tokens, estimated from each task's training split at
the given lengths (default the study profile's pretraining lengths, inputs 128, targets 32;
its fine-tuning of `builtin_order` uses 64, 8); then how many examples a packed row holds
(read from the packed stream the trainer builds) and so how many of each task one step of 32
rows sees; last, each task's mean target length. studies/results/builtin_tiny/mixing/RUN.md
reads Table 11's weak multi-task models with it.
"""

from __future__ import annotations

import argparse

import numpy as np
import seqio

import t2t.data.tasks.builtin  # noqa: F401 (registers the built-in tasks and mixtures)


def _task_lengths(task: seqio.Task, examples: int, lengths: dict[str, int]) -> tuple[float, float]:
    """Mean (input, target) tokens per example of `task`'s training split, EOS included, each
    cut at its length as the feature converter cuts it."""
    ds = task.get_dataset(lengths, split="train", shuffle=True, seed=0, num_epochs=None)
    cut = [
        (min(len(e["inputs"]), lengths["inputs"]), min(len(e["targets"]), lengths["targets"]))
        for e in ds.take(examples).as_numpy_iterator()
    ]
    inputs, targets = np.mean(cut, axis=0)
    return float(inputs), float(targets)


def _examples_per_row(name: str, rows: int, lengths: dict[str, int]) -> float:
    """Mean examples in a packed row of `name`'s training stream."""
    ds = seqio.get_dataset(
        name,
        lengths,
        dataset_split="train",
        shuffle=True,
        seed=0,
        num_epochs=None,
        feature_converter=seqio.EncDecFeatureConverter(pack=True),
    )
    return float(
        np.mean([e["encoder_segment_ids"].max() for e in ds.take(rows).as_numpy_iterator()])
    )


def report(name: str, lengths: dict[str, int], examples: int, batch_size: int = 32) -> str:
    provider = seqio.get_mixture_or_task(name)
    if isinstance(provider, seqio.Mixture):
        tasks = provider.tasks
        rates = np.array([provider.get_rate(task) for task in tasks], dtype=float)
    else:
        tasks, rates = [provider], np.ones(1)
    means = np.array([_task_lengths(task, examples, lengths) for task in tasks])
    share = rates / rates.sum()
    inputs = share * means[:, 0] / (share * means[:, 0]).sum()
    targets = share * means[:, 1] / (share * means[:, 1]).sum()
    per_batch = batch_size * _examples_per_row(name, 20 * batch_size, lengths)
    lines = [
        f"{name} at {lengths}: {per_batch:.1f} examples per batch of {batch_size} packed rows",
        f"  {'task':28s} {'examples':>9s} {'target tokens':>14s} {'input tokens':>13s}"
        f" {'per step':>9s} {'targets':>8s}",
    ]
    for i in np.argsort(-share):
        lines.append(
            f"  {tasks[i].name:28s} {share[i]:9.1%} {targets[i]:14.1%} {inputs[i]:13.1%} "
            f"{share[i] * per_batch:9.1f} {means[i, 1]:8.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="registered mixtures or tasks")
    parser.add_argument("--lengths", default="128,32", help="inputs,targets lengths of a row")
    parser.add_argument("--examples", type=int, default=2000, help="examples read per task")
    args = parser.parse_args()
    inputs, targets = (int(n) for n in args.lengths.split(","))
    for name in args.names:
        print(report(name, {"inputs": inputs, "targets": targets}, args.examples))


if __name__ == "__main__":
    main()
