"""HF transformers interop: logits parity with PyTorch T5, export that HF loads, clear errors.

HF models are random-initialized from a `T5Config` (no downloads) and saved with
`save_pretrained`; the t2t importer reads that directory.
"""

import json
import os

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file
from transformers import T5Config, T5ForConditionalGeneration

import t2t.nn as tn
from t2t.checkpoints import hf

VOCAB = 160
TOLERANCE = 1e-4


def hf_model(feed_forward_proj, tied, **overrides):
    """A random HF T5 with heads * d_kv != d_model and a decoder shallower than the encoder."""
    torch.manual_seed(0)
    fields = dict(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=12,
        num_heads=4,
        d_ff=48,
        num_layers=3,
        num_decoder_layers=2,
        feed_forward_proj=feed_forward_proj,
        tie_word_embeddings=tied,
        decoder_start_token_id=0,
    )
    fields.update(overrides)
    model = T5ForConditionalGeneration(T5Config(**fields)).eval()
    if not tied:
        # NOTE: transformers 5 keeps lm_head sharing storage with the embedding even for
        # tie_word_embeddings=False; give it its own weights, as real v1.1 checkpoints have.
        model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 32) * 32**-0.5)
    return model


def random_state(config):
    """Parameters for `config` drawn with numpy (faster than compiling the jax initializers)."""
    state = hf.abstract_state(config)
    rng = np.random.RandomState(3)

    def fill(leaf):
        std = 1.0 if leaf.ndim == 1 or leaf.shape[0] == VOCAB else leaf.shape[0] ** -0.5
        return (std * rng.randn(*leaf.shape)).astype(np.float32)

    nnx.replace_by_pure_dict(state, jax.tree.map(fill, state.to_pure_dict()))
    return state


def hf_logits(model, inputs, decoder_inputs):
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(inputs),
            attention_mask=torch.tensor((inputs > 0).astype(np.int64)),
            decoder_input_ids=torch.tensor(decoder_inputs),
        ).logits.numpy()


def t2t_logits(model, inputs, decoder_inputs):
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, x, y: nnx.merge(graphdef, state)(x, y))
    return np.asarray(forward(state, inputs, decoder_inputs))


@pytest.fixture(scope="module")
def batch():
    """Padded inputs longer than 128 (every bucket in use) and padded decoder inputs."""
    rng = np.random.RandomState(0)
    inputs = rng.randint(2, VOCAB, (3, 150))
    inputs[1, 90:] = 0
    inputs[2, 7:] = 0
    decoder_inputs = rng.randint(2, VOCAB, (3, 130))
    decoder_inputs[:, 0] = 0
    decoder_inputs[2, 20:] = 0
    return inputs, decoder_inputs


@pytest.fixture(
    scope="module",
    params=[("relu", True), ("gated-gelu", False)],
    ids=["v1_0_relu_tied", "v1_1_gated_gelu_untied"],
)
def saved_hf(request, tmp_path_factory):
    model = hf_model(*request.param)
    directory = str(tmp_path_factory.mktemp("hf"))
    model.save_pretrained(directory)
    return model, directory


def test_imported_logits_match_hf(saved_hf, batch):
    model, directory = saved_hf
    ours = hf.load_hf_model(directory)
    assert ours.config.d_model != ours.config.inner_dim
    assert ours.config.num_encoder_layers == 3 and ours.config.num_decoder_layers == 2
    error = np.abs(t2t_logits(ours, *batch) - hf_logits(model, *batch)).max()
    assert error <= TOLERANCE


def test_untied_config_saved_without_lm_head(batch, tmp_path):
    # transformers 5 keeps lm_head on the embedding's storage and saves no lm_head.weight, yet
    # does not rescale the decoder output: a logits_dense equal to the embedding's transpose.
    torch.manual_seed(1)
    model = T5ForConditionalGeneration(
        T5Config(
            vocab_size=VOCAB,
            d_model=32,
            d_kv=8,
            num_heads=4,
            d_ff=48,
            num_layers=2,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
            decoder_start_token_id=0,
        )
    ).eval()
    model.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(os.path.join(tmp_path, "model.safetensors"))
    ours = hf.load_hf_model(tmp_path)
    assert not ours.config.logits_via_embedding
    inputs, decoder_inputs = batch[0][:, :40], batch[1][:, :20]
    error = np.abs(
        t2t_logits(ours, inputs, decoder_inputs) - hf_logits(model, inputs, decoder_inputs)
    ).max()
    assert error <= TOLERANCE


def test_imported_config(saved_hf):
    model, directory = saved_hf
    config, _ = hf.import_hf(directory, dropout_rate=0.0)
    tied = model.config.feed_forward_proj == "relu"
    assert config.logits_via_embedding == tied
    assert config.mlp_activations == (("relu",) if tied else ("gelu", "linear"))
    assert (config.d_kv, config.num_heads, config.vocab_size) == (12, 4, VOCAB)
    assert config.dropout_rate == 0.0


@pytest.mark.parametrize(
    "tied, activations",
    [(True, ("relu",)), (False, ("gelu", "linear")), (False, ("silu", "linear"))],
    ids=["tied_relu", "untied_gated_gelu", "untied_gated_silu"],
)
def test_export_loads_in_hf_with_the_same_logits(tied, activations, batch, tmp_path):
    config = tn.get_preset(
        "tiny",
        vocab_size=VOCAB,
        d_model=32,
        d_kv=12,
        d_ff=48,
        num_decoder_layers=3,
        logits_via_embedding=tied,
        mlp_activations=activations,
    )
    state = random_state(config)
    ours = nnx.merge(nnx.split(nnx.eval_shape(lambda: tn.build(config, nnx.Rngs(0))))[0], state)
    hf.export_hf(tmp_path, config, state)
    theirs = T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    error = np.abs(hf_logits(theirs, *batch) - t2t_logits(ours, *batch)).max()
    assert error <= TOLERANCE
    # And back: the re-imported parameters are bit-identical.
    config_again, state_again = hf.import_hf(tmp_path, dropout_rate=config.dropout_rate)
    assert config_again == config
    jax.tree.map(
        np.testing.assert_array_equal,
        state_again.to_pure_dict(),
        jax.tree.map(np.asarray, state.to_pure_dict()),
    )


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_lora_is_merged_on_export_and_hf_gives_the_lora_logits(scan, batch, tmp_path):
    """Every LoRA target, trained-looking (B != 0): the merged release computes the same."""
    config = tn.get_preset(
        "tiny",
        vocab_size=VOCAB,
        d_model=32,
        d_kv=12,
        d_ff=48,
        num_decoder_layers=3,
        logits_via_embedding=False,
        lora_rank=4,
        lora_alpha=8.0,
        scan_layers=scan,
        lora_targets=("query", "key", "value", "out", "wi_0", "wi_1", "wo", "logits_dense"),
    )
    state = random_state(config.replace(scan_layers=False))
    # LoRA updates of a trained model's size: B small and non-zero ((x W + s (x A) B) and
    # x (W + s A B) round differently in float32, and T5's unscaled attention logits amplify it).
    nnx.replace_by_pure_dict(
        state,
        jax.tree_util.tree_map_with_path(
            lambda path, x: 0.05 * x if "lora_b" in jax.tree_util.keystr(path) else x,
            state.to_pure_dict(),
        ),
    )
    state = tn.to_layout(state, config)  # the same weights, stacked when scanned
    ours = nnx.merge(nnx.split(nnx.eval_shape(lambda: tn.build(config, nnx.Rngs(0))))[0], state)
    hf.export_hf(tmp_path, config, state)
    theirs = T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert not any("lora" in name for name in theirs.state_dict())
    error = np.abs(hf_logits(theirs, *batch) - t2t_logits(ours, *batch)).max()
    assert error <= TOLERANCE
    with pytest.raises(ValueError, match="adapter layers or soft prompts.*adapter_size"):
        hf.export_hf(
            tmp_path / "adapters",
            config.replace(adapter_size=4, lora_rank=0),
            random_state(config.replace(adapter_size=4, lora_rank=0)),
        )


def test_scanned_model_exports_and_imports_with_hf_parity(saved_hf, batch, tmp_path):
    """A model with scanned layers ([L, ...] stacks) reads and writes HF's per-layer tensors."""
    model, directory = saved_hf
    config, state = hf.import_hf(directory, scan_layers=True)
    assert state["encoder"]["layers"]["attention"]["query"]["kernel"].shape == (3, 32, 48)
    ours = nnx.merge(nnx.split(nnx.eval_shape(lambda: tn.build(config, nnx.Rngs(0))))[0], state)
    error = np.abs(t2t_logits(ours, *batch) - hf_logits(model, *batch)).max()
    assert error <= TOLERANCE
    hf.export_hf(tmp_path, config, state)
    theirs = T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert np.abs(hf_logits(theirs, *batch) - hf_logits(model, *batch)).max() <= TOLERANCE
    exported = load_file(os.path.join(tmp_path, "model.safetensors"))
    original = load_file(os.path.join(directory, "model.safetensors"))
    for key, value in exported.items():  # the same tensors, bit for bit
        np.testing.assert_array_equal(value, original[key], err_msg=key)


def test_rename_table_covers_every_parameter_once():
    for tied in (True, False):
        config = tn.get_preset("tiny", logits_via_embedding=tied, num_decoder_layers=3)
        table = hf.rename_table(config)
        paths = {"/".join(p) for p, _ in hf.abstract_state(config).flat_state()}
        assert {"/".join(row.path) for row in table} == paths
        assert len({row.hf_key for row in table}) == len(table)


def _tensors_and_config(directory):
    with open(os.path.join(directory, "config.json")) as f:
        return load_file(os.path.join(directory, "model.safetensors")), json.load(f)


def _write(directory, tensors, config):
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)


def test_missing_and_unknown_keys_are_listed(saved_hf, tmp_path):
    tensors, config = _tensors_and_config(saved_hf[1])
    del tensors["decoder.block.1.layer.2.layer_norm.weight"]
    tensors["encoder.block.7.layer.0.SelfAttention.q.weight"] = np.zeros((48, 32), np.float32)
    _write(tmp_path, tensors, config)
    with pytest.raises(
        ValueError,
        match=r"missing \['decoder.block.1.layer.2.layer_norm.weight'\]"
        r".*unknown \['encoder.block.7",
    ):
        hf.import_hf(tmp_path)


def test_shape_mismatch_names_the_tensor(saved_hf, tmp_path):
    tensors, config = _tensors_and_config(saved_hf[1])
    config["d_ff"] = 40
    _write(tmp_path, tensors, config)
    with pytest.raises(
        ValueError,
        match=r"DenseReluDense.*: expected shape \(40, 32\) .*got "
        r"\(48, 32\)",
    ):
        hf.import_hf(tmp_path)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("feed_forward_proj", "gelu", "feed_forward_proj='gelu' is not supported"),
        ("model_type", "bart", "model_type='bart' is not supported"),
    ],
)
def test_unsupported_config_says_which_field(saved_hf, tmp_path, field, value, message):
    tensors, config = _tensors_and_config(saved_hf[1])
    config[field] = value
    _write(tmp_path, tensors, config)
    with pytest.raises(ValueError, match=message):
        hf.import_hf(tmp_path)


def test_tied_config_with_a_different_lm_head_is_refused(tmp_path):
    model = hf_model("relu", True)
    tensors = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1.0
    _write(tmp_path, tensors, json.loads(model.config.to_json_string()))
    with pytest.raises(ValueError, match="lm_head.weight differs from shared.weight"):
        hf.import_hf(tmp_path)


def test_missing_files_and_unexportable_architectures(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.import_hf(tmp_path)
    shared = tn.get_preset("tiny", architecture="encoder_decoder_shared")
    with pytest.raises(ValueError, match="architecture 'encoder_decoder_shared' cannot be"):
        hf.export_hf(tmp_path, shared, {})
