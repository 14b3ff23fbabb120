"""The building blocks of T5: dense kernels, the token embedding, RMS norm, the MLP, dropout.

Every parameter is created with its logical axis names (from `t2t.nn.axes`) and with flax's eager
sharding off, so `nnx.eval_shape` works without a mesh and `t2t.partitioning` decides placement.
Parameters are stored in `config.param_dtype`; matmuls run in `config.dtype`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from t2t.nn import axes
from t2t.nn.config import TransformerConfig

Initializer = Callable[[jax.Array, tuple[int, ...], jnp.dtype], jax.Array]


class ParamKeys:
    """Initialization keys for every parameter of a model, drawn from one `rngs.params()` key.

    NOTE: each `nnx.Rngs.params()` call updates a counter variable, and under abstract tracing
    (`nnx.eval_shape`) every such update costs time proportional to the trace so far (jax builds
    an error message for `Tracer.sharding`), making the init of a 24-layer model quadratic (37 s
    for t5_1_1_xxl). A Python counter folded into one key costs nothing.
    """

    def __init__(self, rngs: nnx.Rngs):
        self._key = rngs.params()
        self._count = 0

    def __call__(self) -> jax.Array:
        self._count += 1
        return jax.random.fold_in(self._key, self._count)


Keys = nnx.Rngs | ParamKeys


def param_keys(rngs: Keys) -> ParamKeys:
    """`rngs` as a `ParamKeys` (a model's top-level constructor calls this once)."""
    return rngs if isinstance(rngs, ParamKeys) else ParamKeys(rngs)


def param(rngs: Keys, init: Initializer, shape, dtype, names: tuple[str, ...]) -> nnx.Param:
    """Creates a parameter annotated with logical axis names, one per dimension."""
    assert len(names) == len(shape), (names, shape)
    key = rngs() if isinstance(rngs, ParamKeys) else rngs.params()
    return nnx.Param(init(key, shape, dtype), out_sharding=names, eager_sharding=False)


def fan_in_init(scale: float = 1.0) -> Initializer:
    """Truncated normal with variance `scale / fan_in` (fan_in = first dimension of a kernel)."""
    return jax.nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal")


def dropout(x: jax.Array, rate: float, rngs: nnx.Rngs | None) -> jax.Array:
    """Inverted dropout; the identity when `rngs` is None (deterministic) or `rate` is 0."""
    if rngs is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rngs.dropout(), 1.0 - rate, x.shape)
    return jnp.where(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros((), x.dtype))


class Dense(nnx.Module):
    """A bias-free linear map with a 2-D kernel `[in, out]` and logical axis names."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        names: tuple[str, str],
        config: TransformerConfig,
        init: Initializer,
        rngs: Keys,
    ):
        self.dtype = config.compute_dtype
        self.kernel = param(rngs, init, (in_features, out_features), config.params_dtype, names)

    def __call__(self, x: jax.Array) -> jax.Array:
        """[..., in] -> [..., out] in the compute dtype."""
        kernel = self.kernel[...].astype(self.dtype)
        return jnp.dot(x.astype(self.dtype), kernel)


class Embed(nnx.Module):
    """The token embedding table [V, D]; `attend` gives tied output logits."""

    def __init__(self, config: TransformerConfig, *, rngs: Keys):
        self.dtype = config.compute_dtype
        self.embedding = param(
            rngs,
            jax.nn.initializers.normal(stddev=1.0),
            (config.vocab_size, config.d_model),
            config.params_dtype,
            (axes.VOCAB, axes.EMBED),
        )

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """[B, L] int -> [B, L, D] in the compute dtype."""
        return jnp.take(self.embedding[...], tokens, axis=0).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """[B, T, D] -> [B, T, V] float32: dot products with every embedding row."""
        table = self.embedding[...].astype(self.dtype)
        return jnp.einsum("BTD,VD->BTV", x.astype(self.dtype), table,
                          preferred_element_type=jnp.float32)


class RMSNorm(nnx.Module):
    """T5's layer norm: scale only, no bias, no mean subtraction; computed in float32."""

    def __init__(self, config: TransformerConfig, *, rngs: Keys):
        self.dtype = config.compute_dtype
        self.epsilon = config.layer_norm_epsilon
        self.scale = param(
            rngs, jax.nn.initializers.ones, (config.d_model,), config.params_dtype, (axes.EMBED,)
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """[..., D] -> [..., D] in the compute dtype."""
        x = x.astype(jnp.float32)
        mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        y = x * jax.lax.rsqrt(mean_square + self.epsilon)
        return (y * self.scale[...].astype(jnp.float32)).astype(self.dtype)


_ACTIVATIONS = {
    "relu": jax.nn.relu,
    # NOTE: T5 v1.1's GELU is the tanh approximation (HF calls it "gelu_new").
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),
    "linear": lambda x: x,
}


class Mlp(nnx.Module):
    """The feed-forward block: `wo(relu(wi(x)))` or gated `wo(act(wi_0(x)) * wi_1(x))`."""

    def __init__(self, config: TransformerConfig, *, rngs: Keys):
        self.activations = config.mlp_activations
        self.dropout_rate = config.dropout_rate
        d, f = config.d_model, config.d_ff

        def dense_in():
            return Dense(d, f, names=(axes.EMBED, axes.MLP), config=config, init=fan_in_init(),
                         rngs=rngs)

        if len(self.activations) == 1:
            self.wi = dense_in()
        else:
            self.wi_0 = dense_in()
            self.wi_1 = dense_in()
        self.wo = Dense(f, d, names=(axes.MLP, axes.EMBED), config=config, init=fan_in_init(),
                        rngs=rngs)

    def __call__(self, x: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:
        """[B, L, D] -> [B, L, D]; dropout (training) after the activation."""
        if len(self.activations) == 1:
            h = _ACTIVATIONS[self.activations[0]](self.wi(x))  # [B, L, F]
        else:
            h = _ACTIVATIONS[self.activations[0]](self.wi_0(x))
            h = h * _ACTIVATIONS[self.activations[1]](self.wi_1(x))  # [B, L, F]
        h = dropout(h, self.dropout_rate, rngs)
        return self.wo(h)
