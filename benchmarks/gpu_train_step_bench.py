"""The train step on one GPU in bfloat16: t2t (JAX) against HF transformers (PyTorch), eager and
under `torch.compile`, in one run on one chip; with t2t's kernel-time breakdown, its cost-model
prediction, a cuDNN correctness check and per-site attention timings.

Workload: T5.1.1-base (248M parameters; and T5.1.1-large), batch B x 512 input and 114 target
tokens of random ids (no padding), dropout off, Adafactor, one optimizer step per batch.

- t2t: `get_preset(preset, dtype="bfloat16")` (bfloat16 activations and matmuls; float32
  parameters, softmax and loss; `attention_impl="auto"`: cuDNN flash attention for the encoder,
  XLA elsewhere) -> `loss_fn` -> Adafactor, one `jax.jit` with donated state
  (`t2t.trainer.steps.make_train_step`).
- HF: `T5ForConditionalGeneration` of the same shape under `torch.autocast(bfloat16)` (float32
  parameters), `transformers.optimization.Adafactor` with T5's settings, TF32 allowed; eager and
  `torch.compile(model)` (what nanoT5 runs).

Jobs run in priority order (`JOBS`, each with what it shows; `--list` prints them numbered), each
in its own process, until the time budget is spent (a job that would not fit is skipped and
listed); results are written after every job, so a cut-off run keeps what it measured. `--jobs`
runs a subset in the order given.

Step time is the median over 3 windows of steps dispatched back to back with one wait at the end
of each (as t2t's trainer runs, which fetches metrics every few steps, and as PyTorch queues its
kernels), after warm-up steps that include compilation; `blocked_step_seconds` also lists steps
each waited for alone, which adds the host's dispatch time to every step. MFU = exact model FLOPs
(`t2t.nn.flops.training_flops`) x B / step time / the chip's dense bfloat16 peak.

    python benchmarks/gpu_train_step_bench.py --out $OUT/gpu_train_step.json   # on a GPU
    python benchmarks/gpu_train_step_bench.py --smoke   # the machinery, tiny, on a CPU

Needs only jax, flax, optax, torch and transformers (a bare GPU machine): the parts of t2t it
imports carry no gin, seqio or TensorFlow.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
INPUT_LENGTH, TARGET_LENGTH, VOCAB = 512, 114, 32128
# Dense bfloat16 peak FLOP/s and HBM bytes/s per chip (datasheets).
CHIPS = {
    "H100": (989e12, 3.35e12),
    "H200": (989e12, 4.8e12),
    "A100": (312e12, 2.0e12),
    "B200": (2250e12, 8.0e12),
}
RESULT = "RESULT "
PROCESS_START = time.perf_counter()
HF_SHAPES = {
    "t5_1_1_base": dict(d_model=768, d_ff=2048, num_heads=12, num_layers=12),
    "t5_1_1_large": dict(d_model=1024, d_ff=2816, num_heads=16, num_layers=24),
    "tiny": dict(d_model=128, d_ff=512, num_heads=4, num_layers=2),
}


def _t2t(preset: str = "t5_1_1_base", batch: int = 128, **extra) -> dict:
    return {"kind": "t2t", "preset": preset, "batch": batch, **extra}


def _hf(preset: str = "t5_1_1_base", batch: int = 128, compile: bool = True) -> dict:
    return {"kind": "hf", "preset": preset, "batch": batch, "compile": compile}


# JAX's default 75% of the GPU's memory is too little for these (gpu_deviceless.py plans T5.1.1-
# large at 128 at 58.5 GiB of temporaries, base at 256 at 61.6 GB, besides the arguments).
MORE_MEMORY = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.92"}
UNROLLED = dict(scan_layers=True, unroll_layers=True)
# (job, seconds it is expected to take on an H100 including the process start and compile, what
# it shows). The numbers of `--jobs` and of benchmarks/README.md are positions in this list.
JOBS = [
    ({"kind": "check"}, 60, "the shipped check of cuDNN attention against the formula"),
    (
        _t2t(profile=True, predict=True),
        90,
        "t2t base at 128, profiled (kernel time by kind, and the non-matmul kernels' time by the "
        "line of t2t that made them) with the cost model's prediction at the chip's measured "
        "rates; the trace and the optimized program are written beside the results",
    ),
    (_hf(), 150, "HF + torch.compile base at 128"),
    (_t2t(batch=64, predict=True), 60, "t2t base at 64 with the prediction"),
    (_t2t(attention_impl="xla"), 60, "t2t base at 128, attention on XLA"),
    ({"kind": "sites", "preset": "t5_1_1_base", "batch": 128}, 50, "each site, XLA vs cuDNN"),
    (_t2t("t5_1_1_large", env=MORE_MEMORY), 120, "t2t large at 128"),
    (_hf(batch=64, compile=False), 40, "HF eager base at 64"),
    (_t2t(batch=256, env=MORE_MEMORY), 80, "t2t base at 256 (the largest batch tried)"),
    (_hf(batch=64), 120, "HF + torch.compile base at 64"),
    (_hf("t5_1_1_large"), 200, "HF + torch.compile large at 128"),
    (_t2t(scan_layers=True), 70, "scanned layers: Adafactor on stacked parameters"),
    (_t2t(attention_impl="cudnn"), 70, "attention_impl='cudnn': the causal decoder on cuDNN too"),
    (
        _t2t(env={"JAX_THREEFRY_GPU_KERNEL_LOWERING": "1"}),
        70,
        "threefry as one CUDA kernel (the same random numbers): does the init compile faster?",
    ),
    (
        _t2t(norm_impl="pallas", predict=True),
        80,
        "the residual adds and norms as Pallas kernels (t2t.nn.norm_kernels), with the "
        "prediction; its loss should match job 2's",
    ),
    (
        _t2t(code="$BASELINE_CODE"),
        80,
        "the t2t package under $BASELINE_CODE (e.g. `git archive <commit> t2t | tar -x -C "
        ".baseline`): the same-call baseline of a change",
    ),
    (_t2t(**UNROLLED, profile=True), 90, "stacked parameters, unrolled layers, profiled"),
    (
        _t2t(**UNROLLED, norm_impl="pallas", profile=True),
        90,
        "unrolled, Pallas norms with the rows per program and warps in $NORM_BLOCKS (the last "
        "line of gpu_norm_check.py --sweep), profiled",
    ),
    (_t2t(), 70, "t2t base at 128, nothing else (job 2 without its profile and prediction)"),
]
SMOKE_JOBS = [
    ({"kind": "check", "preset": "tiny"}, 60, "the check"),
    (_t2t("tiny", 2, profile=True, predict=True), 60, "t2t, profiled and predicted"),
    (_hf("tiny", 2, compile=False), 60, "HF eager"),
    ({"kind": "sites", "preset": "tiny", "batch": 2}, 60, "each site"),
    (_t2t("tiny", 2, **UNROLLED, norm_impl="pallas"), 60, "unrolled, Pallas norms"),
    (_t2t("tiny", 2, code="$BASELINE_CODE"), 60, "the baseline's code"),
]


def chip_of(name: str) -> tuple[float, float] | None:
    return next((v for k, v in CHIPS.items() if k in name), None)


def lengths(smoke: bool) -> tuple[int, int]:
    return (32, 8) if smoke else (INPUT_LENGTH, TARGET_LENGTH)


def _batch(batch_size: int, smoke: bool, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    inputs_length, targets_length = lengths(smoke)
    vocab = 2048 if smoke else VOCAB
    inputs = rng.integers(2, vocab, (batch_size, inputs_length), dtype=np.int32)
    targets = rng.integers(2, vocab, (batch_size, targets_length), dtype=np.int32)
    return inputs, targets


def _code_root() -> str:
    """Where this process imports t2t from: the repository, or a job's `code` (a directory
    holding another version's `t2t` package; `$NAME` reads the environment)."""
    code = os.environ.get("T2T_BENCH_CODE")
    return os.path.abspath(os.path.join(REPO, code)) if code else REPO


def _import_t2t():
    """t2t's network, model wrappers, optimizer and cost model, and the train-step module alone
    (the `t2t.trainer` package would also import the data pipeline and checkpoints)."""
    root = _code_root()
    sys.path.insert(0, root)
    import t2t.aot.cost_model  # noqa: F401
    import t2t.aot.flops  # noqa: F401
    import t2t.nn.flops  # noqa: F401
    from t2t import models, nn, optim

    spec = importlib.util.spec_from_file_location(
        "t2t_train_steps", os.path.join(root, "t2t", "trainer", "steps.py")
    )
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    return models, nn, optim, steps


def _config(nn, preset: str, smoke: bool, **overrides):
    fields = dict(dtype="bfloat16", dropout_rate=0.0, **overrides)
    if smoke:
        fields.update(vocab_size=2048)
    return nn.get_preset(preset, **fields)


def measured_rates(attention_shape: tuple | None = None) -> dict:
    """This chip's bfloat16 matmul rate (an 8192^3 product) and copy bandwidth (bytes read +
    written by an elementwise pass over 1 GiB), each the median of 10 runs after a warm-up;
    on a GPU and given `(batch, heads, head_dim, (input_length, target_length))`, also cuDNN
    attention's rate at the network's shapes (`_attention_rate`)."""
    import jax
    import jax.numpy as jnp

    def median_seconds(fn, *args):
        jax.block_until_ready(fn(*args))
        times = []
        for _ in range(10):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    n = 8192 if jax.default_backend() == "gpu" else 512
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.bfloat16)
    matmul = median_seconds(jax.jit(lambda a: a @ a), a)
    elements = 2**29 if jax.default_backend() == "gpu" else 2**22
    x = jax.random.normal(jax.random.PRNGKey(1), (elements,), jnp.bfloat16)
    copy = median_seconds(jax.jit(lambda x: x * 2 + 1), x)
    rates = {"matmul_flops_per_second": 2 * n**3 / matmul, "bytes_per_second": 4 * elements / copy}
    if attention_shape and jax.default_backend() == "gpu":
        rates["attention_flops_per_second"] = _attention_rate(median_seconds, *attention_shape)
    return rates


def _attention_rate(median_seconds, batch: int, heads: int, head_dim: int, lengths) -> float:
    """FLOP/s of cuDNN's fused attention, forward + backward, over one encoder self-attention
    (with a [1, N, L, L] bias and its gradient) and one cross-attention, as each layer pair of
    an encoder-decoder runs them (no padding); FLOPs counted as `t2t.aot.flops` counts them."""
    import jax
    import jax.numpy as jnp

    input_length, target_length = lengths
    key = jax.random.PRNGKey(2)
    seconds, flops = 0.0, 0
    for length, with_bias in ((input_length, True), (target_length, False)):
        q = jax.random.normal(key, (batch, length, heads, head_dim), jnp.bfloat16)
        k = jax.random.normal(key, (batch, input_length, heads, head_dim), jnp.bfloat16)
        bias = None
        if with_bias:
            bias = jax.random.normal(key, (1, heads, length, input_length), jnp.bfloat16)

        def loss(q, k, bias):
            out = jax.nn.dot_product_attention(q, k, k, bias=bias, implementation="cudnn")
            return jnp.sum(out.astype(jnp.float32) ** 2)

        argnums = (0, 1, 2) if with_bias else (0, 1)
        seconds += median_seconds(jax.jit(jax.grad(loss, argnums=argnums)), q, k, bias)
        flops += 14 * batch * heads * length * input_length * head_dim
    return flops / seconds


def _pipelined(window, steps: int, windows: int = 3) -> list[float]:
    """Seconds per step of `windows` runs of `window(steps // windows)`, each dispatching its
    steps back to back and waiting once at the end, as a training loop does (t2t's trainer
    fetches metrics every few steps; PyTorch queues kernels until something waits)."""
    per_window = max(steps // windows, 1)
    times = []
    for _ in range(windows):
        start = time.perf_counter()
        window(per_window)
        times.append((time.perf_counter() - start) / per_window)
    return times


def run_t2t(
    job: dict, steps_timed: int, warmup: int, smoke: bool, out_dir: str | None = None
) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    models, nn, optim, steps = _import_t2t()
    from t2t.aot import cost_model
    from t2t.aot import flops as aot_flops
    from t2t.nn import attention_ops

    overrides = {"attention_impl": job.get("attention_impl", "auto")}
    for name in ("scan_layers", "unroll_layers"):
        if job.get(name):
            overrides[name] = True
    if job.get("norm_impl"):
        overrides["norm_impl"] = job["norm_impl"]
    if job.get("norm_impl") == "pallas" and os.environ.get("NORM_BLOCKS"):
        from t2t.nn import norm_kernels

        blocks = json.loads(os.environ["NORM_BLOCKS"])
        norm_kernels.BLOCKS.update({k: tuple(v) for k, v in blocks.items()})
        job = {**job, "norm_blocks": blocks}
    config = _config(nn, job["preset"], smoke, **overrides)
    model = models.model_for(config, loss_normalizing_factor="num_real_target_tokens")
    start = time.perf_counter()
    params = jax.block_until_ready(model.init_params(jax.random.PRNGKey(0)))
    init_seconds = time.perf_counter() - start
    tx = optim.adafactor(optim.inverse_sqrt())
    opt_state = jax.jit(tx.init)(params)  # (eagerly, each of its ops would compile on its own)
    inputs, targets = _batch(job["batch"], smoke)
    batch = jax.device_put(
        {
            "encoder_input_tokens": inputs,
            "decoder_target_tokens": targets,
            "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
            "decoder_loss_weights": np.ones_like(targets, dtype=np.float32),
        }
    )
    rng = jax.random.PRNGKey(0)
    jitted = jax.jit(steps.make_train_step(model, tx), donate_argnums=(0, 1))
    process_seconds = time.perf_counter() - PROCESS_START
    start = time.perf_counter()
    traced = jitted.trace(params, opt_state, batch, rng, jnp.int32(0))
    compiled = traced.lower().compile()
    compile_seconds = time.perf_counter() - start
    blocked = []
    for i in range(warmup + min(steps_timed, 5)):
        start = time.perf_counter()
        params, opt_state, metrics = compiled(params, opt_state, batch, rng, jnp.int32(i))
        jax.block_until_ready(metrics["loss"])
        if i >= warmup:
            blocked.append(time.perf_counter() - start)

    def window(steps):
        nonlocal params, opt_state, metrics
        for i in range(steps):
            params, opt_state, metrics = compiled(params, opt_state, batch, rng, jnp.int32(i))
        jax.block_until_ready(metrics["loss"])

    times = _pipelined(window, steps_timed)
    device = jax.devices()[0]
    platform = jax.default_backend()
    input_length, target_length = lengths(smoke)
    result = {
        "side": "t2t",
        **job,
        "step_seconds": times,
        "blocked_step_seconds": blocked,
        "compile_seconds": compile_seconds,
        "setup_seconds": process_seconds,  # from the process's start, imports included
        "init_seconds": init_seconds,  # the parameters' initialization, compile included
        "loss": float(metrics["loss"]),
        "flops": nn.flops.training_flops(config, input_length, target_length) * job["batch"],
        "device": getattr(device, "device_kind", str(device)),
        "peak_memory_bytes": (device.memory_stats() or {}).get("peak_bytes_in_use"),
        "attention": attention_ops.describe(
            config, platform, lengths=(input_length, target_length)
        ),
        "versions": {"jax": jax.__version__},
    }
    phases = result["phase_seconds"] = {"compile": compile_seconds}
    text = compiled.as_text() if job.get("profile") or job.get("predict") else None
    if job.get("profile"):
        start = time.perf_counter()
        result["kernels"] = _profile(compiled, params, opt_state, batch, rng, steps=3, text=text)
        phases["profile"] = time.perf_counter() - start
        if out_dir:  # the trace beside the results, for reading offline (if not too large)
            trace = result["kernels"]["trace"]
            if os.path.getsize(trace) < 15 * 2**20:
                name = f"trace_{job['preset']}_{job['batch']}{_suffix(job)}.trace.json.gz"
                shutil.copy(trace, os.path.join(out_dir, name))
                result["kernels"]["trace_copy"] = name
    if job.get("predict"):
        start = time.perf_counter()
        median = statistics.median(times)
        if out_dir and job.get("profile"):  # the optimized program, to name the trace's kernels
            name = f"hlo_{job['preset']}_{job['batch']}{_suffix(job)}.txt.gz"
            with gzip.open(os.path.join(out_dir, name), "wt") as f:
                f.write(text)
            result["hlo_copy"] = name
        flops = aot_flops.matmul_flops(traced.jaxpr)
        attention_flops = aot_flops.fused_attention_flops(traced.jaxpr)
        measured = measured_rates((job["batch"], config.num_heads, config.d_kv, lengths(smoke)))
        if "kernels" in result:  # profiled: the least time a kernel took in this trace
            sys.path.insert(0, HERE)
            import gpu_profile

            least = gpu_profile.least_kernel_seconds(result["kernels"]["trace"], text)
            if least["seconds"]:
                measured["kernel_seconds"] = least["seconds"]
        chip = chip_of(result["device"])
        predictions = {
            "measured": cost_model.estimate(
                text,
                flops,
                cost_model.Rates(**measured, source="measured"),
                attention_flops=attention_flops,
                top=6,
            )
        }
        if "attention_flops_per_second" in measured:  # as the first GPU runs estimated it
            matmul_only = {k: v for k, v in measured.items() if k != "attention_flops_per_second"}
            predictions["measured, attention at the matmul rate"] = cost_model.estimate(
                text, flops, cost_model.Rates(**matmul_only, source="measured"), top=6
            )
        if chip:
            predictions["peak"] = cost_model.estimate(text, flops, cost_model.Rates(*chip), top=6)
        for prediction in predictions.values():
            prediction["error_vs_measured"] = prediction["step_seconds"] / median - 1
        result.update(measured_rates=measured, prediction=predictions)
        phases["predict"] = time.perf_counter() - start
    return result


def _suffix(job: dict) -> str:
    """What sets a job's files apart from job 2's: "", "_unrolled", "_unrolled_pallas", ..."""
    parts = [name for name in ("scan_layers", "unroll_layers") if job.get(name)]
    parts = ["unrolled"] if "unroll_layers" in parts else ["scanned"] if parts else []
    if job.get("norm_impl", "xla") != "xla":
        parts.append(job["norm_impl"])
    return "".join(f"_{part}" for part in parts)


def _profile(compiled, params, opt_state, batch, rng, steps: int, text: str) -> dict:
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, HERE)
    import gpu_profile

    directory = tempfile.mkdtemp(prefix="t2t_trace_")
    with jax.profiler.trace(directory):
        for i in range(steps):
            params, opt_state, metrics = compiled(params, opt_state, batch, rng, jnp.int32(i))
            jax.block_until_ready(metrics["loss"])
    kernels = gpu_profile.kernel_breakdown(directory, steps)
    kernels["by_source"] = gpu_profile.by_source(directory, text, steps)
    return kernels


# The fused kernel a `check` or `sites` job measures, and the platform it runs on.
KERNEL_PLATFORMS = {"cudnn": "gpu", "flash": "tpu"}


def run_check(job: dict, smoke: bool) -> dict:
    """The check every run makes before it trains on a fused kernel (`attention_check.check`),
    at the preset's shapes in bfloat16, unpacked and packed: each site's errors against the
    float32 formula, the kernel's beside XLA's."""
    _, nn, _, _ = _import_t2t()
    from t2t.nn import attention_check

    kernel = job.get("kernel", "cudnn")
    config = _config(nn, job.get("preset", "t5_1_1_base"), smoke, attention_impl=kernel)
    cases = {}
    for packed in (False, True):
        try:
            results = attention_check.check(
                config, KERNEL_PLATFORMS[kernel], lengths(smoke), packed=packed
            )
        except Exception as error:  # noqa: BLE001 (recorded: a mismatch, or a kernel refusing)
            cases["packed" if packed else "unpacked"] = {"passes": False, "error": str(error)}
            continue
        cases["packed" if packed else "unpacked"] = {
            "passes": True,
            "sites": {r.site: dataclasses.asdict(r) for r in results},
        }
    return {"side": "check", **job, "cases": cases}


def run_sites(job: dict, smoke: bool) -> dict:
    """Each attention site of the network alone (`attention_ops.sites`, operands from
    `attention_check.site_inputs`), forward + backward in bfloat16, XLA against the fused kernel
    where a run puts one: median milliseconds, and the kernel's gradient errors against XLA's."""
    import jax
    import jax.numpy as jnp

    _, nn, _, _ = _import_t2t()
    from t2t.nn import attention_check, attention_ops

    kernel = job.get("kernel", "cudnn")
    config = _config(nn, job.get("preset", "t5_1_1_base"), smoke, attention_impl=kernel)
    shape = lengths(smoke)
    chosen = attention_ops.describe(config, KERNEL_PLATFORMS[kernel], lengths=shape)
    out = {}
    for name, site in attention_ops.sites(config, shape).items():
        inputs = attention_check.site_inputs(config, name, site, shape, rows=job["batch"])
        operands = [x.astype(jnp.bfloat16) for x in inputs.operands]
        entry, grads = {}, {}
        for impl in dict.fromkeys(("xla", chosen[name])):
            step = attention_check.gradients(inputs, impl, jnp.bfloat16)
            try:
                grads[impl], _ = jax.block_until_ready(step(*operands))
            except Exception as error:  # noqa: BLE001 (recorded: a kernel refusing a shape)
                entry[impl] = {"error": str(error).splitlines()[0][:300]}
                continue
            times = []
            for _ in range(job.get("repeats", 20)):
                start = time.perf_counter()
                jax.block_until_ready(step(*operands))
                times.append(time.perf_counter() - start)
            entry[impl] = {"ms": statistics.median(times) * 1e3}
        if chosen[name] != "xla" and len(grads) == 2:
            entry[f"{chosen[name]}_gradient_errors"] = [
                attention_check.relative(got, want)
                for want, got in zip(grads["xla"], grads[chosen[name]], strict=True)
            ]
        out[name] = entry
    padding = "the last row's last quarter of keys padding"
    return {"side": "sites", **job, "sites": out, "padding": padding}


def run_hf(job: dict, steps_timed: int, warmup: int, smoke: bool) -> dict:
    import torch
    import transformers
    from transformers import T5ForConditionalGeneration

    sys.path.insert(0, HERE)
    import common

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    config = common.hf_t5_config(
        vocab_size=2048 if smoke else VOCAB,
        d_kv=64 if not smoke else 32,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        dropout_rate=0.0,
        **HF_SHAPES[job["preset"]],
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = T5ForConditionalGeneration(config).to(device).train()
    optimizer = common.hf_t5_adafactor(model.parameters())
    forward = torch.compile(model) if job.get("compile") else model
    inputs, targets = _batch(job["batch"], smoke)
    inputs = torch.as_tensor(inputs, dtype=torch.long, device=device)
    labels = torch.as_tensor(targets, dtype=torch.long, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = forward(input_ids=inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    blocked, first = [], None
    for i in range(warmup + min(steps_timed, 5)):
        sync()
        start = time.perf_counter()
        loss = step()
        sync()
        if i == 0:
            first = time.perf_counter() - start
        if i >= warmup:
            blocked.append(time.perf_counter() - start)

    def window(steps):
        nonlocal loss
        for _ in range(steps):
            loss = step()
        sync()

    times = _pipelined(window, steps_timed)
    input_length, target_length = lengths(smoke)
    return {
        "side": "hf+compile" if job.get("compile") else "hf",
        **job,
        "step_seconds": times,
        "blocked_step_seconds": blocked,
        "first_step_seconds": first,
        "loss": float(loss.detach()),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def child(job: dict, args) -> dict:
    smoke = job.get("smoke", False) or args.smoke  # the parent passes it in the job
    if job["kind"] == "t2t":
        return run_t2t(
            job, args.steps, args.warmup, smoke, os.path.dirname(os.path.abspath(args.out))
        )
    if job["kind"] == "hf":
        return run_hf(job, args.steps, args.warmup, smoke)
    if job["kind"] == "check":
        return run_check(job, smoke)
    return run_sites(job, smoke)


def _summarize(result: dict) -> dict:
    if "step_seconds" not in result:
        return result
    median = statistics.median(result["step_seconds"])
    input_length, target_length = lengths(result.get("smoke", False))
    result["median_seconds"] = median
    result["tokens_per_second"] = result["batch"] * (input_length + target_length) / median
    chip = chip_of(result.get("device", ""))
    if chip and result.get("flops") is None:
        result["flops"] = _model_flops(result["preset"], result["batch"], result.get("smoke"))
    result["mfu"] = result["flops"] / median / chip[0] if chip and result.get("flops") else None
    return result


def _model_flops(preset: str, batch: int, smoke: bool) -> int:
    _, nn, _, _ = _import_t2t()
    input_length, target_length = lengths(smoke)
    return nn.flops.training_flops(_config(nn, preset, smoke), input_length, target_length) * batch


def _line(result: dict) -> str:
    if "error" in result:
        return f"{result['kind']} {result.get('preset', '')} {result.get('batch', '')}: FAILED"
    if result["side"] == "check":
        return "check: " + ", ".join(
            f"{case} {'ok' if v.get('passes') else v}" for case, v in result["cases"].items()
        )
    if result["side"] == "sites":
        return "sites: " + "; ".join(
            f"{site} " + " ".join(f"{impl} {e['ms']:.2f} ms" for impl, e in v.items() if "ms" in e)
            for site, v in result["sites"].items()
        )
    tags = [result.get("attention_impl", "")]
    tags += [
        name
        for name in ("scan_layers", "unroll_layers", "code")
        if result.get(name) and not (name == "scan_layers" and result.get("unroll_layers"))
    ]
    if result.get("norm_impl"):
        tags.append(f"norms {result['norm_impl']} {result.get('norm_blocks', '')}".strip())
    line = (
        f"{result['side']:10s} {result['preset']} batch {result['batch']:4d} "
        f"{' '.join(t for t in tags if t)}: {result['median_seconds'] * 1e3:8.1f} ms, "
        f"{result['tokens_per_second']:9.0f} tokens/s, MFU "
        + (f"{result['mfu']:.1%}" if result.get("mfu") else "?")
    )
    if result.get("peak_memory_bytes"):
        line += f", peak {result['peak_memory_bytes'] / 2**30:.1f} GiB"
    if "kernels" in result:
        k = result["kernels"]
        line += (
            f"; kernels {k['total_ms']:.1f} ms: matmul {k['matmul_ms']:.1f}, attention "
            f"{k['attention_ms']:.1f}, other {k['other_ms']:.1f}"
        )
    if "prediction" in result:
        p = result["prediction"]["measured"]
        line += f"; predicted {p['step_seconds'] * 1e3:.1f} ms ({p['error_vs_measured']:+.0%})"
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget_s", type=float, default=540.0)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--jobs", help="comma-separated job numbers (1-based) to run")
    parser.add_argument("--list", action="store_true", help="print the jobs, numbered, and exit")
    parser.add_argument("--smoke", action="store_true", help="tiny model, few steps (CPU)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "gpu_train_step.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        result = child(json.loads(args.child), args)
        print(RESULT + json.dumps(result, default=str), flush=True)
        return 0
    plan = SMOKE_JOBS if args.smoke else JOBS
    if args.list:
        for number, (job, seconds, why) in enumerate(plan, 1):
            print(f"{number:2d}. {why} ({seconds} s): {json.dumps(job)}")
        return 0
    if args.jobs:
        plan = [plan[int(i) - 1] for i in args.jobs.split(",")]
    start, results, skipped = time.perf_counter(), [], []
    for job, expected, _ in plan:
        job = {**job, "smoke": args.smoke}
        left = args.budget_s - (time.perf_counter() - start)
        if expected > left:
            skipped.append(job)
            continue
        command = [
            sys.executable,
            os.path.abspath(__file__),
            f"--child={json.dumps(job)}",
            f"--steps={3 if args.smoke else args.steps}",
            f"--warmup={1 if args.smoke else args.warmup}",
            f"--out={args.out}",
        ]
        job_start = time.perf_counter()
        try:
            env = _environment(job)
        except ValueError as error:
            results.append({**job, "error": str(error)})
            print(_line(results[-1]), flush=True)
            continue
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=max(left, 1),
                env=env,
            )
            lines = [x for x in done.stdout.splitlines() if x.startswith(RESULT)]
            if done.returncode or not lines:
                result = {**job, "error": done.stderr[-3000:]}
            else:
                result = _summarize(json.loads(lines[-1][len(RESULT) :]))
        except subprocess.TimeoutExpired:
            result = {**job, "error": "out of time"}
        result["job_wall_seconds"] = time.perf_counter() - job_start
        results.append(result)
        print(_line(result), flush=True)
        _write(args.out, results, skipped, time.perf_counter() - start)
    _write(args.out, results, skipped, time.perf_counter() - start)
    _print_ratios(results)
    return 0


def _environment(job: dict) -> dict:
    """A job's child process environment: this one's, threefry as one CUDA kernel (what the
    `t2t` command line sets: the parameter init compiles in 15 s instead of 106 s on the
    H100, the same numbers), the job's own variables, and its `code` directory."""
    env = {"JAX_THREEFRY_GPU_KERNEL_LOWERING": "1", **os.environ, **job.get("env", {})}
    if job.get("code"):
        code = os.path.expandvars(job["code"])
        if "$" in code:
            raise ValueError(f"Job {job} needs {job['code']} set in the environment.")
        env["T2T_BENCH_CODE"] = code
    return env


def _write(path: str, results: list, skipped: list, seconds: float) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(
            {
                "command": "python benchmarks/gpu_train_step_bench.py " + " ".join(sys.argv[1:]),
                "wall_seconds": seconds,
                "results": results,
                "skipped": skipped,
            },
            f,
            indent=1,
            default=str,
        )


def _print_ratios(results: list) -> None:
    by = {
        (r["side"], r["preset"], r["batch"], r.get("attention_impl", "auto")): r
        for r in results
        if "median_seconds" in r
    }
    for (side, preset, batch, impl), r in sorted(by.items()):
        if side != "t2t" or impl != "auto":
            continue
        for peer in ("hf+compile", "hf"):
            other = by.get((peer, preset, batch, "auto"))
            if other:
                ratio = other["median_seconds"] / r["median_seconds"]
                print(f"{preset} batch {batch}: t2t / {peer} tokens/s = {ratio:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
