"""t2t's GPU train step compiled for an H100 on a machine without a GPU: the kernels it would
launch, its memory and the cost model's step estimate, from the optimized program alone.

XLA compiles for a GPU it is only told about (a target description: compute capability, SMs,
memory, bandwidth, cuDNN version), through JAX's CUDA plugin and `jax.experimental.topologies`.
Nothing runs; the program is what the H100 would run, except where XLA would have asked the
chip: it autotunes nothing (every GEMM goes to cuBLAS here, where the H100 picked cuBLAS for 578
of 651 and Triton for the rest; reductions stay XLA's own emitters, where the H100 moved some
into Triton fusions). Checked against the program the H100 compiled in the same configuration
(`benchmarks/results/gpu_h100/hlo_t5_1_1_base_128.txt.gz`): 5,380 kernels here vs 5,270 there,
the optimizer's 3,464 vs 3,441, t2t's layers' 1,136 vs 1,161 (`--compare`).

Use it to see what a change does to the kernels before a GPU is at hand (kernel counts per
source file, bytes and the estimate per kind); times still come from the GPU benchmark
(`gpu_train_step_bench.py`).

Needs JAX's CUDA plugin in the same version as jax (`pip install -e '.[cuda]'`, about 5 GB; no
driver, no GPU). The target is `t2t.aot.targets.gpu_target("h100")`, what `t2t compile
--topology=h100` compiles for; this script adds the kernel inventory and compiles the GPU
benchmark's configuration directly, without gin.

    python benchmarks/gpu_deviceless.py --batch 128 --compare \\
        benchmarks/results/gpu_h100/hlo_t5_1_1_base_128.txt.gz --out /tmp/deviceless.json
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")


def committed_rates() -> dict | None:
    """The H100's rates measured by the GPU benchmark (`results/gpu_train_step.json`: an
    8192^3 matmul, a 1 GiB copy) and cuDNN attention's, from its `sites` job when it ran
    (the encoder's and the cross-attention's forward + backward at batch 128)."""
    path = os.path.join(RESULTS, "gpu_train_step.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        results = json.load(f)["results"]
    rates = next((dict(r["measured_rates"]) for r in results if r.get("measured_rates")), None)
    sites_path = os.path.join(RESULTS, "gpu_train_step_check_sites.json")
    if rates and "attention_flops_per_second" not in rates and os.path.exists(sites_path):
        with open(sites_path) as f:
            sites = next(r for r in json.load(f)["results"] if r.get("side") == "sites")
        encoder, cross = sites["sites"]["encoder self-attention"], sites["sites"]["cross-attention"]
        unit = sites["batch"] * 12 * 64 * 512  # B N H S of T5.1.1-base
        flops = 14 * unit * 512 + 14 * unit * 114
        seconds = (encoder["cudnn"]["ms"] + cross["cudnn"]["ms"]) / 1e3
        rates["attention_flops_per_second"] = flops / seconds
        padding = sites.get("padding", "every row's last quarter of keys padding")
        rates["attention_rate_from"] = f"sites job, batch {sites['batch']}, {padding}"
    return rates


def compile_step(preset: str, batch: int, **overrides) -> dict:
    """The train step (`t2t.trainer.steps.make_train_step`, Adafactor, bfloat16, dropout off)
    compiled for one H100: {"hlo", "matmul_flops", "attention_flops", "memory", "seconds"}."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sys.path.insert(0, REPO)
    from t2t import models, nn, optim
    from t2t.aot import flops, targets

    spec = importlib.util.spec_from_file_location(
        "t2t_train_steps", os.path.join(REPO, "t2t", "trainer", "steps.py")
    )
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)

    mesh = Mesh(np.array(targets.gpu_target("h100").devices), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    config = nn.get_preset(preset, dtype="bfloat16", dropout_rate=0.0, **overrides)
    model = models.model_for(config, loss_normalizing_factor="num_real_target_tokens")
    tx = optim.adafactor(optim.inverse_sqrt())

    def on_gpu(tree):
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), tree
        )

    params = on_gpu(jax.eval_shape(model.init_params, jax.random.PRNGKey(0)))
    opt_state = on_gpu(jax.eval_shape(tx.init, params))
    tokens = jax.ShapeDtypeStruct((batch, 512), jnp.int32, sharding=replicated)
    targets = jax.ShapeDtypeStruct((batch, 114), jnp.int32, sharding=replicated)
    weights = jax.ShapeDtypeStruct((batch, 114), jnp.float32, sharding=replicated)
    batch_tree = {
        "encoder_input_tokens": tokens,
        "decoder_target_tokens": targets,
        "decoder_input_tokens": targets,
        "decoder_loss_weights": weights,
    }
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated)
    step = jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated)
    jitted = jax.jit(steps.make_train_step(model, tx), donate_argnums=(0, 1))
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        traced = jitted.trace(params, opt_state, batch_tree, rng, step)
        compiled = traced.lower().compile()
    memory = compiled.memory_analysis()
    return {
        "hlo": compiled.as_text(),
        "matmul_flops": flops.matmul_flops(traced.jaxpr),
        "attention_flops": flops.fused_attention_flops(traced.jaxpr),
        "memory": {
            name: getattr(memory, f"{name}_size_in_bytes", None)
            for name in ("argument", "output", "temp", "alias")
        },
        "seconds": time.perf_counter() - start,
        "attention": nn.attention_ops.describe(config, "gpu", lengths=(512, 114)),
    }


def _load_profile():
    spec = importlib.util.spec_from_file_location(
        "gpu_profile", os.path.join(REPO, "benchmarks", "gpu_profile.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def estimate(hlo_text: str, matmul_flops: float, attention_flops: float, rates: dict) -> dict:
    from t2t.aot import cost_model

    fields = {k: v for k, v in rates.items() if k in cost_model.Rates.__dataclass_fields__}
    found = cost_model.estimate(
        hlo_text,
        matmul_flops,
        cost_model.Rates(**fields, source="measured on the H100"),
        attention_flops=attention_flops,
        top=8,
    )
    found.pop("not_modeled", None)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="t5_1_1_base")
    parser.add_argument("--batch", type=int, nargs="+", default=[128])
    parser.add_argument(
        "--scan_layers",
        choices=("no", "yes", "both", "unrolled", "all"),
        default="no",
        help="layers scanned; unrolled: stacked parameters, unrolled loop (`unroll_layers`)",
    )
    parser.add_argument("--attention_impl", default="auto")
    parser.add_argument("--norm_impl", default="xla", choices=("xla", "pallas"))
    parser.add_argument(
        "--compare", help="an optimized program the GPU compiled at batch 128 (.txt[.gz])"
    )
    parser.add_argument("--hlo_out", help="write each compiled program here (.txt.gz; {batch})")
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, REPO)
    from t2t.aot import targets

    targets.prepare_gpu_compile()  # before JAX starts
    profile = _load_profile()
    rates = committed_rates()
    results = []
    scans = {
        "no": [False],
        "yes": [True],
        "both": [False, True],
        "unrolled": ["unrolled"],
        "all": [False, True, "unrolled"],
    }[args.scan_layers]
    for batch, scan in ((b, s) for s in scans for b in args.batch):
        overrides = {
            "attention_impl": args.attention_impl,
            "scan_layers": bool(scan),
            "unroll_layers": scan == "unrolled",
            "norm_impl": args.norm_impl,
        }
        compiled = compile_step(args.preset, batch, **overrides)
        result = {
            "preset": args.preset,
            "batch": batch,
            **overrides,
            "compile_seconds": round(compiled["seconds"], 1),
            "memory_bytes": compiled["memory"],
            "attention": compiled["attention"],
            "matmul_flops": compiled["matmul_flops"],
            "attention_flops": compiled["attention_flops"],
            "inventory": profile.kernel_inventory(compiled["hlo"]),
        }
        if rates:
            result["rates"] = rates
            result["estimate"] = estimate(
                compiled["hlo"], compiled["matmul_flops"], compiled["attention_flops"], rates
            )
            result["estimate_with_kernel_time"] = estimate(
                compiled["hlo"],
                compiled["matmul_flops"],
                compiled["attention_flops"],
                {**rates, "kernel_seconds": targets.gpu_rates("h100").kernel_seconds},
            )
        if args.hlo_out:
            with gzip.open(args.hlo_out.format(batch=batch), "wt") as f:
                f.write(compiled["hlo"])
        results.append(result)
        inventory = result["inventory"]
        layout = {True: " scanned", "unrolled": " stacked, unrolled"}.get(scan, "")
        line = f"{args.preset} batch {batch}{layout}: "
        line += f"{inventory['kernels']} kernels"
        if result.get("estimate"):
            e = result["estimate"]
            line += (
                f"; estimated step {e['step_seconds'] * 1e3:.1f} ms (GEMMs "
                f"{e['matmul_seconds'] * 1e3:.1f}, fused attention "
                f"{e['attention_seconds'] * 1e3:.1f}, other kernels "
                f"{e['other_seconds'] * 1e3:.1f}, {e['other_bytes'] / 1e9:.1f} GB); "
                f"{result['estimate_with_kernel_time']['step_seconds'] * 1e3:.1f} ms with the "
                "least kernel time"
            )
        print(line)
        print("  by kind:", inventory["by_kind"])
        print("  by file:", dict(list(inventory["by_file"].items())[:8]))
    output = {"target": "NVIDIA H100 80GB HBM3 (described, not present)", "results": results}
    if args.compare:
        opener = gzip.open if args.compare.endswith(".gz") else open
        with opener(args.compare, "rt") as f:
            text = f.read()
        output["compared_with"] = {"program": args.compare, **profile.kernel_inventory(text)}
        same = next((r for r in results if r["batch"] == 128 and not r["scan_layers"]), None)
        if rates and same:  # the GPU's own program, estimated with the same FLOPs and rates
            compared = output["compared_with"]
            compared["estimate"] = estimate(
                text, same["matmul_flops"], same["attention_flops"], rates
            )
            compared["estimate_with_kernel_time"] = estimate(
                text,
                same["matmul_flops"],
                same["attention_flops"],
                {**rates, "kernel_seconds": targets.gpu_rates("h100").kernel_seconds},
            )
            print(
                f"  its estimate: {compared['estimate']['step_seconds'] * 1e3:.1f} ms, "
                f"{compared['estimate_with_kernel_time']['step_seconds'] * 1e3:.1f} ms with "
                f"the least kernel time; other kernels' traffic "
                f"{compared['estimate']['other_bytes'] / 1e9:.1f} GB"
            )
        print(f"compiled on the GPU ({args.compare}): {output['compared_with']['kernels']} kernels")
        print("  by kind:", output["compared_with"]["by_kind"])
        print("  by file:", dict(list(output["compared_with"]["by_file"].items())[:8]))
    output["command"] = "python benchmarks/gpu_deviceless.py " + " ".join(argv or sys.argv[1:])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(output, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
