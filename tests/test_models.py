"""Model wrappers against independent computations: HF transformers for the encoder-decoder
(T5 v1.0 layout: ReLU, tied logits), teacher-forced cached steps for the decoder-only models."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import T5Config, T5ForConditionalGeneration

from t2t import decoding, models
from t2t import nn as t2t_nn
from t2t.checkpoints import hf

VOCAB = 48


def _hf_t5(seed):
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_heads=4,
        num_layers=2,
        num_decoder_layers=2,
        feed_forward_proj="relu",
        dropout_rate=0.0,
        tie_word_embeddings=True,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # Spread-out weights: HF's init decodes one repeated token.
        for name, param in model.named_parameters():
            if param.ndim == 2 and "relative" not in name:
                param.normal_(
                    0.0, (4.0 if name == "shared.weight" else 1.0) * float(param.shape[-1]) ** -0.5
                )
    return model


@pytest.fixture(scope="module")
def pair():
    """Two HF models and the t2t model with both parameter sets."""
    torch_models = [_hf_t5(seed) for seed in (0, 1)]
    config = hf.config_from_hf(torch_models[0].config.to_dict())
    params = [
        hf.params_from_hf({k: v.numpy() for k, v in m.state_dict().items()}, config)
        for m in torch_models
    ]
    return torch_models, models.EncoderDecoderModel(config), params


def _batch(rng_seed=0, batch_size=4, input_length=9, target_length=7):
    rng = np.random.default_rng(rng_seed)
    inputs = np.zeros((batch_size, input_length), np.int32)
    targets = np.zeros((batch_size, target_length), np.int32)
    for row in range(batch_size):
        n, m = rng.integers(2, input_length + 1), rng.integers(2, target_length + 1)
        inputs[row, :n] = np.append(rng.integers(2, VOCAB, n - 1), 1)
        targets[row, :m] = np.append(rng.integers(2, VOCAB, m - 1), 1)
    return {
        "encoder_input_tokens": inputs,
        "decoder_target_tokens": targets,
        "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_loss_weights": (targets > 0).astype(np.int32),
    }


def _hf_log_probs(torch_model, inputs, targets):
    """[B, T, V] log-probs of HF's teacher-forced forward pass (labels shifted by HF itself)."""
    labels = torch.tensor(np.where(targets > 0, targets, -100), dtype=torch.long)
    with torch.no_grad():
        out = torch_model(
            input_ids=torch.tensor(inputs, dtype=torch.long),
            attention_mask=torch.tensor(inputs > 0),
            labels=labels,
        )
    return torch.log_softmax(out.logits, -1).numpy(), float(out.loss)


def test_score_batch_is_sum_of_hf_token_log_probs(pair):
    torch_models, model, params = pair
    batch = _batch()
    log_probs, _ = _hf_log_probs(
        torch_models[0], batch["encoder_input_tokens"], batch["decoder_target_tokens"]
    )
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
    per_token = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    expected = (per_token * weights).sum(-1)
    got = jax.jit(model.score_batch)(params[0], batch)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_rank_classification_picks_hf_best_label(pair):
    torch_models, model, params = pair
    batch = _batch(rng_seed=1, batch_size=5)
    candidates = np.array([[5, 9, 1], [7, 8, 1], [12, 30, 1], [30, 31, 1]], np.int32)
    best, scores = jax.jit(model.rank_classification)(params[0], batch, candidates)
    expected = np.zeros((5, 4))
    for c, candidate in enumerate(candidates):
        targets = np.repeat(candidate[None], 5, axis=0)
        log_probs, _ = _hf_log_probs(torch_models[0], batch["encoder_input_tokens"], targets)
        per_token = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
        expected[:, c] = (per_token * (targets > 0)).sum(-1)
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(best, expected.argmax(1))


def test_encode_candidates_appends_eos_and_pads():
    class Words:  # Minimal stand-in for a seqio vocabulary's encode().
        def encode(self, text):
            return [len(word) + 10 for word in text.split()]

    out = models.encode_candidates(Words(), ["not entailment", "entailment"])
    np.testing.assert_array_equal(out, [[13, 20, 1], [20, 1, 0]])


def test_loss_fn_matches_hf_loss_and_differentiates(pair):
    torch_models, model, params = pair
    model = models.EncoderDecoderModel(
        model.config, z_loss=0.0, loss_normalizing_factor="num_real_target_tokens"
    )
    batch = _batch(rng_seed=2)
    log_probs, hf_loss = _hf_log_probs(
        torch_models[0], batch["encoder_input_tokens"], batch["decoder_target_tokens"]
    )
    grad_fn = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))
    (loss, metrics), grads = grad_fn(params[0], batch, None)
    assert float(loss) == pytest.approx(hf_loss, rel=1e-4)
    weights = batch["decoder_loss_weights"]
    correct = (log_probs.argmax(-1) == batch["decoder_target_tokens"]) * weights
    assert float(metrics["num_correct_tokens"]) == correct.sum()
    assert float(metrics["weight_sum"]) == weights.sum()
    assert all(np.isfinite(g).all() for g in jax.tree_util.tree_leaves(grads))


def test_loss_fn_dropout_follows_the_rng(pair):
    _, model, params = pair
    noisy = jax.jit(models.EncoderDecoderModel(model.config.replace(dropout_rate=0.5)).loss_fn)
    batch = _batch(rng_seed=2)
    first, second, other = (
        float(noisy(params[0], batch, jax.random.PRNGKey(seed))[0]) for seed in (0, 0, 1)
    )
    assert first == second and first != other


def _hf_ensemble_greedy(torch_models, inputs, length):
    """Greedy decoding with the mean of the models' logits, recomputing the prefix each step."""
    decoder = np.zeros((inputs.shape[0], 1), np.int64)
    done = np.zeros(inputs.shape[0], bool)
    with torch.no_grad():
        for _ in range(length):
            logits = np.mean(
                [
                    m(
                        input_ids=torch.tensor(inputs, dtype=torch.long),
                        attention_mask=torch.tensor(inputs > 0),
                        decoder_input_ids=torch.tensor(decoder),
                    )
                    .logits[:, -1]
                    .numpy()
                    for m in torch_models
                ],
                axis=0,
            )
            token = np.where(done, 0, logits.argmax(-1))
            done |= token == 1
            decoder = np.concatenate([decoder, token[:, None]], axis=1)
    return decoder[:, 1:]


def test_ensemble_greedy_matches_averaged_hf_logits(pair):
    torch_models, model, params = pair
    inputs = _batch(rng_seed=3)["encoder_input_tokens"]
    expected = _hf_ensemble_greedy(torch_models, inputs, 8)

    predict = jax.jit(functools.partial(model.predict_batch, max_decode_length=8))
    greedy = predict(tuple(params), {"encoder_input_tokens": inputs})
    np.testing.assert_array_equal(greedy, expected)
    single = _hf_ensemble_greedy(torch_models[:1], inputs, 8)
    assert not np.array_equal(expected, single)  # The ensemble changed the output.


def test_kernel_first_steps_decide_per_decode_and_keep_the_tokens(pair):
    """By default decoding steps multiply kernel first on the CPU for KERNEL_FIRST_ROWS rows
    (batch x beams); forced on or off (`DecodingConfig.kernel_first_steps`), greedy and beam
    search give the same tokens."""
    _, model, params = pair
    low, high = decoding.KERNEL_FIRST_ROWS
    default = decoding.DecodingConfig()
    assert default.uses_kernel_first_steps(low, "cpu")
    assert default.uses_kernel_first_steps(high, "cpu")
    assert not default.uses_kernel_first_steps(low - 1, "cpu")
    assert not default.uses_kernel_first_steps(high + 1, "cpu")
    assert not default.uses_kernel_first_steps(low, "gpu")  # the caller's platform decides
    assert not default.uses_kernel_first_steps(low, "tpu")
    assert decoding.DecodingConfig(kernel_first_steps=True).uses_kernel_first_steps(1024, "tpu")
    assert not decoding.DecodingConfig(kernel_first_steps=False).uses_kernel_first_steps(4, "cpu")
    with pytest.raises(ValueError, match="kernel_first_steps"):
        decoding.DecodingConfig(kernel_first_steps="yes")
    batch = {"encoder_input_tokens": _batch(rng_seed=5)["encoder_input_tokens"]}
    for method in ("greedy", "beam"):
        tokens = {
            flag: jax.jit(
                functools.partial(
                    model.predict_batch,
                    method=method,
                    beam_size=3,
                    max_decode_length=8,
                    kernel_first_steps=flag,
                )
            )(params[0], batch)
            for flag in (True, False)
        }
        np.testing.assert_array_equal(tokens[True], tokens[False])
        assert np.any(np.asarray(tokens[True]) > 1)  # real tokens, not an empty decode


# -- decoder-only -------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=1)
def _redraw(params, seed):
    """Fan-in scaled normal kernels (random init decodes a single repeated token)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    leaves = [
        2.0 * jax.random.normal(key, x.shape) * x.shape[0] ** -0.5 if x.ndim == 2 else x
        for key, x in zip(keys, leaves)
    ]
    return jax.tree_util.tree_unflatten(treedef, leaves)


@pytest.fixture(scope="module", params=["decoder_only", "prefix_lm"])
def decoder_only(request):
    config = t2t_nn.get_preset(
        "tiny",
        architecture=request.param,
        num_encoder_layers=0,
        vocab_size=VOCAB,
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_heads=4,
        num_decoder_layers=2,
    )
    model = models.DecoderOnlyModel(config)
    return model, _redraw(model.init_params(jax.random.PRNGKey(0)), seed=request.param_index)


def _prefix_lm_rows(prompts, candidate):
    """seqio PrefixLM features for prompt + candidate rows, built with numpy."""
    width = max(len(p) for p in prompts) + max(len(candidate), 1)  # x_P needs position P.
    targets = np.zeros((len(prompts), width), np.int32)
    weights, causal = np.zeros_like(targets), np.zeros_like(targets)
    for row, prompt in enumerate(prompts):
        sequence = list(prompt) + [t for t in candidate if t]
        targets[row, : len(sequence)] = sequence
        weights[row, len(prompt) : len(sequence)] = 1
        causal[row, : len(prompt) + 1] = 1
    return {
        "decoder_target_tokens": targets,
        "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_loss_weights": weights,
        "decoder_causal_attention": causal,
    }


def test_decoder_only_score_batch_equals_teacher_forced_cached_steps(decoder_only):
    model, params = decoder_only
    rows = _prefix_lm_rows([[5, 6, 7, 1], [9, 1]], [11, 12, 13, 1])
    got = jax.jit(model.score_batch)(params, rows)

    # Independent: prefill each row's prompt, then feed the candidate one cached step at a time.
    @jax.jit
    def teacher_forced(params, inputs, causal, prompt_length):
        module = model.module(params)
        cache = module.init_cache(
            inputs,
            16,
            prompt_lengths=prompt_length[None],
            decoder_causal_attention=causal if model.is_prefix_lm else None,
        )
        total, token = 0.0, inputs[:, prompt_length]
        for target in [11, 12, 13, 1]:
            logits, cache = module.decode_step(token[:, None], cache)
            total += jax.nn.log_softmax(logits)[0, target]
            token = jnp.array([target])
        return total

    for row, prompt_length in enumerate([4, 2]):
        total = teacher_forced(
            params,
            rows["decoder_input_tokens"][row : row + 1],
            rows["decoder_causal_attention"][row : row + 1],
            jnp.int32(prompt_length),
        )
        assert float(got[row]) == pytest.approx(float(total), rel=1e-4, abs=1e-4)


def test_decoder_only_rank_classification_matches_scored_rows(decoder_only):
    model, params = decoder_only
    prompts = [[5, 6, 7, 1], [9, 1], [20, 21, 22, 23, 24, 1]]
    candidates = np.array([[11, 12, 1], [13, 1, 0], [40, 41, 1]], np.int32)
    # Prompt features as seqio gives them at inference: [0, x_1..x_P] with P + 1 visible.
    prompt_batch = _prefix_lm_rows(prompts, [])
    best, scores = jax.jit(model.rank_classification)(params, prompt_batch, candidates)
    score = jax.jit(model.score_batch)
    expected = np.stack(
        [np.asarray(score(params, _prefix_lm_rows(prompts, list(c)))) for c in candidates], axis=1
    )
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(best, expected.argmax(1))


def test_abstract_and_initialized_params_agree(decoder_only):
    model, params = decoder_only
    abstract = model.abstract_params()
    shapes = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), abstract)
    assert shapes == jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), params)
    assert isinstance(params, nnx.State)


def test_clear_errors(pair, decoder_only):
    _, model, params = pair
    with pytest.raises(ValueError, match="EncoderDecoderModel"):
        models.EncoderDecoderModel(decoder_only[0].config)
    with pytest.raises(ValueError, match="missing \\['encoder_input_tokens'\\]"):
        model.predict_batch(params[0], {"inputs": np.zeros((1, 3), np.int32)}, max_decode_length=2)
    with pytest.raises(ValueError, match="method"):
        model.predict_batch(
            params[0],
            {"encoder_input_tokens": np.ones((1, 3), np.int32)},
            method="nucleus",
            max_decode_length=2,
        )


def _uncached_step(model, params, width):
    """tokens_to_logits that reruns the whole sequence each step (cache: token buffer, index)."""

    def tokens_to_logits(tokens, cache):
        rows = jnp.arange(tokens.shape[0])
        buffer = cache["tokens"].at[rows, cache["index"]].set(tokens[:, 0])
        causal = None
        if model.is_prefix_lm:
            visible = jnp.arange(width)[None] <= cache["prompt_lengths"][:, None]
            causal = visible.astype(jnp.int32)
        logits = model.module(params)(buffer, decoder_causal_attention=causal)
        return logits[rows, cache["index"]], {
            **cache,
            "tokens": buffer,
            "index": cache["index"] + 1,
        }

    return tokens_to_logits


# first_cache_length 2: decoding in phases of a growing cache, after the prefilled prompt.
@pytest.mark.parametrize("first_cache_length", [64, 2])
def test_decoder_only_prefilled_cache_equals_uncached_decoding(decoder_only, first_cache_length):
    model, params = decoder_only
    prompts = [[5, 6, 1], [9, 10, 11, 12, 13, 14, 1], [2], [20, 21, 22, 23, 1]]
    batch = _prefix_lm_rows(prompts, [])
    lengths = jnp.array([len(p) for p in prompts])
    length = 10
    width = batch["decoder_input_tokens"].shape[1] + length

    @jax.jit
    def both(params):
        cached = model.predict_batch(
            params, batch, max_decode_length=length, first_cache_length=first_cache_length
        )
        buffer = jnp.pad(batch["decoder_input_tokens"], ((0, 0), (0, length)))
        cache = {"tokens": buffer, "index": lengths, "prompt_lengths": lengths}
        start = jnp.take_along_axis(buffer, lengths[:, None], axis=1)[:, 0]
        uncached = decoding.greedy(
            _uncached_step(model, params, width),
            cache,
            max_decode_length=length,
            start_tokens=start,
        )
        return cached, uncached

    cached, uncached = both(params)
    np.testing.assert_array_equal(cached, uncached)
    assert len(np.unique(np.asarray(cached))) > 5  # Not one repeated token.


def test_candidate_rows_worked_example():
    # The example in t2t.models.candidate_rows's docstring.
    rows = models.candidate_rows(
        jnp.array([[0, 5, 6, 0]]), jnp.array([2]), np.array([[7, 1, 0], [8, 9, 1]], np.int32)
    )
    expected = {
        "decoder_target_tokens": [[5, 6, 7, 1, 0, 0, 0], [5, 6, 8, 9, 1, 0, 0]],
        "decoder_input_tokens": [[0, 5, 6, 7, 1, 0, 0], [0, 5, 6, 8, 9, 1, 0]],
        "decoder_loss_weights": [[0, 0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0]],
        "decoder_causal_attention": [[1, 1, 1, 0, 0, 0, 0]] * 2,
    }
    assert sorted(rows) == sorted(expected)
    for name, want in expected.items():
        np.testing.assert_array_equal(np.asarray(rows[name]).astype(np.int32), want, err_msg=name)


def test_a_model_missing_a_method_fails_at_construction_naming_it(pair):
    class Unfinished(models.BaseModel):  # no rank_classification
        _logits = models.EncoderDecoderModel._logits
        decoding_setup = models.EncoderDecoderModel.decoding_setup
        _default_length = models.EncoderDecoderModel._default_length
        _batch_size = models.EncoderDecoderModel._batch_size

    with pytest.raises(TypeError, match="rank_classification"):
        Unfinished(pair[1].config)


def test_an_unknown_decoding_option_names_the_fields(pair):
    _, model, params = pair
    batch = {"encoder_input_tokens": jnp.ones((1, 4), jnp.int32)}
    with pytest.raises(ValueError, match="'beamsize': did you mean 'beam_size'"):
        model.predict_batch(params[0], batch, beamsize=2)
