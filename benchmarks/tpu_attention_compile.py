"""T5.1.1-base's train step compiled for a TPU slice with each attention implementation, and
with t2t's network before the attention rework (issue 32), read by one cost model.

Nothing runs on a TPU: libtpu's compiler describes the slice (pip install -e '.[tpu]'). For every
variant the real train step (bfloat16 compute, float32 parameters, FSDP, scanned layers, full
rematerialization (`--remat_policy`), batch 2048 x 512/114 on v5e:4x4 by default) is compiled in its own process,
its optimized program saved, and then `t2t.aot.cost_model` (this tree's) reads every program
alike: memory per chip, HBM traffic per step, the estimated step at the chip's peak rates, and
where the traffic goes.

Variants:
- `before`: an earlier commit's network (`attention_impl` left to `auto`), compiled from a
  worktree of it (--before_tree): 3b5ee95 is the network before the attention rework (the mask
  added to the position bias as one float32 [B, N, L, S] array per stack).
- `xla`: this tree, `attention_impl="xla"`.
- `xla_f32_logits`: the same with `float32_attention_logits=True`.
- `xla_output_rows`: the same with the softmax gradient's row sums taken from the outputs
  whatever the rematerialization (`attention_ops.attention`'s `row_sums`: a fully
  rematerialized layer takes them from the probabilities).
- `flash`: this tree, `attention_impl="flash"` (Pallas flash attention where the lengths are
  multiples of 128: the encoder's self-attention), t2t's kernels (`t2t.nn.flash_kernels`: the
  position bias read as [N, L, S], its gradient summed over the batch in the kernel).
- `flash_jax`: the same with JAX's kernels (`jax.experimental.pallas.ops.tpu.flash_attention`,
  the bias broadcast to [B, N, L, S]), which `flash` runs where t2t's do not tile the rows.

    git worktree add /tmp/t2t-before 3b5ee95
    python benchmarks/tpu_attention_compile.py --before_tree /tmp/t2t-before
    python benchmarks/tpu_attention_compile.py --markdown   # the table from the results
    python benchmarks/tpu_attention_compile.py --variants xla,flash --inputs 2048 --targets 512 \
      --batch 256 --out benchmarks/results/tpu_attention_compile_2048.json  # long sequences
    python benchmarks/tpu_attention_compile.py --variants before,xla --before_tree DIR \
      --topology v4:2x2x1 --batch 128 --remat_policy none --out F.json  # another setting

Results: benchmarks/results/tpu_attention_compile.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "results", "tpu_attention_compile.json")
VARIANTS = {
    "before": {},
    "xla": {"attention_impl": "xla"},
    "xla_f32_logits": {"attention_impl": "xla", "float32_attention_logits": True},
    "xla_output_rows": {"attention_impl": "xla"},
    "flash": {"attention_impl": "flash"},
    "flash_jax": {"attention_impl": "flash"},
}


def dump(args) -> int:
    """Compiles one variant in this process (t2t from `args.tree`) and saves its program."""
    sys.path.insert(0, args.tree)
    from t2t import aot, models, nn, optim
    from t2t.aot import programs
    from t2t.partitioning import make_partitioner

    if args.dump == "flash_jax":  # as where t2t's kernels do not tile the rows
        from t2t.nn import flash_kernels

        flash_kernels.fits = lambda *shape, **blocks: "JAX's kernels asked for"
    if args.dump == "xla_output_rows":
        from t2t.nn import attention_ops

        attention_ops.row_sums_for = lambda remat_policy: "outputs"  # whatever the policy
    target = aot.tpu_target(args.topology)
    config = nn.get_preset(
        args.preset,
        dtype="bfloat16",
        dropout_rate=0.0,
        scan_layers=True,
        remat_policy=args.remat_policy,
        **VARIANTS[args.dump],
    )
    model = models.model_for(config)
    tx = optim.adafactor(optim.inverse_sqrt())
    partitioner = make_partitioner(target.num_devices, 1, mode="fsdp", devices=target.devices)
    shapes = programs.batch_shapes(
        model, {"inputs": args.inputs, "targets": args.targets}, args.batch
    )
    start = time.perf_counter()
    compiled = programs.compile_train_step(model, tx, partitioner, shapes, progress=False)
    memory = aot.analysis.Memory.of(compiled.compiled)
    base = os.path.join(args.hlo_dir, args.dump)
    with gzip.open(base + ".hlo.gz", "wt") as f:
        f.write(compiled.compiled.as_text())
    with open(base + ".json", "w") as f:
        json.dump(
            {
                "memory_bytes": memory.total,
                "temporary_bytes": memory.temporaries,
                "matmul_flops": compiled.matmul_flops,
                "devices": target.num_devices,
                "compile_seconds": time.perf_counter() - start,
                "tree": args.tree,
            },
            f,
        )
    return 0


def analyze(variant: str, hlo_dir: str, topology: str) -> dict:
    sys.path.insert(0, REPO)
    from t2t.aot import cost_model, targets

    base = os.path.join(hlo_dir, variant)
    with open(base + ".json") as f:
        meta = json.load(f)
    with gzip.open(base + ".hlo.gz", "rt") as f:
        text = f.read()
    chip = targets.CHIPS[topology.split(":")[0]]
    rates = cost_model.Rates(chip.peak_flops, chip.memory_bandwidth)
    estimate = cost_model.estimate(text, meta["matmul_flops"] / meta["devices"], rates, top=6)
    return {
        "variant": variant,
        "settings": VARIANTS[variant],
        "memory_gib": meta["memory_bytes"] / 2**30,
        "memory_fraction": meta["memory_bytes"] / chip.memory_bytes,
        "compile_seconds": meta["compile_seconds"],
        "estimate": estimate,
    }


def markdown(results: dict) -> str:
    rows = [
        "| variant | HBM per chip | HBM traffic per step | of it in matmul kernels | "
        "estimated step | bound | largest memory-bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for record in results["variants"]:
        e = record["estimate"]
        top = e["largest_memory_bound"][0] if e["largest_memory_bound"] else None
        rows.append(
            f"| {record['variant']} | {record['memory_gib']:.2f} GiB "
            f"({record['memory_fraction']:.0%}) | {e['hbm_bytes'] / 1e9:,.0f} GB | "
            f"{e['matmul_bytes'] / 1e9:,.0f} GB | {e['step_seconds'] * 1e3:,.0f} ms | "
            f"{e['bound']} | "
            + (f"{top['source']} ({top['bytes'] / 1e9:,.0f} GB)" if top else "")
            + " |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--before_tree", help="a worktree of an earlier commit, e.g. 3b5ee95 (variant before)"
    )
    parser.add_argument("--preset", default="t5_1_1_base")
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--topology", default="v5e:4x4")
    parser.add_argument("--remat_policy", default="full", help="TransformerConfig.remat_policy")
    parser.add_argument("--inputs", type=int, default=512, help="input length")
    parser.add_argument("--targets", type=int, default=114, help="target length")
    parser.add_argument("--hlo_dir", default="/tmp/t2t_tpu_attention_compile")
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--markdown", action="store_true", help="only print the table")
    parser.add_argument(
        "--analyze_only",
        action="store_true",
        help="read the programs saved in --hlo_dir again (no compiles), e.g. after changing the "
        "cost model",
    )
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    parser.add_argument("--tree", default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump:
        return dump(args)
    if args.markdown:
        with open(args.out) as f:
            print(markdown(json.load(f)))
        return 0
    os.makedirs(args.hlo_dir, exist_ok=True)
    variants = [v for v in args.variants.split(",") if v]
    for variant in [] if args.analyze_only else variants:
        tree = REPO
        if variant == "before":
            if not args.before_tree:
                print("variant before needs --before_tree (git worktree add DIR 3b5ee95)")
                return 2
            tree = os.path.abspath(args.before_tree)
        print(f"[{time.strftime('%H:%M:%S')}] compiling {variant} ...", flush=True)
        command = [
            sys.executable,
            os.path.abspath(__file__),
            f"--dump={variant}",
            f"--tree={tree}",
            f"--preset={args.preset}",
            f"--batch={args.batch}",
            f"--topology={args.topology}",
            f"--inputs={args.inputs}",
            f"--targets={args.targets}",
            f"--remat_policy={args.remat_policy}",
            f"--hlo_dir={args.hlo_dir}",
        ]
        env = dict(os.environ, PYTHONPATH=tree)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            print(f"{variant} failed:\n{done.stderr[-3000:]}", flush=True)
            return 1
    results = {
        "command": "python benchmarks/tpu_attention_compile.py "
        + " ".join(a for a in (argv or sys.argv[1:]) if a != "--analyze_only"),
        "machine": "libtpu's compiler on a 2-core CPU machine (nothing ran on a TPU)",
        "run": {
            "preset": args.preset,
            "batch": args.batch,
            "lengths": {"inputs": args.inputs, "targets": args.targets},
            "topology": args.topology,
            "settings": "bfloat16 compute, float32 parameters, FSDP, scanned layers, remat "
            + args.remat_policy,
        },
        "variants": [analyze(v, args.hlo_dir, args.topology) for v in variants],
    }
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
