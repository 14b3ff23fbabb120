"""Model invariants: cached decoding equals teacher forcing, packing equals no packing, every
parameter has logical axes, masks hide padding, dropout only when asked for."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import t2t.nn as tn
from t2t import decoding, losses
from t2t.nn import axes

VOCAB = 300


def config(architecture="encoder_decoder", **overrides):
    if architecture in ("decoder_only", "prefix_lm"):
        overrides.setdefault("num_encoder_layers", 0)
    # dropout_rate > 0 so the tests also check that rngs=None is deterministic.
    return tn.get_preset(
        "tiny",
        vocab_size=VOCAB,
        d_model=64,
        d_ff=128,
        d_kv=16,
        architecture=architecture,
        dropout_rate=0.1,
        **overrides,
    )


class Jitted:
    """Pure jitted calls of a model's methods, compiled once per method and shape.

    `Jitted(model).decode_step(tokens, cache)` runs `model.decode_step` under `jax.jit` with the
    state passed in; static keyword arguments (`max_decode_length`) are bound by `bind`.
    """

    def __init__(self, model):
        self.model = model
        self.config = model.config
        self._graphdef, self._state = nnx.split(model)
        self._cache = {}

    def bind(self, method, **static):
        key = (method, tuple(sorted(static.items())))
        if key not in self._cache:
            graphdef = self._graphdef

            @jax.jit
            def call(state, *args, **kwargs):
                return getattr(nnx.merge(graphdef, state), method)(*args, **kwargs, **static)

            self._cache[key] = functools.partial(call, self._state)
        return self._cache[key]

    def __getattr__(self, method):
        return self.bind(method)


def random_tokens(seed, shape, lengths=None):
    tokens = np.random.RandomState(seed).randint(2, VOCAB, shape)
    if lengths is not None:
        tokens[np.arange(shape[1])[None, :] >= np.asarray(lengths)[:, None]] = 0
    return jnp.asarray(tokens, jnp.int32)


@pytest.fixture(scope="module", params=["encoder_decoder", "encoder_decoder_shared"])
def encdec(request, make_model):
    return Jitted(make_model(config(request.param)))


@pytest.fixture(scope="module", params=["decoder_only", "prefix_lm"])
def lm(request, make_model):
    return Jitted(make_model(config(request.param), seed=1))


def test_cached_decoding_equals_teacher_forcing_encoder_decoder(encdec):
    inputs = random_tokens(0, (3, 11), lengths=[11, 6, 3])
    decoder_inputs = random_tokens(1, (3, 8)).at[:, 0].set(0)
    full = encdec.__call__(inputs, decoder_inputs)
    encoded = encdec.encode(inputs)
    cache = encdec.bind("init_cache", max_decode_length=8)(encoded, inputs)
    assert all(leaf.shape[0] == 3 for leaf in jax.tree.leaves(cache))  # cache contract
    step = encdec.decode_step
    for t in range(8):
        logits, cache = step(decoder_inputs[:, t : t + 1], cache)
        np.testing.assert_allclose(logits, full[:, t], atol=2e-5)
    np.testing.assert_array_equal(cache["index"], [8, 8, 8])


def test_cached_decoding_in_a_growing_cache_equals_teacher_forcing(encdec):
    """The self-attention caches resized 2 -> 4 -> 8 positions between steps (as decoding in
    phases does) give the teacher-forced logits; the index and shared entries are untouched."""
    inputs = random_tokens(0, (3, 11), lengths=[11, 6, 3])
    decoder_inputs = random_tokens(1, (3, 8)).at[:, 0].set(0)
    full = encdec.__call__(inputs, decoder_inputs)
    cache = encdec.bind("init_cache", max_decode_length=8)(encdec.encode(inputs), inputs)
    resize = jax.jit(tn.resize_cache, static_argnums=1)
    small = resize(cache, 2)
    shape = (3, encdec.config.num_heads, 2, encdec.config.d_kv)
    assert small["layers_0"]["self_key"].shape == small["layers_1"]["self_value"].shape == shape
    for unchanged in (lambda c: c[decoding.SHARED], lambda c: c["index"]):
        jax.tree.map(np.testing.assert_array_equal, unchanged(small), unchanged(cache))
    cache = small
    for t in range(8):
        if t in (2, 4):
            cache = resize(cache, 2 * t)
        logits, cache = encdec.decode_step(decoder_inputs[:, t : t + 1], cache)
        np.testing.assert_allclose(logits, full[:, t], atol=2e-5)
    assert cache["layers_0"]["self_key"].shape[2] == 8
    with pytest.raises(ValueError, match="cache length >= 1"):
        tn.resize_cache(cache, 0)


def _steps(model, prepare: bool, length: int):
    """A jitted function decoding `length` teacher-forced steps after `init_cache`, with the
    step kernels kernel first (`prepare_for_steps`) or not: -> logits [B, length, V]."""
    graphdef, state = model._graphdef, model._state

    def run(state, inputs, decoder_inputs):
        module = nnx.merge(graphdef, state)
        cache = module.init_cache(module.encode(inputs), inputs, max_decode_length=length)
        if prepare:
            module.prepare_for_steps()
            layer = module.decoder.layers_0
            assert layer.encoder_decoder_attention.query.step_kernel is not None
            assert layer.encoder_decoder_attention.key.step_kernel is None  # used before steps
        logits = []
        for t in range(length):
            step_logits, cache = module.decode_step(decoder_inputs[:, t : t + 1], cache)
            logits.append(step_logits)
        return jnp.stack(logits, axis=1)

    return functools.partial(jax.jit(run), state)


def test_kernel_first_steps_equal_teacher_forcing_encoder_decoder(encdec):
    """Steps with kernel-first products (shared layers borrowed from the encoder included) give
    the teacher-forced logits, as the usual steps do."""
    inputs = random_tokens(0, (3, 11), lengths=[11, 6, 3])
    decoder_inputs = random_tokens(1, (3, 6)).at[:, 0].set(0)
    full = encdec.__call__(inputs, decoder_inputs)
    for prepare in (True, False):
        np.testing.assert_allclose(
            _steps(encdec, prepare, 6)(inputs, decoder_inputs), full, atol=2e-5
        )


def test_beam_rows_read_one_shared_copy_of_the_cross_attention_cache(encdec):
    """K beams per input over the `shared` cross-attention entries (B rows) give the logits of
    a cache whose every leaf, shared entries included, is repeated for every beam."""
    inputs = random_tokens(0, (3, 11), lengths=[11, 6, 3])
    cache = encdec.bind("init_cache", max_decode_length=4)(encdec.encode(inputs), inputs)
    beams = decoding.expand_cache(cache, 2)
    assert beams[decoding.SHARED]["layers_0"]["cross_key"].shape[0] == 3
    repeated = jax.tree.map(lambda leaf: jnp.repeat(leaf, 2, axis=0), cache)
    tokens = random_tokens(5, (6, 4))
    for t in range(4):
        got, beams = encdec.decode_step(tokens[:, t : t + 1], beams)
        want, repeated = encdec.decode_step(tokens[:, t : t + 1], repeated)
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_cached_decoding_after_a_prompt_equals_teacher_forcing_decoder_only(lm):
    length, prompt_length = 12, 7
    prompt_lengths = jnp.array([7, 4, 1])
    sequence = random_tokens(2, (3, length)).at[:, 0].set(0)
    causal_attention = None
    if lm.config.architecture == "prefix_lm":
        causal_attention = (jnp.arange(length)[None] < prompt_lengths[:, None]).astype(jnp.int32)
    full = lm.__call__(sequence, None, None, causal_attention)
    prompt = jnp.where(
        jnp.arange(prompt_length)[None] < prompt_lengths[:, None], sequence[:, :prompt_length], 0
    )
    prompt_attention = None if causal_attention is None else causal_attention[:, :prompt_length]
    init = lm.bind("init_cache", max_decode_length=length)
    cache = init(prompt, prompt_lengths=prompt_lengths, decoder_causal_attention=prompt_attention)
    assert all(leaf.shape[0] == 3 for leaf in jax.tree.leaves(cache))
    step = lm.decode_step
    index = prompt_lengths
    rows = jnp.arange(3)
    for _ in range(length - prompt_length):
        logits, cache = step(sequence[rows, index][:, None], cache)
        np.testing.assert_allclose(logits, full[rows, index], atol=2e-5)
        index = index + 1


def test_kernel_first_steps_after_a_prompt_equal_teacher_forcing_decoder_only(lm):
    length, prompt_length = 10, 6
    sequence = random_tokens(4, (2, length)).at[:, 0].set(0)
    causal_attention = None
    if lm.config.architecture == "prefix_lm":
        causal_attention = (jnp.arange(length)[None] < prompt_length).astype(jnp.int32)
        causal_attention = jnp.broadcast_to(causal_attention, (2, length))
    full = lm.__call__(sequence, None, None, causal_attention)
    graphdef, state = lm._graphdef, lm._state

    @jax.jit
    def run(state):
        module = nnx.merge(graphdef, state)
        cache = module.init_cache(
            sequence[:, :prompt_length],
            length,
            decoder_causal_attention=None
            if causal_attention is None
            else causal_attention[:, :prompt_length],
        )
        module.prepare_for_steps()
        logits = []
        for t in range(prompt_length, length):
            step_logits, cache = module.decode_step(sequence[:, t : t + 1], cache)
            logits.append(step_logits)
        return jnp.stack(logits, axis=1)

    np.testing.assert_allclose(run(state), full[:, prompt_length:], atol=2e-5)


def test_empty_prompt_decodes_from_index_zero(lm):
    sequence = random_tokens(3, (3, 12)).at[:, 0].set(0)
    full = lm.__call__(sequence, None, None, None)
    cache = lm.bind("init_cache", max_decode_length=12)(sequence[:, :0])
    np.testing.assert_array_equal(cache["index"], [0, 0, 0])
    for t in range(4):
        logits, cache = lm.decode_step(sequence[:, t : t + 1], cache)
        np.testing.assert_allclose(logits, full[:, t], atol=2e-5)


def _per_example_loss(logits, targets, segment_ids, num_segments):
    token_loss, _ = losses.cross_entropy_with_z_loss(logits, targets, z_loss=1e-4)
    weights = (targets > 0).astype(jnp.float32)
    return [
        float(jnp.sum(token_loss * weights * (segment_ids == s)))
        for s in range(1, num_segments + 1)
    ]


def test_packed_batch_gives_each_examples_loss_encoder_decoder(encdec):
    # seqio's EncDecFeatureConverter docstring example (docs/spec.md section 5).
    logits = encdec.__call__(
        jnp.array([[7, 8, 5, 1, 8, 4, 9, 3, 1, 0]]),  # encoder_input_tokens
        jnp.array([[0, 3, 9, 0, 4, 0, 0]]),  # decoder_input_tokens
        jnp.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]]),  # encoder_segment_ids
        jnp.array([[1, 1, 1, 2, 2, 0, 0]]),  # decoder_segment_ids
        jnp.array([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0]]),  # encoder_positions
        jnp.array([[0, 1, 2, 0, 1, 0, 0]]),  # decoder_positions
    )
    targets = jnp.array([[3, 9, 1, 4, 1, 0, 0]])
    packed = _per_example_loss(logits, targets, jnp.array([[1, 1, 1, 2, 2, 0, 0]]), 2)
    # The same two examples unpacked: one per row, padded.
    inputs = jnp.array([[7, 8, 5, 1, 0, 0, 0, 0, 0, 0], [8, 4, 9, 3, 1, 0, 0, 0, 0, 0]])
    targets = jnp.array([[3, 9, 1, 0, 0, 0, 0], [4, 1, 0, 0, 0, 0, 0]])
    decoder_inputs = jnp.array([[0, 3, 9, 0, 0, 0, 0], [0, 4, 0, 0, 0, 0, 0]])
    logits = encdec.__call__(inputs, decoder_inputs)
    rows = jnp.array([[1] * 7, [2] * 7])
    np.testing.assert_allclose(packed, _per_example_loss(logits, targets, rows, 2), rtol=1e-5)


def test_packed_batch_gives_each_examples_loss_decoder_only(lm):
    is_prefix_lm = lm.config.architecture == "prefix_lm"
    targets = jnp.array([[5, 6, 7, 1, 8, 9, 1, 4, 1, 0]])
    segments = jnp.array([[1, 1, 1, 1, 2, 2, 2, 3, 3, 0]])
    decoder_inputs = jnp.array([[0, 5, 6, 7, 0, 8, 9, 0, 4, 0]])
    prefix = jnp.array([[1, 1, 0, 0, 1, 1, 0, 1, 1, 0]]) if is_prefix_lm else None
    logits = lm.__call__(decoder_inputs, segments, None, prefix)
    packed = _per_example_loss(logits, targets, segments, 3)
    # The same three examples unpacked: one per row, padded.
    targets = jnp.array([[5, 6, 7, 1], [8, 9, 1, 0], [4, 1, 0, 0]])
    decoder_inputs = jnp.array([[0, 5, 6, 7], [0, 8, 9, 0], [0, 4, 0, 0]])
    prefix = jnp.array([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]]) if is_prefix_lm else None
    logits = lm.__call__(decoder_inputs, None, None, prefix)
    rows = jnp.array([[1] * 4, [2] * 4, [3] * 4])
    np.testing.assert_allclose(packed, _per_example_loss(logits, targets, rows, 3), rtol=1e-5)


def test_prefix_positions_see_later_prefix_tokens_only_in_prefix_lm(lm):
    is_prefix_lm = lm.config.architecture == "prefix_lm"
    sequence = random_tokens(4, (3, 12)).at[:, 0].set(0)
    changed = sequence.at[:, 2].set(sequence[:, 2] % (VOCAB - 3) + 2)
    prefix = jnp.array([[1, 1, 1] + [0] * 9] * 3) if is_prefix_lm else None
    a = lm.__call__(sequence, None, None, prefix)
    b = lm.__call__(changed, None, None, prefix)
    # Position 1 sees position 2 only inside a fully visible prefix.
    assert np.allclose(a[:, :2], b[:, :2]) != is_prefix_lm
    assert not np.allclose(a[:, 2:], b[:, 2:])


def test_extra_encoder_padding_changes_nothing(encdec):
    inputs = random_tokens(5, (3, 11), lengths=[6, 4, 1])
    decoder_inputs = random_tokens(6, (3, 8)).at[:, 0].set(0)
    np.testing.assert_allclose(
        encdec.__call__(inputs, decoder_inputs),
        encdec.__call__(inputs[:, :6], decoder_inputs),
        atol=1e-5,
    )


def test_dropout_only_with_rngs(make_model):
    # One layer per stack: every dropout site adds to the compile time.
    model = make_model(config(num_encoder_layers=1, num_decoder_layers=1))
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, key, inputs, decoder_inputs):
        return nnx.merge(graphdef, state)(inputs, decoder_inputs, rngs=nnx.Rngs(dropout=key))

    inputs, decoder_inputs = random_tokens(7, (2, 5)), random_tokens(8, (2, 4))
    plain = Jitted(model).__call__(inputs, decoder_inputs)
    # NOTE: "rbg" keys compile much faster than threefry ones; dropout works with either.
    a = forward(state, jax.random.key(0, impl="rbg"), inputs, decoder_inputs)
    b = forward(state, jax.random.key(0, impl="rbg"), inputs, decoder_inputs)
    c = forward(state, jax.random.key(1, impl="rbg"), inputs, decoder_inputs)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, plain) and not np.allclose(a, c)


@pytest.mark.parametrize(
    "architecture", ["encoder_decoder", "encoder_decoder_shared", "decoder_only", "prefix_lm"]
)
@pytest.mark.parametrize("logits_via_embedding", [True, False])
def test_every_parameter_has_logical_axes(architecture, logits_via_embedding):
    cfg = config(architecture, logits_via_embedding=logits_via_embedding)
    model = nnx.eval_shape(lambda: tn.build(cfg, nnx.Rngs(0)))
    flat = list(nnx.state(model, nnx.Param).flat_state())
    assert len(flat) > 10
    for path, variable in flat:
        names = variable.get_metadata("out_sharding")
        assert names is not None, path
        assert len(names) == len(variable.shape), (path, names)
        assert set(names) <= set(axes.PARAM_AXES), (path, names)
        assert variable.get_metadata("eager_sharding") is False, path
    with nnx.logical_axis_rules([(axes.EMBED, "data"), (axes.MLP, "model")]):
        specs = nnx.get_partition_spec(nnx.state(model, nnx.Param)).to_pure_dict()
    if not cfg.is_decoder_only:
        assert tuple(specs["encoder"]["layers_0"]["mlp"]["wo"]["kernel"]) == ("model", "data")


def test_shared_decoder_borrows_encoder_layers():
    model = nnx.eval_shape(lambda: tn.build(config("encoder_decoder_shared"), nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param).to_pure_dict()
    assert set(state["decoder"]["layers_0"]) == {
        "pre_cross_attention_layer_norm",
        "encoder_decoder_attention",
    }
    assert {"relpos_bias", "decoder_norm", "logits_dense"} <= set(state["decoder"])


def test_bad_calls_say_what_is_wrong(encdec):
    with pytest.raises(ValueError, match="use DecoderOnly"):
        tn.EncoderDecoder(config("decoder_only"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="use EncoderDecoder"):
        tn.DecoderOnly(config(), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"\[batch, length\] integer array"):
        encdec.model(jnp.ones((2, 3)), jnp.zeros((2, 2), jnp.int32))
    with pytest.raises(ValueError, match="segment ids for both"):
        encdec.model(
            jnp.ones((1, 3), jnp.int32),
            jnp.zeros((1, 2), jnp.int32),
            encoder_segment_ids=jnp.ones((1, 3), jnp.int32),
        )
    with pytest.raises(TypeError, match="TransformerConfig"):
        tn.build({"d_model": 8}, nnx.Rngs(0))
