"""The attention op keeps the relative position bias [1, N, L, S] and boolean masks apart, and
computes what t2t computed when the stacks added the mask, as a -1e10 bias, to the position bias
and handed every layer one [B, N, L, S] array: same logits, loss and gradient of every parameter
(the relative position tables included), packed and unpacked, for every architecture. Also: no
[B, N, L, S] array crosses a layer boundary of the training program, `auto` picks per platform
and call site, and cuDNN matches XLA where a GPU is present."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import t2t.nn as tn
from t2t import models
from t2t.nn import attention_ops, layers, masks

VOCAB = 120
HEADS = 4


def config(architecture="encoder_decoder", **overrides):
    depth = {"num_encoder_layers": 0} if architecture in ("decoder_only", "prefix_lm") else {}
    fields = dict(
        vocab_size=VOCAB,
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_heads=HEADS,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.1,
    )
    return tn.get_preset("tiny", architecture=architecture, **{**fields, **depth, **overrides})


def batch(architecture, packed, rows=3, inputs=12, targets=8, seed=0):
    """Rows padded at the end; packed rows hold two examples each (segments 1, 2, then 0)."""
    rng = np.random.default_rng(seed)

    def tokens_and_segments(length, cuts):
        tokens = rng.integers(2, VOCAB, (rows, length))
        segments = np.zeros((rows, length), np.int32)
        positions = np.zeros((rows, length), np.int32)
        for row, (first, end) in enumerate(cuts):
            segments[row, :first] = 1
            segments[row, first:end] = 2 if packed else 1
            positions[row, :first] = np.arange(first)
            positions[row, first:end] = np.arange(end - first) + (0 if packed else first)
            tokens[row, end:] = 0
        return tokens, segments, positions

    targets_, target_segments, target_positions = tokens_and_segments(
        targets, [(3, 8), (4, 7), (2, 5)]
    )
    out = {"decoder_target_tokens": targets_, "decoder_loss_weights": targets_ > 0}
    shifted = np.pad(targets_[:, :-1], ((0, 0), (1, 0)))
    shifted[target_positions == 0] = 0  # every segment starts from token 0
    out["decoder_input_tokens"] = shifted * (target_segments > 0)
    if packed:
        out["decoder_segment_ids"] = target_segments
        out["decoder_positions"] = target_positions
    if architecture.startswith("encoder_decoder"):
        inputs_, input_segments, input_positions = tokens_and_segments(
            inputs, [(5, 12), (6, 9), (4, 10)]
        )
        out["encoder_input_tokens"] = inputs_
        if packed:
            out["encoder_segment_ids"] = input_segments
            out["encoder_positions"] = input_positions
    if architecture == "prefix_lm":
        out["decoder_causal_attention"] = np.tile(np.arange(targets) < 3, (rows, 1))
    return {
        k: jnp.asarray(v, jnp.float32 if k.endswith("weights") else jnp.int32)
        for k, v in out.items()
    }


def additive_bias_attention(
    q, k, v, bias, visibility, *, implementation="auto", dropout_rate=0.0, rngs=None, **_
):
    """The arithmetic of t2t before this op: the mask as a -1e10 float32 bias, added to the
    position bias over the whole batch ([B, N, L, S]), then added to float32 logits."""
    del implementation
    logits = jnp.einsum("BLNH,BNSH->BNLS", q, k, preferred_element_type=jnp.float32)
    full = jnp.zeros((q.shape[0], q.shape[2], q.shape[1], k.shape[2]), jnp.float32)
    if bias is not None:
        full = full + bias
    mask = visibility.mask(q.shape[1], k.shape[2])
    if mask is not None:
        full = full + masks.mask_to_bias(mask)
    weights = jax.nn.softmax(logits + full, axis=-1)
    weights = layers.dropout(weights, dropout_rate, rngs).astype(v.dtype)
    return jnp.einsum("BNLS,BNSH->BLNH", weights, v)


def loss_and_grads(cfg, features, seed=0):
    model = models.model_for(cfg)
    params = model.init_params(jax.random.PRNGKey(seed))
    rng = jax.random.PRNGKey(7)  # dropout on: both paths draw the same masks

    @jax.jit
    def run(params):
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, features, rng)
        return loss, grads

    loss, grads = run(params)
    return float(loss), nnx.to_pure_dict(grads)


# Packed encoder-decoder batches are checked with shared parameters (the relative-bias table
# then gets both stacks' gradients); unpacked, with separate ones.
CASES = [
    ("encoder_decoder", False),
    ("encoder_decoder_shared", True),
    ("decoder_only", False),
    ("decoder_only", True),
    ("prefix_lm", False),
]


# The softmax's gradient takes its row sums from the probabilities (remat "none", every case)
# or from the outputs (`attention_ops.row_sums_for`), with dropout on the attention weights and
# without (two cases).
# Rows from the outputs (`dots_with_no_batch_dims`): without dropout on the encoder-decoder,
# with it on the packed decoder-only model (each path of `_weighted_values`' gradient once).
GRADIENT_CASES = [(*case, 0.1, "none") for case in CASES] + [
    (*CASES[0], 0.0, "dots_with_no_batch_dims"),
    (*CASES[3], 0.1, "dots_with_no_batch_dims"),
]


@pytest.mark.parametrize("architecture, packed, dropout_rate, remat_policy", GRADIENT_CASES)
def test_the_op_equals_the_additive_bias_in_loss_and_every_gradient(
    monkeypatch, architecture, packed, dropout_rate, remat_policy
):
    cfg = config(
        architecture,
        attention_impl="xla",
        dropout_rate=dropout_rate,
        remat_policy=remat_policy,
    )
    features = batch(architecture, packed)
    loss, grads = loss_and_grads(cfg, features)
    monkeypatch.setattr(attention_ops, "attention", additive_bias_attention)
    reference_loss, reference_grads = loss_and_grads(cfg, features)
    assert loss == pytest.approx(reference_loss, rel=1e-6)
    paths = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(grads)}
    reference_paths = {
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(reference_grads)
    }
    assert paths == reference_paths
    assert any("rel_embedding" in p for p in paths)
    for (path, got), (_, want) in zip(
        jax.tree_util.tree_leaves_with_path(grads),
        jax.tree_util.tree_leaves_with_path(reference_grads),
        strict=True,
    ):
        scale = float(np.max(np.abs(want))) or 1.0
        np.testing.assert_allclose(
            got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=jax.tree_util.keystr(path)
        )
        if "rel_embedding" in jax.tree_util.keystr(path):
            assert float(np.max(np.abs(got))) > 0  # the table does learn


@pytest.mark.parametrize("with_bias", [False, True])
def test_the_probabilities_have_the_softmax_gradient(with_bias):
    """`_weighted_values` has its own gradient; the probabilities it computes keep the softmax's
    (their function exists to keep the mask out of JAX's loop-invariant hoisting)."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 3, 5, 7)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(1, 3, 5, 7)), jnp.float32) if with_bias else None
    visibility = masks.Visibility(key_valid=jnp.asarray(np.arange(7) < [[6], [4]]))
    weights = jnp.asarray(rng.normal(size=(2, 3, 5, 7)), jnp.float32)

    def ours(logits, bias):
        log_sum = attention_ops._normalizer(logits, bias, visibility)
        p = attention_ops._probabilities(logits, bias, visibility, log_sum, jnp.float32)
        return jnp.sum(p * weights)

    def reference(logits, bias):
        full = logits + (0.0 if bias is None else bias)
        full = full + masks.mask_to_bias(visibility.mask(5, 7))
        return jnp.sum(jax.nn.softmax(full, axis=-1) * weights)

    argnums = (0, 1) if with_bias else 0
    got = jax.grad(ours, argnums)(logits, bias)
    want = jax.grad(reference, argnums)(logits, bias)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_row_sums_must_be_named():
    # The gradient test above covers both sums through these policies.
    assert attention_ops.row_sums_for("dots_with_no_batch_dims") == "outputs"
    assert {attention_ops.row_sums_for(p) for p in ("none", "full")} == {"probabilities"}
    q = jnp.zeros((1, 4, 2, 8))
    k = jnp.zeros((1, 2, 4, 8))
    with pytest.raises(ValueError, match="row_sums must be one of"):
        attention_ops.attention(q, k, k, None, masks.Visibility(), row_sums="keys")


@pytest.mark.parametrize("packed", [False, True])
def test_the_op_equals_the_additive_bias_in_logits_in_bfloat16(monkeypatch, packed):
    cfg = config(dtype="bfloat16", attention_impl="xla", dropout_rate=0.0)
    features = batch("encoder_decoder", packed)
    model = models.model_for(cfg)
    params = model.init_params(jax.random.PRNGKey(0))

    @jax.jit
    def logits(params):
        net = model.module(params)
        return net(
            features["encoder_input_tokens"],
            features["decoder_input_tokens"],
            features.get("encoder_segment_ids"),
            features.get("decoder_segment_ids"),
        )

    got = logits(params)
    monkeypatch.setattr(attention_ops, "attention", additive_bias_attention)
    want = jax.jit(logits.__wrapped__)(params)
    real = np.asarray(features["decoder_loss_weights"]) > 0
    scale = float(np.max(np.abs(np.asarray(want)[real])))
    # bfloat16 matmuls: the two paths round the same products; 1% of the largest logit.
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-2 * scale)


def _scan_boundary_shapes(jaxpr) -> list[tuple[int, ...]]:
    """Shapes of every value entering or leaving a `scan` (the layers' loop), recursively."""
    shapes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            shapes += [tuple(v.aval.shape) for v in (*eqn.invars, *eqn.outvars)]
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                shapes += _scan_boundary_shapes(inner)
            elif isinstance(value, (tuple, list)):
                for item in value:
                    inner = getattr(item, "jaxpr", item)
                    if hasattr(inner, "eqns"):
                        shapes += _scan_boundary_shapes(inner)
    return shapes


@pytest.mark.parametrize(
    "architecture, dropout_rate, remat_policy",
    [
        ("encoder_decoder", 0.1, "full"),
        ("decoder_only", 0.1, "full"),
        ("encoder_decoder", 0.0, "full"),
        ("encoder_decoder", 0.1, "dots_with_no_batch_dims"),
    ],
)
def test_no_batch_sized_bias_crosses_the_layers_of_the_training_program(
    architecture, dropout_rate, remat_policy
):
    """With scanned layers and full remat, the layers' loop (forward, recomputed forward and
    backward) receives and returns only what each layer needs: the bias [1, N, L, S] and the
    mask's [B, L] parts; no [B, N, L, S] array, no accumulated bias gradient of that size and no
    [B, 1, L, S] mask (with dropout, its bits' indices are checked too). The same where the
    projections are kept, whose softmax gradient takes its row sums from the outputs."""
    from t2t import optim
    from t2t.trainer import steps

    rows, inputs, targets = 3, 12, 8
    cfg = config(
        architecture,
        scan_layers=True,
        remat_policy=remat_policy,
        attention_impl="xla",
        dropout_rate=dropout_rate,
    )
    model = models.model_for(cfg)
    params = model.init_params(jax.random.PRNGKey(0))
    tx = optim.adafactor(optim.constant(1e-3))
    features = batch(architecture, packed=True, rows=rows, inputs=inputs, targets=targets)
    step = steps.make_train_step(model, tx)
    jaxpr = jax.make_jaxpr(step)(
        params, tx.init(params), features, jax.random.PRNGKey(0), jnp.int32(0)
    )
    shapes = _scan_boundary_shapes(jaxpr.jaxpr)
    lengths = {targets: targets} if architecture == "decoder_only" else {inputs: inputs}
    lengths[targets] = targets
    # Neither [B, N, L, S] biases nor [B, 1, L, S] masks: the masks arrive as their [B, L] parts.
    batch_sized = [s for s in shapes if len(s) == 4 and s[0] == rows and s[2] in lengths]
    assert not batch_sized, batch_sized
    position_bias = [s for s in shapes if len(s) == 4 and s[0] == 1 and s[1] == HEADS]
    assert position_bias, shapes  # the layers do receive the [1, N, L, S] bias
    # What the remat policy keeps per layer: the softmax normalizers [layers, B, N, L, 1].
    kept = [s for s in shapes if len(s) == 5 and s[1:3] == (rows, HEADS) and s[4] == 1]
    assert {s[3] for s in kept} == set(lengths), shapes


def test_auto_picks_cudnn_where_not_causal_on_gpus_in_bfloat16():
    cfg = tn.get_preset("t5_1_1_base", dtype="bfloat16", dropout_rate=0.0)
    assert attention_ops.describe(cfg, "gpu") == {
        "encoder self-attention": "cudnn",
        "decoder self-attention": "xla",
        "cross-attention": "cudnn",
    }
    assert set(attention_ops.describe(cfg, "tpu").values()) == {"xla"}
    # On TPUs, flash attention from long keys on (and only where its blocks tile the lengths).
    assert set(attention_ops.describe(cfg, "tpu", lengths=(512, 114)).values()) == {"xla"}
    assert attention_ops.describe(cfg, "tpu", lengths=(2048, 512)) == {
        "encoder self-attention": "flash",
        "decoder self-attention": "xla",
        "cross-attention": "flash",
    }
    assert set(attention_ops.describe(cfg, "cpu").values()) == {"xla"}
    # float32 compute, or dropout while training: cuDNN cannot, auto says XLA.
    assert set(attention_ops.describe(cfg.replace(dtype="float32"), "gpu").values()) == {"xla"}
    with_dropout = cfg.replace(dropout_rate=0.1)
    assert set(attention_ops.describe(with_dropout, "gpu").values()) == {"xla"}
    assert attention_ops.describe(with_dropout, "gpu", training=False)[
        "encoder self-attention"
    ] == ("cudnn")


def test_an_explicit_cudnn_that_cannot_run_says_why_and_what_to_do():
    common = dict(head_dim=64, causal=False)
    with pytest.raises(ValueError, match="runs on NVIDIA GPUs.*attention_impl='auto'"):
        attention_ops.choose("cudnn", platform="cpu", dtype="bfloat16", **common)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        attention_ops.choose("cudnn", platform="gpu", dtype="float32", **common)
    with pytest.raises(ValueError, match="no dropout.*dropout_rate=0"):
        attention_ops.choose("cudnn", platform="gpu", dtype="bfloat16", dropout=True, **common)
    with pytest.raises(ValueError, match="d_kv a multiple of 8"):
        attention_ops.choose(
            "cudnn", platform="gpu", dtype="bfloat16", **{**common, "head_dim": 12}
        )
    # A decoding step's per-row bias stays on XLA even when cuDNN was asked for.
    assert (
        attention_ops.choose("cudnn", platform="gpu", dtype="bfloat16", per_row_bias=True, **common)
        == "xla"
    )
    # auto: cuDNN where not causal, except a decoding step's single query.
    assert attention_ops.choose("auto", platform="gpu", dtype="bfloat16", **common) == "cudnn"
    one_query = dict(platform="gpu", dtype="bfloat16", lengths=(1, 512), **common)
    assert attention_ops.choose("auto", **one_query) == "xla"
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        attention_ops.choose("fast", platform="gpu", dtype="bfloat16", **common)
    # Pallas flash attention: TPUs only; sites it cannot tile (114 targets) stay on XLA.
    with pytest.raises(ValueError, match="runs on TPUs"):
        attention_ops.choose("flash", platform="gpu", dtype="bfloat16", **common)
    flash = dict(platform="tpu", dtype="bfloat16", **common)
    assert attention_ops.choose("flash", lengths=(512, 512), **flash) == "flash"
    assert attention_ops.choose("flash", lengths=(114, 512), **flash) == "xla"
    with pytest.raises(ValueError, match="no dropout"):
        attention_ops.choose("flash", lengths=(512, 512), dropout=True, **flash)
    with pytest.raises(ValueError, match="attention_impl must be one of"):
        tn.get_preset("tiny", attention_impl="fast")


def test_visibility_rebuilds_the_masks_of_the_worked_examples():
    """The parts give the matrices of `test_masks.py`: padding, causal, packed causal, prefix."""
    tokens = jnp.array([[5, 6, 0]])
    padding = masks.Visibility(query_valid=tokens > 0, key_valid=tokens > 0).mask(3, 3)
    np.testing.assert_array_equal(padding, masks.padding_mask(tokens, tokens))
    segments = jnp.array([[1, 1, 2, 2, 0]])
    packed = masks.Visibility(causal=True, query_segments=segments, key_segments=segments)
    np.testing.assert_array_equal(
        packed.mask(5, 5),
        masks.combine_masks(masks.causal_mask(5), masks.segment_mask(segments, segments)),
    )
    prefix = masks.Visibility(causal=True, prefix=jnp.array([[1, 1, 0, 0]]) > 0)
    np.testing.assert_array_equal(
        prefix.mask(4, 4), masks.prefix_lm_mask(jnp.array([[1, 1, 0, 0]]))
    )
    assert masks.Visibility().mask(3, 3) is None
    with pytest.raises(ValueError, match="both queries and keys"):
        masks.Visibility(query_segments=segments)
    with pytest.raises(ValueError, match="set causal=True"):
        masks.Visibility(prefix=jnp.array([[1, 0]]) > 0)


def _gpu_with_cudnn() -> bool:
    try:
        return jax.default_backend() == "gpu"
    except RuntimeError:
        return False


@pytest.mark.skipif(not _gpu_with_cudnn(), reason="cuDNN flash attention needs an NVIDIA GPU")
@pytest.mark.parametrize("packed", [False, True])
def test_cudnn_matches_xla_in_loss_and_gradients_on_a_gpu(packed):
    """Where a GPU is present: cuDNN (bias cast to bfloat16) against XLA in bfloat16, the
    relative position tables' gradients included, within bfloat16 rounding."""
    base = dict(dtype="bfloat16", dropout_rate=0.0, d_kv=64, d_model=128, num_heads=2)
    features = batch("encoder_decoder", packed)
    loss, grads = loss_and_grads(config(attention_impl="xla", **base), features)
    cudnn_loss, cudnn_grads = loss_and_grads(config(attention_impl="cudnn", **base), features)
    assert cudnn_loss == pytest.approx(loss, rel=2e-2)
    for (path, got), (_, want) in zip(
        jax.tree_util.tree_leaves_with_path(cudnn_grads),
        jax.tree_util.tree_leaves_with_path(grads),
    ):
        scale = float(np.max(np.abs(want))) or 1.0
        np.testing.assert_allclose(got, want, atol=3e-2 * scale, err_msg=jax.tree_util.keystr(path))


# t2t's kernels (`flash_kernels`) sharded with packed rows (the harder case); JAX's, where t2t's
# do not tile the rows, alone and unpacked.
@pytest.mark.parametrize("packed, mesh, kernels", [(False, None, "jax"), (True, (2, 2), "t2t")])
def test_pallas_flash_matches_xla_in_loss_and_gradients(monkeypatch, packed, mesh, kernels):
    """TPU flash attention, run by Pallas's TPU interpreter on the CPU: the encoder's 128-long
    self-attention on flash (the 8-long decoder sites stay on XLA), with the position bias and
    its gradient, padding and packing as segment ids; alone and sharded over a 2x2 mesh (one
    kernel per device on its rows and heads, `shard_map`)."""
    from jax.experimental.pallas import tpu as pltpu

    from t2t.nn import flash_kernels
    from t2t.partitioning import make_partitioner

    # t2t's kernels also inside a scanned stack. (Not rematerialized: Pallas's TPU interpreter
    # runs the kernels as callbacks, which `jax.checkpoint` refuses; compiled for a TPU,
    # `benchmarks/tpu_attention_compile.py` runs them under full remat.)
    layout = {"scan_layers": True} if kernels == "t2t" else {}

    def run(implementation):
        cfg = config(attention_impl=implementation, dropout_rate=0.0, d_model=64, d_kv=16, **layout)
        features = batch("encoder_decoder", packed, rows=4, inputs=128, targets=8)
        model = models.model_for(cfg)
        params = model.init_params(jax.random.PRNGKey(0))
        step = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))
        if mesh is None:
            (loss, _), grads = step(params, features, None)
        else:
            partitioner = make_partitioner(
                *mesh, mode="tensor_parallel", devices=jax.devices()[: mesh[0] * mesh[1]]
            )
            with partitioner.context():
                (loss, _), grads = step(params, features, None)
        return float(loss), nnx.to_pure_dict(grads)

    loss, grads = run("xla")
    monkeypatch.setattr(attention_ops, "current_platform", lambda: "tpu")
    tiled = []
    ours = flash_kernels.flash_attention
    monkeypatch.setattr(flash_kernels, "flash_attention", lambda *a: tiled.append(1) or ours(*a))
    if kernels == "jax":
        monkeypatch.setattr(flash_kernels, "fits", lambda *a: "forced JAX's kernel")
    seen = []
    flash = attention_ops._flash
    monkeypatch.setattr(attention_ops, "_flash", lambda *a: seen.append(1) or flash(*a))
    with pltpu.force_tpu_interpret_mode():
        flash_loss, flash_grads = run("flash")
    assert seen  # the encoder did run on flash
    assert bool(tiled) == (kernels == "t2t")
    assert flash_loss == pytest.approx(loss, rel=1e-5)
    for (path, got), (_, want) in zip(
        jax.tree_util.tree_leaves_with_path(flash_grads),
        jax.tree_util.tree_leaves_with_path(grads),
    ):
        scale = float(np.max(np.abs(want))) or 1.0
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=jax.tree_util.keystr(path)
        )
