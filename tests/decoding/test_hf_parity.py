"""Greedy and beam decoding against HF transformers `generate` on the same weights."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

BATCH, INPUT_LENGTH, DECODE_LENGTH = 8, 12, 16


def _until_eos(row):
    """Tokens up to and including the first EOS (HF pads finished beams with EOS, t2t with 0)."""
    row = list(np.asarray(row))
    return row[: row.index(1) + 1] if 1 in row else row


@pytest.fixture(scope="module")
def inputs(padded_inputs):
    return padded_inputs(BATCH, INPUT_LENGTH)


def _hf_generate(torch_model, ids, **kwargs):
    with torch.no_grad():
        return torch_model.generate(
            torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(ids != 0),
            do_sample=False,
            max_new_tokens=DECODE_LENGTH,
            **kwargs,
        )


def test_greedy_matches_hf_generate_token_for_token(hf_t5, inputs):
    torch_model, model, params = hf_t5
    expected = _hf_generate(torch_model, inputs, num_beams=1).numpy()[:, 1:]  # drop start token
    predict = jax.jit(
        functools.partial(model.predict_batch, method="greedy", max_decode_length=DECODE_LENGTH)
    )
    got = np.asarray(predict(params, {"encoder_input_tokens": jnp.asarray(inputs)}))
    np.testing.assert_array_equal(got, expected)
    # The case is meaningful: rows end at different steps and some never end.
    ends = {int(np.argmax(row == 1)) for row in got if (row == 1).any()}
    assert len(ends) >= 2 and not all((row == 1).any() for row in got)


def test_beam4_matches_hf_with_no_length_penalty(hf_t5, inputs):
    # NOTE: HF divides by length**length_penalty, T5 by ((5 + length) / 6)**alpha; the two agree
    # only at 0 (ranking by log-probability), so the comparison uses alpha = length_penalty = 0.
    torch_model, model, params = hf_t5
    out = _hf_generate(
        torch_model,
        inputs,
        num_beams=4,
        num_return_sequences=4,
        length_penalty=0.0,
        early_stopping=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    hf_beams = out.sequences.numpy()[:, 1:].reshape(BATCH, 4, -1)
    hf_scores = out.sequences_scores.numpy().reshape(BATCH, 4)
    predict = jax.jit(
        functools.partial(
            model.predict_batch_with_aux,
            method="beam",
            beam_size=4,
            alpha=0.0,
            beam_rule="hf",
            max_decode_length=DECODE_LENGTH,
        )
    )
    _, aux = predict(params, {"encoder_input_tokens": jnp.asarray(inputs)})
    beams, scores = np.asarray(aux["beams"]), np.asarray(aux["beam_scores"])
    for row in range(BATCH):
        for k in range(4):
            assert _until_eos(beams[row, k]) == _until_eos(hf_beams[row, k]), (row, k)
    np.testing.assert_allclose(scores, hf_scores, rtol=1e-4, atol=1e-4)
    assert any(1 in _until_eos(beams[row, 0]) for row in range(BATCH))  # some beams end early
