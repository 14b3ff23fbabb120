"""What the benchmarks share: timing side by side, the T5-small pair of peers, the report file.

Run a benchmark as `python benchmarks/<name>.py` from the repository root; this directory is then
first on `sys.path`, so `from common import ...` finds this module, and importing it puts the
repository on the path for `import t2t`.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def interleaved_times(runners: dict, repeats: int) -> dict[str, dict[str, list[float]]]:
    """Wall and process CPU seconds of each runner per call, after one warm-up call each,
    alternating runners call by call so a change in machine load hits every side alike."""
    for run in runners.values():
        run()  # Warm-up (and compile).
    times = {name: {"wall_s": [], "cpu_s": []} for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            times[name]["wall_s"].append(time.perf_counter() - start)
            times[name]["cpu_s"].append(time.process_time() - start_cpu)
    return times


def wall_times(runners: dict, repeats: int) -> dict[str, list[float]]:
    """`interleaved_times`, wall seconds only."""
    return {name: t["wall_s"] for name, t in interleaved_times(runners, repeats).items()}


# T5-small (v1.0, docs/spec.md section 1) as HF's `T5Config` fields.
T5_SMALL = dict(
    vocab_size=32128,
    d_model=512,
    d_ff=2048,
    d_kv=64,
    num_heads=8,
    num_layers=6,
    feed_forward_proj="relu",
    tie_word_embeddings=True,
)


def hf_t5_config(**fields):
    """A HF `T5Config` with T5's special ids (padding 0, also the decoder's start; EOS 1) and
    `fields` (e.g. `**T5_SMALL, dropout_rate=0.0`)."""
    from transformers import T5Config

    return T5Config(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **fields)


def hf_t5_adafactor(parameters):
    """The peer's optimizer: T5's Adafactor as HF transformers has it (beta2_t = 1 - t^-0.8, RMS
    clipping at 1, step lr * max(1e-3, RMS(param)) with lr = min(0.01, 1/sqrt(t)), T5's
    inverse-square-root schedule; no momentum, no weight decay)."""
    from transformers.optimization import Adafactor

    return Adafactor(
        parameters,
        lr=None,
        relative_step=True,
        scale_parameter=True,
        warmup_init=False,
        decay_rate=-0.8,
        clip_threshold=1.0,
        beta1=None,
        weight_decay=0.0,
    )


def t5_small_pair(seed: int = 0):
    """HF T5-small (v1.0) with random weights, and the t2t model and params with the same
    weights: (torch model, t2t model wrapper, t2t params)."""
    import jax
    import torch
    from transformers import T5ForConditionalGeneration

    from t2t import models
    from t2t.checkpoints import hf

    torch.manual_seed(seed)
    config = hf_t5_config(**T5_SMALL, dropout_rate=0.0)
    torch_model = T5ForConditionalGeneration(config).eval()
    tensors = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    t2t_config = hf.config_from_hf(config.to_dict())
    params = jax.device_put(hf.params_from_hf(tensors, t2t_config))
    return torch_model, models.EncoderDecoderModel(t2t_config), params


def tiny_training(
    inputs: int, targets: int, batch: int = 32, seed: int = 0, dtype: str = "float32"
):
    """The tiny preset (vocabulary 2,048) as the studies pretrain it, float32 (or the compute
    `dtype` given; the parameters stay float32): its model, the
    optimizer (Adafactor, inverse square root schedule), the training step as `t2t.trainer` runs
    it (`EncoderDecoderModel.loss_fn` -> `t2t.optim.accumulate_gradients` -> Adafactor; not
    jitted) and a batch of random tokens, two examples packed per row of `inputs` and `targets`
    tokens.

    Returns:
      (model, tx, step, batch) with step(params, opt_state, batch, rng) -> (params, opt_state,
      loss) and batch a dict of numpy arrays.
    """
    import numpy as np
    import optax

    from t2t import models, optim
    from t2t.nn import presets

    config = presets.get_preset("tiny", vocab_size=2048, dtype=dtype)
    model = models.EncoderDecoderModel(config, loss_normalizing_factor="num_real_target_tokens")
    tx = optim.adafactor(optim.inverse_sqrt())

    def step(params, opt_state, batch, rng):
        loss, _, grads = optim.accumulate_gradients(model.loss_fn, params, batch, rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(seed)

    def packed(length):  # two examples a row: segment ids and positions
        half = length // 2
        segments = np.repeat(np.array([[1] * half + [2] * half], np.int32), batch, axis=0)
        return segments, np.tile(np.arange(half, dtype=np.int32), (batch, 2))

    (encoder_segments, encoder_positions), (decoder_segments, decoder_positions) = (
        packed(inputs),
        packed(targets),
    )
    target_tokens = rng.integers(2, config.vocab_size, (batch, targets)).astype(np.int32)
    data = {
        "encoder_input_tokens": rng.integers(2, config.vocab_size, (batch, inputs)).astype(
            np.int32
        ),
        "decoder_input_tokens": np.pad(target_tokens[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": target_tokens,
        "decoder_loss_weights": np.ones((batch, targets), np.float32),
        "encoder_segment_ids": encoder_segments,
        "decoder_segment_ids": decoder_segments,
        "encoder_positions": encoder_positions,
        "decoder_positions": decoder_positions,
    }
    return model, tx, step, data


def demo_train_flags(model_dir: str, steps: int) -> list[str]:
    """`t2t train` flags for the built-in demo's pretraining for `steps` steps into `model_dir`:
    one checkpoint at the end, no evaluations and no progress bar (run from the repository)."""
    return [
        "--gin_file=gin/experiments/tiny_builtin_demo.gin",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.TRAIN_STEPS={steps}",
        f"--gin.t2t.runs.CheckpointOptions.every={steps}",
        "--gin.t2t.runs.EvalOptions.every=None",
        "--gin.t2t.runs.EvalOptions.num_predictions=0",
        "--gin.t2t.runs.LoopOptions.progress=False",
    ]


def write_report(report: dict, path: str) -> None:
    """Adds the load average after the runs to `report` and writes it as JSON to `path`."""
    report["load_average_after"] = os.getloadavg()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    out = pathlib.Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
