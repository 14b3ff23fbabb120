"""T5.1.1-base train step on one GPU in bfloat16: t2t (JAX) against HF transformers (PyTorch).

Workload: T5.1.1-base (248M parameters, gated-GELU, untied logits), batch B x 512 input and 114
target tokens of random ids (no padding), dropout off, one optimizer step per batch.

- t2t: `t2t.nn.get_preset("t5_1_1_base", dtype="bfloat16")` (matmuls in bfloat16; parameters,
  norms, softmax and the loss in float32) -> `EncoderDecoderModel.loss_fn` (cross-entropy + z-loss)
  -> `t2t.optim.adafactor` -> `optax.apply_updates`: `t2t.trainer.steps.make_train_step`, one
  `jax.jit` with parameters and optimizer state donated.
- HF: `T5ForConditionalGeneration(T5Config.from google/t5-v1_1-base's shape)` under
  `torch.autocast("cuda", torch.bfloat16)` (float32 parameters) -> `loss.backward()` ->
  `transformers.optimization.Adafactor` (T5's settings), TF32 allowed.

Each side runs in its own process (JAX takes most of the GPU's memory), t2t first. Step time is
the median of the timed steps after warm-up (compilation excluded). MFU = exact model FLOPs
(`t2t.nn.flops.training_flops`, 3x the forward matmuls) x B / step time / the chip's dense
bfloat16 peak (989 TFLOP/s for an H100 SXM or H200, 312 for an A100).

    python benchmarks/gpu_train_step_bench.py --batches 64,128 [--steps 20]

Needs a GPU. On a machine without seqio (the lent GPU machines have JAX, flax, optax, torch and
transformers but no TensorFlow and no network), `seqio` is replaced by a stand-in holding the
three names `t2t.models` refers to; nothing of seqio runs in a train step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import types

INPUT_LENGTH, TARGET_LENGTH, VOCAB = 512, 114, 32128
PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "B200": 2250e12}
RESULT = "RESULT "


def _peak(name: str) -> float | None:
    return next((v for k, v in PEAKS.items() if k in name), None)


def _batch(batch_size: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    inputs = rng.integers(2, VOCAB, (batch_size, INPUT_LENGTH), dtype=np.int32)
    targets = rng.integers(2, VOCAB, (batch_size, TARGET_LENGTH), dtype=np.int32)
    return inputs, targets


def _import_t2t():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, here)
    try:
        import seqio  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("seqio")
        for name in (
            "Vocabulary",
            "FeatureConverter",
            "EncDecFeatureConverter",
            "DecoderFeatureConverter",
        ):
            setattr(stand_in, name, type(name, (), {}))
        sys.modules["seqio"] = stand_in
    import t2t.nn.flops  # noqa: F401  (a submodule t2t.nn does not import)
    from t2t import models, nn, optim  # noqa: F401

    # The steps module alone: the t2t.trainer package also imports data and checkpoint code.
    spec = importlib.util.spec_from_file_location(
        "t2t_train_steps", os.path.join(here, "t2t", "trainer", "steps.py")
    )
    steps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(steps)
    return models, nn, optim, steps


def run_t2t(batch_size: int, steps_timed: int, warmup: int, remat: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    models, nn, optim, steps = _import_t2t()
    config = nn.get_preset("t5_1_1_base", dtype="bfloat16", dropout_rate=0.0, remat_policy=remat)
    model = models.model_for(config, loss_normalizing_factor="num_real_target_tokens")
    module = nn.build(config, nnx.Rngs(params=0))
    params = nnx.split(module)[1]
    tx = optim.adafactor(optim.inverse_sqrt())
    opt_state = tx.init(params)
    inputs, targets = _batch(batch_size)
    decoder_inputs = np.concatenate([np.zeros((batch_size, 1), np.int32), targets[:, :-1]], 1)
    batch = {
        "encoder_input_tokens": inputs,
        "decoder_target_tokens": targets,
        "decoder_input_tokens": decoder_inputs,
        "decoder_loss_weights": np.ones_like(targets, dtype=np.float32),
    }
    batch = jax.device_put(batch)
    step_fn = jax.jit(steps.make_train_step(model, tx), donate_argnums=(0, 1))
    rng = jax.random.PRNGKey(0)
    start = time.perf_counter()
    params, opt_state, metrics = step_fn(params, opt_state, batch, rng, jnp.int32(0))
    jax.block_until_ready(metrics["loss"])
    compile_seconds = time.perf_counter() - start
    times = []
    for i in range(1, warmup + steps_timed):
        start = time.perf_counter()
        params, opt_state, metrics = step_fn(params, opt_state, batch, rng, jnp.int32(i))
        jax.block_until_ready(metrics["loss"])
        if i >= warmup:
            times.append(time.perf_counter() - start)
    flops = nn.flops.training_flops(config, INPUT_LENGTH, TARGET_LENGTH) * batch_size
    device = jax.devices()[0]
    return {
        "side": "t2t",
        "batch": batch_size,
        "remat": remat,
        "step_seconds": times,
        "compile_seconds": compile_seconds,
        "loss": float(metrics["loss"]),
        "flops": flops,
        "device": getattr(device, "device_kind", str(device)),
        "versions": {"jax": jax.__version__},
    }


def run_hf(batch_size: int, steps_timed: int, warmup: int) -> dict:
    import torch
    import transformers
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.optimization import Adafactor

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    config = T5Config(
        vocab_size=VOCAB,
        d_model=768,
        d_ff=2048,
        d_kv=64,
        num_heads=12,
        num_layers=12,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = T5ForConditionalGeneration(config).to(device).train()
    optimizer = Adafactor(
        model.parameters(),
        lr=None,
        relative_step=True,
        scale_parameter=True,
        warmup_init=False,
        decay_rate=-0.8,
        clip_threshold=1.0,
        beta1=None,
        weight_decay=0.0,
    )
    inputs, targets = _batch(batch_size)
    inputs = torch.as_tensor(inputs, dtype=torch.long, device=device)
    labels = torch.as_tensor(targets, dtype=torch.long, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    times = []
    for i in range(warmup + steps_timed):
        sync()
        start = time.perf_counter()
        loss = step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return {
        "side": "hf",
        "batch": batch_size,
        "step_seconds": times,
        "loss": float(loss.detach()),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }


def _flops_per_example() -> int:
    _, nn, _, _ = _import_t2t()
    return nn.flops.training_flops(nn.get_preset("t5_1_1_base"), INPUT_LENGTH, TARGET_LENGTH)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="64,128")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--remat", default="none")
    parser.add_argument("--sides", default="t2t,hf")
    parser.add_argument("--out", help="write the results there as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        side, batch = args.child.split(":")
        if side == "t2t":
            result = run_t2t(int(batch), args.steps, args.warmup, args.remat)
        else:
            result = run_hf(int(batch), args.steps, args.warmup)
        print(RESULT + json.dumps(result), flush=True)
        return 0
    results = []
    for batch in [int(b) for b in args.batches.split(",")]:
        for side in args.sides.split(","):
            command = [
                sys.executable,
                os.path.abspath(__file__),
                f"--child={side}:{batch}",
                f"--steps={args.steps}",
                f"--warmup={args.warmup}",
                f"--remat={args.remat}",
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
            if done.returncode or not lines:
                print(f"{side} batch {batch} failed:\n{done.stderr[-3000:]}", flush=True)
                results.append({"side": side, "batch": batch, "error": done.stderr[-3000:]})
                continue
            result = json.loads(lines[-1][len(RESULT) :])
            median = statistics.median(result["step_seconds"])
            flops = _flops_per_example() * batch
            peak = _peak(result["device"])
            result.update(
                median_seconds=median,
                flops=flops,
                tokens_per_second=batch * (INPUT_LENGTH + TARGET_LENGTH) / median,
                mfu=flops / median / peak if peak else None,
                peak_flops=peak,
            )
            results.append(result)
            print(
                f"{side:4s} batch {batch:4d} on {result['device']}: {median * 1e3:8.1f} ms/step, "
                f"{result['tokens_per_second']:9.0f} tokens/s, MFU "
                + (f"{result['mfu']:.1%}" if result["mfu"] else "?")
                + (
                    f" (compile {result['compile_seconds']:.0f} s)"
                    if "compile_seconds" in result
                    else ""
                )
                + f", loss {result['loss']:.3f}",
                flush=True,
            )
    by = {(r["side"], r["batch"]): r for r in results if "median_seconds" in r}
    for batch in [int(b) for b in args.batches.split(",")]:
        if ("t2t", batch) in by and ("hf", batch) in by:
            ratio = by[("hf", batch)]["median_seconds"] / by[("t2t", batch)]["median_seconds"]
            print(f"batch {batch}: t2t / HF tokens/s = {ratio:.2f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
