"""Memory and time of importing a large checkpoint in each format onto 8 CPU devices (FSDP).

A synthetic T5.1.1-shaped network of 2.4 GB of float32 parameters (d_model 2048, d_ff 8192,
32 heads of 64, 3 + 3 layers, vocabulary 32128) is written once in every format t2t reads:
legacy T5X (t2t's writer), T5X on Orbax (Orbax's own PyTree writer, the layout T5X's manager
gives, from arrays sharded over 8 devices as a pod run saves them), Mesh TensorFlow
(TensorFlow's own bundle writer, MTF's names), HF safetensors and a t2t model directory (saved
sharded, by t2t's checkpoint manager). Each is then imported in a fresh process through the shipped path,
`t2t.trainer.sources.load_params` (what `init_checkpoint` runs), onto an 8-device CPU mesh with
FSDP sharding, and the process reports:

- the peak resident memory above its baseline (JAX started, TensorFlow loaded as a training
  run has it for its data; VmHWM reset before the import), as a multiple of the parameters'
  bytes: the target is <= 1.25x (the parameters themselves are 1x: on CPU devices they live in
  host memory);
- the seconds the import took;
- in a run of 2 processes (`jax.distributed`, 4 devices each) the bytes each read from storage
  (`rchar` of /proc/self/io) and the bytes of parameter values it placed: a process should read
  about half of a TensorStore or Orbax checkpoint. TensorFlow's bundle reader and the t2t
  Orbax restore are measured too; TF reads whole arrays.

    python benchmarks/import_memory.py --dir /tmp/import_bench \\
        --output benchmarks/results/import_memory.json      # ~15 min on 2 cores, 15 GB disk
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("t5x", "t5x_orbax", "mtf", "hf", "t2t")
SIZE = dict(
    vocab_size=32128,
    d_model=2048,
    d_ff=8192,
    d_kv=64,
    num_heads=32,
    num_encoder_layers=3,
    num_decoder_layers=3,
    mlp_activations=("gelu", "linear"),
    logits_via_embedding=False,
    dropout_rate=0.0,
)


def config():
    from t2t.nn.config import TransformerConfig

    return TransformerConfig(**SIZE)


# -- writing (each format in its own process) ----------------------------------------------------


def _params():
    """path -> float32 array, deterministic, every array drawn on its own."""
    import numpy as np

    from t2t.checkpoints import hf, stored

    rng = np.random.default_rng(0)
    return {
        path: (rng.standard_normal(leaf.shape, dtype=np.float32) * 0.02)
        for path, leaf in stored.leaves(hf.abstract_state(config()))
    }


_MTF = {"attention": "SelfAttention", "self_attention": "SelfAttention"}


def _mtf_name(path: tuple[str, ...]) -> str:
    """t2t path -> Mesh TensorFlow variable name (the inverse of `t2t.checkpoints.mtf.RENAMES`)."""
    if path == ("token_embedder", "embedding"):
        return "shared/embedding"
    if path[1:] == ("logits_dense", "kernel"):
        return "decoder/logits/kernel"
    stack = path[0]
    if path[1] == "relpos_bias":
        return f"{stack}/block_000/layer_000/SelfAttention/relative_attention_bias"
    if path[1] == f"{stack}_norm":
        return f"{stack}/final_layer_norm/scale"
    block = f"{stack}/block_{int(path[1][len('layers_') :]):03d}"
    module = path[2]
    norms = {
        "pre_attention_layer_norm": 0,
        "pre_self_attention_layer_norm": 0,
        "pre_cross_attention_layer_norm": 1,
        "pre_mlp_layer_norm": 1 if stack == "encoder" else 2,
    }
    if module in norms:
        return f"{block}/layer_{norms[module]:03d}/layer_norm/scale"
    if module == "mlp":
        return f"{block}/layer_{1 if stack == 'encoder' else 2:03d}/DenseReluDense/{path[3]}/kernel"
    sub = {"query": "q", "key": "k", "value": "v", "out": "o"}[path[3]]
    if module == "encoder_decoder_attention":
        return f"{block}/layer_001/EncDecAttention/{sub}"
    return f"{block}/layer_000/SelfAttention/{sub}"


def _sharded(params: dict) -> dict:
    """`params` placed over an 8-device mesh with FSDP sharding, as a nested dict."""
    from t2t import partitioning
    from t2t.checkpoints import stored
    from t2t.trainer import init

    partitioner = partitioning.make_partitioner(-1, 1, mode="fsdp")
    abstract = dict(stored.leaves(init.abstract_model(config(), partitioner, 0)))
    placed = {
        path: stored.placed(stored.in_memory("", a), abstract[path]) for path, a in params.items()
    }
    return stored._nested(placed)


def write(kind: str, directory: str) -> None:
    from t2t.checkpoints import hf, t5x
    from t2t.conversion import t5x_slots

    target = os.path.join(directory, kind)
    if os.path.exists(target):
        return
    params = _params()
    if kind == "t5x":
        slots = {p: t5x_slots({}, a.shape) for p, a in params.items()}
        t5x.write_legacy(target, 1, params, slots)
    elif kind == "t5x_orbax":
        import orbax.checkpoint as ocp

        # Saved from arrays sharded over 8 devices, as a pod's T5X run saves: Orbax's chunks
        # are the shards.
        tree = {"target": _sharded(params), "state": {"step": 1}}
        ocp.PyTreeCheckpointer().save(os.path.join(target, "checkpoint_1", "state"), tree)
    elif kind == "mtf":
        import tensorflow as tf

        os.makedirs(target)
        names = [_mtf_name(p) for p in params] + ["global_step"]
        tensors = [tf.constant(a) for a in params.values()] + [tf.constant(1, tf.int64)]
        prefix = os.path.join(target, "model.ckpt-1")
        tf.raw_ops.SaveV2(
            prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
        )
        with open(os.path.join(target, "checkpoint"), "w") as f:  # local path: the benchmark's own
            f.write('model_checkpoint_path: "model.ckpt-1"\n')
    elif kind == "hf":
        nested: dict = {}
        for path, array in params.items():
            node = nested
            for name in path[:-1]:
                node = node.setdefault(name, {})
            node[path[-1]] = array
        hf.export_hf(target, config(), nested)
    elif kind == "t2t":
        from flax import nnx

        from t2t.checkpoints import manager

        state = hf.abstract_state(config())
        nnx.replace_by_pure_dict(state, _sharded(params))
        saving = manager.CheckpointManager(target, keep=None, async_save=False)
        saving.save(1, params=state, metadata={"config": config()})
        saving.wait_until_finished()
        saving.close()


# -- importing (each measurement in its own process) ---------------------------------------------


def _status(field: str) -> int:
    with open("/proc/self/status") as f:  # local path: the process's own
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _rchar() -> int:
    with open("/proc/self/io") as f:  # local path: the process's own
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def measure(kind: str, directory: str) -> dict:
    import jax
    import numpy as np
    import tensorflow  # noqa: F401 (loaded by every training run for its data, ~0.5 GB: baseline)

    from t2t import partitioning
    from t2t.checkpoints import stored
    from t2t.trainer import init, sources

    partitioning.initialize_distributed()
    cfg = config()
    partitioner = partitioning.make_partitioner(-1, 1, mode="fsdp")
    abstract = init.abstract_model(cfg, partitioner, 0)
    placed = [0]
    owned = stored._read_box

    def counting(array, box, dtype):  # the values this process read, in the parameters' dtype
        out = owned(array, box, dtype)
        placed[0] += out.nbytes
        return out

    stored._read_box = counting
    param_bytes = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(abstract))
    baseline = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:  # local path: resets VmHWM to VmRSS
        f.write("5")
    read_before = _rchar()
    start = time.perf_counter()
    params, _ = sources.load_params(
        os.path.join(directory, kind), cfg, abstract, partitioner=partitioner
    )
    jax.block_until_ready(params)
    seconds = time.perf_counter() - start
    local = sum(
        shard.data.nbytes for leaf in jax.tree.leaves(params) for shard in leaf.addressable_shards
    )
    return {
        "format": kind,
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "param_bytes": param_bytes,
        "peak_extra_rss_bytes": _status("VmHWM") - baseline,
        "peak_extra_over_params": round((_status("VmHWM") - baseline) / param_bytes, 3),
        "seconds": round(seconds, 2),
        "bytes_read": _rchar() - read_before,
        "bytes_placed": placed[0] if kind not in ("t2t",) else None,
        "bytes_held_on_this_process": local,
        "rss_after_extra_bytes": _status("VmRSS") - baseline,
    }


def _run(argv: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), *argv],
        env={**os.environ, "PYTHONPATH": REPO, **env},
        stdout=subprocess.PIPE,
        text=True,
    )


def _result(process: subprocess.Popen) -> dict:
    out, _ = process.communicate()
    if process.returncode:
        raise RuntimeError(f"a measuring process failed (exit {process.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="where the synthetic checkpoints go (~15 GB)")
    parser.add_argument("--output", help="results JSON")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--_write", help=argparse.SUPPRESS)
    parser.add_argument("--_measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._write:
        write(args._write, args.dir)
        return
    if args._measure:
        print(json.dumps(measure(args._measure, args.dir)), flush=True)
        return
    formats = args.formats.split(",")
    os.makedirs(args.dir, exist_ok=True)
    # TF_ENABLE_ONEDNN_OPTS=0 as the `t2t` command sets it (t2t/cli/__init__.py).
    cpu = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0"}
    for kind in ("t5x", *[k for k in formats if k != "t5x"]):
        print(f"writing {kind} ...", flush=True)
        started = time.perf_counter()
        devices = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
        _result_or_none(_run(["--dir", args.dir, "--_write", kind], {**cpu, **devices}))
        print(f"  {time.perf_counter() - started:.0f} s", flush=True)
    results = {"config": SIZE, "one_process": [], "two_processes": []}
    for kind in formats:
        env = {**cpu, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
        results["one_process"].append(_result(_run(["--dir", args.dir, "--_measure", kind], env)))
        print(json.dumps(results["one_process"][-1]), flush=True)
    for kind in formats:
        port = _free_port()
        env = {
            **cpu,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
            "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            "JAX_NUM_PROCESSES": "2",
        }
        pair = [
            _run(["--dir", args.dir, "--_measure", kind], {**env, "JAX_PROCESS_ID": str(i)})
            for i in range(2)
        ]
        results["two_processes"].append([_result(p) for p in pair])
        print(json.dumps(results["two_processes"][-1]), flush=True)
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    if args.output:
        with open(args.output, "w") as f:  # local path: the benchmark's results
            json.dump(results, f, indent=2)


def _result_or_none(process: subprocess.Popen) -> None:
    process.communicate()
    if process.returncode:
        raise RuntimeError(f"writing failed (exit {process.returncode})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
