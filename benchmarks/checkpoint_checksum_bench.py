"""What checkpoint checksums cost: fingerprints on save and their verification on restore.

For the demo network (the tiny preset on the built-in vocabulary) and T5-small, with Adafactor
state after one update, this times, on the local disk, median of `--repeats`:

  fingerprint     computing the fingerprints of the parameters and optimizer state (on save,
                  before Orbax takes the arrays; again on restore, of what was read)
  save (sync)     `CheckpointManager.save` with synchronous writes, fingerprints included
  save (async)    the part of an asynchronous save the training loop waits for
  restore         `CheckpointManager.restore`, verification included

and reports the fingerprint time as a share of each (the overhead of having checksums).

    python benchmarks/checkpoint_checksum_bench.py            # both models, 5 repeats
    python benchmarks/checkpoint_checksum_bench.py --presets tiny --repeats 3

Results: benchmarks/results/checkpoint_checksums.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

MODELS = {"tiny": {"vocab_size": 2048}, "t5_small": {}}  # the demo's vocabulary: 1948 + 100
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "results", "checkpoint_checksums.json")


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(preset: str, repeats: int, root: str) -> dict:
    import jax
    from flax import nnx

    from t2t import nn, optim
    from t2t.checkpoints import integrity
    from t2t.checkpoints.manager import CheckpointManager

    config = nn.get_preset(preset, **MODELS[preset])
    params = nnx.state(nn.build(config, nnx.Rngs(params=0)), nnx.Param)
    tx = optim.adafactor(optim.constant(1e-3))
    _, opt_state = tx.update(params, tx.init(params), params)
    pure = nnx.to_pure_dict(params)
    count = sum(x.size for x in jax.tree.leaves(pure))
    size = sum(x.nbytes for x in jax.tree.leaves((pure, opt_state)))

    def fingerprint():
        integrity.fingerprints(pure)
        integrity.fingerprints(opt_state)

    fingerprint()  # compile once, as a run does at its first save
    fingerprint_s = _median_seconds(fingerprint, repeats)

    step = {"n": 0}

    def save(async_save: bool):
        directory = os.path.join(root, f"{preset}_{'async' if async_save else 'sync'}")
        manager = CheckpointManager(directory, keep=1, async_save=async_save)

        def once():
            step["n"] += 1
            manager.save(step["n"], params=params, opt_state=opt_state, metadata={"config": config})

        seconds = _median_seconds(once, repeats)
        manager.wait_until_finished()
        return manager, seconds

    manager, save_sync_s = save(False)
    async_manager, save_async_s = save(True)
    async_manager.close()
    abstract_params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    abstract_opt = jax.eval_shape(tx.init, params)
    restore_s = _median_seconds(
        lambda: jax.block_until_ready(
            jax.tree.leaves(
                manager.restore(
                    abstract_params=abstract_params, abstract_opt_state=abstract_opt
                ).params
            )
        ),
        repeats,
    )
    manager.close()
    return {
        "preset": preset,
        "parameters": int(count),
        "checkpoint_bytes": int(size),
        "fingerprint_seconds": fingerprint_s,
        "save_sync_seconds": save_sync_s,
        "save_async_blocking_seconds": save_async_s,
        "restore_seconds": restore_s,
        "share_of_save_sync": fingerprint_s / save_sync_s,
        "share_of_save_async": fingerprint_s / save_async_s,
        "share_of_restore": fingerprint_s / restore_s,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,t5_small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="t2t_checksum_bench_")
    rows = []
    try:
        for preset in args.presets.split(","):
            row = measure(preset, args.repeats, root)
            rows.append(row)
            print(
                f"{preset}: {row['parameters'] / 1e6:.1f}M parameters, "
                f"{row['checkpoint_bytes'] / 2**20:.0f} MiB with optimizer state; "
                f"fingerprints {row['fingerprint_seconds'] * 1e3:.0f} ms = "
                f"{row['share_of_save_sync']:.1%} of a synchronous save "
                f"({row['save_sync_seconds']:.2f} s), "
                f"{row['share_of_save_async']:.1%} of an asynchronous save's wait "
                f"({row['save_async_blocking_seconds']:.2f} s), "
                f"{row['share_of_restore']:.1%} of a restore ({row['restore_seconds']:.2f} s)",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    import jax

    result = {
        "command": "python benchmarks/checkpoint_checksum_bench.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "device": str(jax.devices()[0]),
        "cpu_count": os.cpu_count(),
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
