"""A small random HF T5 (the parity oracle) and the same weights in t2t, shared by the decoding
tests.

HF's own random init makes T5 decode one repeated token; the weights are redrawn with fan-in
scaled normals (and the EOS row of `lm_head` doubled) so greedy outputs vary and rows end at
different steps.
"""

import numpy as np
import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from t2t import models
from t2t.checkpoints import hf

VOCAB = 64


def make_hf_t5(seed: int = 1) -> T5ForConditionalGeneration:
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_heads=4,
        num_layers=2,
        num_decoder_layers=2,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        tie_word_embeddings=False,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    model = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2 and "relative" not in name:
                scale = 3.0 if "lm_head" in name else 1.0
                param.normal_(0.0, scale * float(param.shape[-1]) ** -0.5)
        model.lm_head.weight[1] *= 2.0
    return model


def _padded_inputs(batch_size: int, length: int, seed: int = 0) -> np.ndarray:
    """[B, L] EOS-terminated random inputs of different lengths, zero-padded."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch_size, length), np.int32)
    for row in range(batch_size):
        n = int(rng.integers(3, length + 1))
        ids[row, : n - 1] = rng.integers(2, VOCAB, n - 1)
        ids[row, n - 1] = 1
    return ids


@pytest.fixture(scope="session")
def hf_t5():
    """(torch model, t2t EncoderDecoderModel, t2t params) with the same weights."""
    torch_model = make_hf_t5()
    tensors = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    config = hf.config_from_hf(torch_model.config.to_dict())
    params = hf.params_from_hf(tensors, config)
    return torch_model, models.EncoderDecoderModel(config), params


@pytest.fixture(scope="session")
def padded_inputs():
    """The function (batch_size, length, seed=0) -> [B, L] padded inputs of different lengths."""
    return _padded_inputs
