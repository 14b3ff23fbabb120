"""Decoding speed of t2t against HF transformers `generate`, side by side on the same CPU.

T5-small (the paper's v1.0 layout, random init in HF, imported into t2t with the HF importer so
both decode the same weights) decodes 16 inputs of 128 tokens into exactly 64 output tokens
(EOS suppressed until then), greedily and with beam search of width 4. Both use float32 and the
KV cache; torch runs with 2 threads. Reported: output tokens per second (16 x 64 tokens over the
median wall time of the timed runs) and the t2t / HF ratio; t2t's compile time separately.

    python benchmarks/decoding_bench.py [--repeats 3] [--batch 16] [--input-length 128]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers import T5Config, T5ForConditionalGeneration

from t2t import models
from t2t.checkpoints import hf


def t5_small_pair(seed: int = 0):
    """HF T5-small with random weights, and the t2t model and params with the same weights."""
    torch.manual_seed(seed)
    config = T5Config(  # T5-small, v1.0 (T5_SPEC section 1).
        vocab_size=32128, d_model=512, d_ff=2048, d_kv=64, num_heads=8, num_layers=6,
        feed_forward_proj="relu", tie_word_embeddings=True, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
    )
    torch_model = T5ForConditionalGeneration(config).eval()
    tensors = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    t2t_config = hf.config_from_hf(config.to_dict())
    params = hf.params_from_hf(tensors, t2t_config)
    params = jax.device_put(params)
    return torch_model, models.EncoderDecoderModel(t2t_config), params


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_hf(torch_model, inputs: np.ndarray, new_tokens: int, beams: int, repeats: int):
    ids = torch.tensor(inputs, dtype=torch.long)
    mask = torch.ones_like(ids)

    def run():
        with torch.inference_mode():
            out = torch_model.generate(
                ids, attention_mask=mask, do_sample=False, num_beams=beams, use_cache=True,
                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            )
        assert out.shape == (inputs.shape[0], new_tokens + 1), out.shape
        return out

    run()  # Warm-up.
    return _median_time(run, repeats)


def bench_t2t(model, params, inputs: np.ndarray, new_tokens: int, beams: int, repeats: int):
    method = "greedy" if beams == 1 else "beam"
    predict = jax.jit(functools.partial(
        model.predict_batch, method=method, beam_size=beams, max_decode_length=new_tokens,
        min_length=new_tokens,
    ))
    batch = {"encoder_input_tokens": jnp.asarray(inputs)}

    def run():
        out = predict(params, batch).block_until_ready()
        assert out.shape == (inputs.shape[0], new_tokens) and not np.any(np.asarray(out) == 1)
        return out

    start = time.perf_counter()
    predict.lower(params, batch).compile()
    compile_s = time.perf_counter() - start
    run()  # Warm-up (first execution).
    return _median_time(run, repeats), compile_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--input-length", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch_model, model, params = t5_small_pair()
    rng = np.random.default_rng(0)
    inputs = rng.integers(2, 32000, (args.batch, args.input_length)).astype(np.int32)
    inputs[:, -1] = 1  # EOS-terminated, no padding.
    output_tokens = args.batch * args.new_tokens

    print(f"load average before: {os.getloadavg()[0]:.2f}; jax {jax.__version__}, torch "
          f"{torch.__version__} ({args.threads} threads), devices {jax.devices()}")
    print(f"{args.batch} inputs x {args.input_length} tokens -> {args.new_tokens} tokens each")
    print(f"{'method':<8} {'HF tok/s':>9} {'t2t tok/s':>10} {'ratio':>6} {'t2t compile s':>14}")
    for name, beams in (("greedy", 1), ("beam-4", 4)):
        hf_s = bench_hf(torch_model, inputs, args.new_tokens, beams, args.repeats)
        t2t_s, compile_s = bench_t2t(model, params, inputs, args.new_tokens, beams, args.repeats)
        print(f"{name:<8} {output_tokens / hf_s:>9.1f} {output_tokens / t2t_s:>10.1f} "
              f"{hf_s / t2t_s:>5.2f}x {compile_s:>14.1f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
