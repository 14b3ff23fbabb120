"""The building blocks of T5: dense kernels, the token embedding, RMS norm, the MLP, dropout.

Every parameter is created with its logical axis names (from `t2t.nn.axes`) and with flax's eager
sharding off, so `nnx.eval_shape` works without a mesh and `t2t.partitioning` decides placement.
Parameters are stored in `config.param_dtype`; matmuls run in `config.dtype`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from t2t.nn import axes, norm_kernels
from t2t.nn.config import TransformerConfig
from t2t.nn.sharding import constrain, current_platform

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
    return dropout_with_key(x, rate, rngs.dropout())


def dropout_with_key(x: jax.Array, rate: float, key: jax.Array) -> jax.Array:
    """Inverted dropout with its mask drawn from `key`: the same key, the same mask (a backward
    pass recomputes it instead of storing it)."""
    # P(keep) = 1 - rate, exact to 2**-32.
    keep = hashed_bits(key, x.shape) >= jnp.uint32(round(rate * 2**32))
    # NOTE: a product with the 0/1 mask, equal to selecting 0 for finite x: a select would keep
    # a full-shape zero for its backward pass, which JAX hoists out of a scanned stack.
    return (x / jnp.asarray(1.0 - rate, x.dtype)) * keep.astype(x.dtype)


def _mix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finalizer: a bijection on uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def hashed_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Uniform uint32 bits of `shape`, a keyed hash of each element's index.

    NOTE: `jax.random.bits` costs ~30 ns per element on CPU with either threefry or rbg keys
    (0.54 s for one [8, 8, 512, 512] attention-weights mask, ~4 s per T5-small training step at
    dropout 0.1) and multiplies compile time. Two rounds of a keyed integer hash over the element
    index cost ~3 ns per element, and only the two 32-bit seeds come from `jax.random`. Dropout
    needs independence between elements and between keys, not cryptographic strength.

    Args:
      key: a `jax.random` key (any implementation).
      shape: the output shape.

    Returns:
      [*shape] uint32.
    """
    seeds = jax.random.bits(key, (2,), jnp.uint32)
    if not shape:
        return _mix32(_mix32(seeds[0]) ^ seeds[1])
    # Index within the last two dimensions, and within the leading ones: neither overflows
    # uint32 for any realistic tensor, unlike a single flat index.
    # NOTE: each index is built at its own small shape ([1, .., 1, L, S] and [B, N, .., 1, 1])
    # and meets the other only after the key is mixed in. Full-shape indices would depend on
    # nothing, and inside a scanned stack JAX hoists such values out of the layers' loop as
    # residuals: three [B, N, L, S] uint32 arrays per stack for the attention weights' dropout.
    rank = len(shape)
    ones = (1,) * max(rank - 2, 0)
    low_shape = ones + tuple(shape[-2:])
    low = jax.lax.broadcasted_iota(jnp.uint32, low_shape, rank - 1)
    if rank >= 2:
        low = low + jax.lax.broadcasted_iota(jnp.uint32, low_shape, rank - 2) * jnp.uint32(
            shape[-1]
        )
    high_shape = tuple(shape[:-2]) + (1,) * min(rank, 2)
    high = jnp.zeros(high_shape, jnp.uint32)
    for axis in range(rank - 2):
        high = high * jnp.uint32(shape[axis]) + jax.lax.broadcasted_iota(
            jnp.uint32, high_shape, axis
        )
    h = _mix32(low * jnp.uint32(0x9E3779B9) + seeds[0])  # [1, .., 1, L, S]
    return jnp.broadcast_to(_mix32(h ^ (high * jnp.uint32(0x7FEB352D) + seeds[1])), shape)


class Dense(nnx.Module):
    """A bias-free linear map with a 2-D kernel `[in, out]` and logical axis names.

    With `lora_rank` r > 0 it also holds a LoRA update (Hu et al., 2021): `lora_a` [in, r]
    (random) and `lora_b` [r, out] (zeros), and computes `x W + scale (x A) B`, which equals
    `x W` until `lora_b` is trained.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        names: tuple[str, str],
        config: TransformerConfig,
        init: Initializer,
        rngs: Keys,
        lora_rank: int = 0,
    ):
        self.dtype = config.compute_dtype
        self.kernel = param(rngs, init, (in_features, out_features), config.params_dtype, names)
        self.names_at_use = tuple(axes.AT_USE[name] for name in names)
        self.step_kernel = None  # [out, in], set by `prepare_for_steps` inside a decoding trace
        self.lora_scale = config.lora_scale if lora_rank else 0.0
        if lora_rank:
            self.lora_a = param(
                rngs,
                fan_in_init(),
                (in_features, lora_rank),
                config.params_dtype,
                (names[0], axes.LORA_RANK),
            )
            self.lora_b = param(
                rngs,
                jax.nn.initializers.zeros,
                (lora_rank, out_features),
                config.params_dtype,
                (axes.LORA_RANK, names[1]),
            )

    def __call__(self, x: jax.Array) -> jax.Array:
        """[..., in] -> [..., out] in the compute dtype."""
        x = x.astype(self.dtype)
        if self.step_kernel is not None:
            return kernel_first_matmul(x, self.step_kernel)
        y = matmul(x, self._kernel_at_use())
        if self.lora_scale:
            a = self.lora_a[...].astype(self.dtype)  # [in, r]
            b = self.lora_b[...].astype(self.dtype)  # [r, out]
            y = y + matmul(matmul(x, a), b) * jnp.asarray(self.lora_scale, self.dtype)
        return y

    def _kernel_at_use(self) -> jax.Array:
        """The kernel in the compute dtype and the layout its matmul wants (`axes.AT_USE`)."""
        return constrain(self.kernel[...].astype(self.dtype), self.names_at_use)

    def merged_kernel(self) -> jax.Array:
        """The kernel with the LoRA update added, `W + scale A B` [in, out], in the storage
        dtype (the kernel itself without LoRA)."""
        kernel = self.kernel[...]
        if not self.lora_scale:
            return kernel
        update = jnp.dot(self.lora_a[...].astype(jnp.float32), self.lora_b[...].astype(jnp.float32))
        return (kernel.astype(jnp.float32) + self.lora_scale * update).astype(kernel.dtype)

    def prepare_for_steps(self) -> None:
        """From here on (in this trace) multiplies by a transposed copy of the kernel, kernel
        first: the form for decoding steps, where few rows meet every kernel (see
        `kernel_first_matmul`). Call it once, outside the step loop: the copy is made once. A
        LoRA update is merged into the copy."""
        kernel = self._kernel_at_use()
        if self.lora_scale:
            kernel = constrain(self.merged_kernel().astype(self.dtype), self.names_at_use)
        # The barrier keeps XLA from folding the transpose back into the products.
        self.step_kernel = jax.lax.optimization_barrier(kernel.T)


def kernel_first_matmul(x: jax.Array, kernel_t: jax.Array, **kwargs) -> jax.Array:
    """[..., I] x [O, I] -> [..., O] computed as `(kernel_t @ x^T)^T`: the kernel on the left.

    NOTE: with few rows (a decoding step multiplies the batch, or batch x beams, by every kernel)
    XLA's CPU matmuls are much faster with the large operand on the left, stored [O, I], and the
    rows on the right. Measured on T5-small's shapes at 4-32 rows: the MLP and attention
    projections 1.6-2.9x faster than `[M, I] x [I, O]`, the tied logits 1.4-1.5x faster than
    `[M, D] x [V, D]^T`; level at one row (`benchmarks/kernel_first_bench.py`). The product
    comes out [O, M]; the barrier keeps XLA from folding the (small) transpose back into the
    product, which would restore the slow form.
    """
    flat = x.reshape(-1, x.shape[-1])  # [M, I]
    out_t = jnp.einsum("OI,MI->OM", kernel_t, flat, **kwargs)
    out = jax.lax.optimization_barrier(out_t).T  # [M, O]
    return out.reshape(*x.shape[:-1], kernel_t.shape[0])


def matmul(x: jax.Array, kernel: jax.Array, **kwargs) -> jax.Array:
    """[..., I] x [I, O] -> [..., O], as one 2-D matmul over the flattened leading dimensions.

    NOTE: XLA's CPU backend turns the weight gradient of a matmul with 3-D activations
    (contracting over both batch and length) into a dot that needs a transposed copy of the
    output gradient ([B*L, F] -> [F, B*L], recomputing any fused dropout bits in transposed
    order); flattening first gives a plain transposed-LHS matmul with no copies. The reshapes
    are free.
    """
    flat = x.reshape(-1, x.shape[-1])  # [B * L, K]
    out = jnp.dot(flat, kernel, **kwargs)  # [B * L, N]
    return out.reshape(*x.shape[:-1], kernel.shape[-1])


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
        self.kernel_first = False  # set by `prepare_for_steps` inside a decoding trace

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """[B, L] int -> [B, L, D] in the compute dtype."""
        x = jnp.take(self._table_at_use(), tokens, axis=0)
        return constrain(x, axes.BLD)

    def _table_at_use(self) -> jax.Array:
        """[V, D] in the compute dtype, split only over the vocabulary (`axes.AT_USE`)."""
        return constrain(self.embedding[...].astype(self.dtype), (axes.ACT_VOCAB, axes.ACT_EMBED))

    def attend(self, x: jax.Array) -> jax.Array:
        """[B, T, D] -> [B, T, V] float32: dot products with every embedding row."""
        table = self._table_at_use()
        flat = x.reshape(-1, x.shape[-1]).astype(self.dtype)  # [B * T, D] (see `matmul`)
        if self.kernel_first:  # the table [V, D] is already the kernel-first layout
            logits = kernel_first_matmul(flat, table, preferred_element_type=jnp.float32)
        else:
            logits = jnp.einsum("TD,VD->TV", flat, table, preferred_element_type=jnp.float32)
        return constrain(logits.reshape(*x.shape[:-1], table.shape[0]), axes.BLV)  # [B, T, V]

    def prepare_for_steps(self) -> None:
        """From here on (in this trace) `attend` puts the table first (`kernel_first_matmul`)."""
        self.kernel_first = True


class Prompt(nnx.Module):
    """A soft prompt (Lester et al., 2021): P learned vectors `embedding` [P, D] prepended to
    every row of embedded encoder inputs. Initialized like token embeddings; fine-tuning may
    copy rows of the pretrained embedding into it (`t2t.finetuning`)."""

    def __init__(self, config: TransformerConfig, *, rngs: Keys):
        self.dtype = config.compute_dtype
        self.embedding = param(
            rngs,
            jax.nn.initializers.normal(stddev=1.0),
            (config.prompt_length, config.d_model),
            config.params_dtype,
            (axes.PROMPT, axes.EMBED),
        )

    def prepend(self, x: jax.Array) -> jax.Array:
        """[B, L, D] -> [B, P + L, D]."""
        prompt = self.embedding[...].astype(x.dtype)
        prompt = jnp.broadcast_to(prompt[None], (x.shape[0], *prompt.shape))  # [B, P, D]
        return constrain(jnp.concatenate([prompt, x], axis=1), axes.BLD)


def prepare_for_steps(*modules: nnx.Module) -> None:
    """Calls `prepare_for_steps` of every `Dense` and `Embed` in `modules` (sub-modules too)."""
    for module in modules:
        for _, child in nnx.iter_graph(module):
            if isinstance(child, (Dense, Embed)):
                child.prepare_for_steps()


class RMSNorm(nnx.Module):
    """T5's layer norm: scale only, no bias, no mean subtraction; computed in float32."""

    def __init__(self, config: TransformerConfig, *, rngs: Keys):
        self.dtype = config.compute_dtype
        self.epsilon = config.layer_norm_epsilon
        self.impl = config.norm_impl
        self.scale = param(
            rngs, jax.nn.initializers.ones, (config.d_model,), config.params_dtype, (axes.EMBED,)
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        """[..., D] -> [..., D] in the compute dtype."""
        x = x.astype(jnp.float32)
        mean_square = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        y = x * jax.lax.rsqrt(mean_square + self.epsilon)
        return (y * self.scale[...].astype(jnp.float32)).astype(self.dtype)

    def residual(self, x: jax.Array, delta: jax.Array | None = None):
        """A pre-norm branch's input: `(s, norm(s))` with `s = x + delta` (or `x`), the
        residual stream's next value and what the branch reads. With `norm_impl="pallas"`
        (one device) the add, the norm and, backward, the residual stream's gradient are one
        kernel each way (`t2t.nn.norm_kernels`)."""
        same_dtype = delta is None or delta.dtype == x.dtype  # else XLA's promotion
        if self.impl == "pallas" and same_dtype and jax.sharding.get_abstract_mesh().size <= 1:
            interpret = current_platform() not in ("gpu", "cuda")
            fixed = (self.epsilon, jnp.dtype(self.dtype), interpret)
            if delta is None:
                return norm_kernels.rms_norm_residual(x, self.scale[...], *fixed)
            return norm_kernels.add_rms_norm(x, delta, self.scale[...], *fixed)
        if delta is not None:
            x = x + delta
        return x, self(x)


_ACTIVATIONS = {
    "relu": jax.nn.relu,
    # NOTE: T5 v1.1's GELU is the tanh approximation (HF calls it "gelu_new").
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,  # x * sigmoid(x), UL2's (T5X's "swish")
    "linear": lambda x: x,
}


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def gated(a: jax.Array, b: jax.Array, first: str, second: str) -> jax.Array:
    """`act_first(a) * act_second(b)`, the gated MLP's hidden activations, whose backward pass
    keeps only `a` and `b` and recomputes the activations from them.

    Autodiff keeps `act_first(a)` as well, an array the size of the hidden activations written
    in the forward pass and read again in the backward one (T5.1.1-base at batch 128 on an H100:
    one more [B, L, F] bfloat16 array each way per layer). Same values, same gradients.
    """
    return _ACTIVATIONS[first](a) * _ACTIVATIONS[second](b)


def _gated_forward(a, b, first, second):
    return gated(a, b, first, second), (a, b)


def _gated_backward(first, second, residuals, g):
    # The barrier keeps XLA from merging this recomputation with the forward pass's (CSE), which
    # would store the activation again.
    a, b = jax.lax.optimization_barrier(residuals)
    _, vjp = jax.vjp(lambda a, b: _ACTIVATIONS[first](a) * _ACTIVATIONS[second](b), a, b)
    return vjp(g)


gated.defvjp(_gated_forward, _gated_backward)


class Mlp(nnx.Module):
    """The feed-forward block: `wo(relu(wi(x)))` or gated `wo(act(wi_0(x)) * wi_1(x))`, then
    the adapter layer when `config.adapter_size` > 0."""

    def __init__(self, config: TransformerConfig, *, rngs: Keys):
        self.activations = config.mlp_activations
        self.dropout_rate = config.dropout_rate
        # Without rematerialization the gated product keeps only its inputs (`gated`); a
        # rematerialized layer recomputes its forward pass anyway, and there plain autodiff
        # compiles to less traffic (T5.1.1-base, batch 2048, v5e:4x4, full remat: 393 vs 399
        # GB per step, 5.4 vs 5.7 GiB per chip).
        self.gate_backward = config.remat_policy == "none"
        d, f = config.d_model, config.d_ff

        def dense(name, size_in, size_out, names):
            return Dense(
                size_in,
                size_out,
                names=names,
                config=config,
                init=fan_in_init(),
                rngs=rngs,
                lora_rank=config.lora_rank_for(name),
            )

        if len(self.activations) == 1:
            self.wi = dense("wi", d, f, (axes.EMBED, axes.MLP))
        else:
            self.wi_0 = dense("wi_0", d, f, (axes.EMBED, axes.MLP))
            self.wi_1 = dense("wi_1", d, f, (axes.EMBED, axes.MLP))
        self.wo = dense("wo", f, d, (axes.MLP, axes.EMBED))
        self.has_adapter = config.adapter_size > 0
        if self.has_adapter:
            self.adapter = Adapter(config, rngs=rngs)

    def __call__(self, x: jax.Array, rngs: nnx.Rngs | None = None) -> jax.Array:
        """[B, L, D] -> [B, L, D]; dropout (training) after the activation."""
        if len(self.activations) == 1:
            h = _ACTIVATIONS[self.activations[0]](self.wi(x))  # [B, L, F]
        else:
            first, second = self.activations
            a, b = self.wi_0(x), self.wi_1(x)
            if self.gate_backward:
                h = gated(a, b, first, second)  # [B, L, F]
            else:
                h = _ACTIVATIONS[first](a) * _ACTIVATIONS[second](b)
        h = dropout(constrain(h, axes.BLF), self.dropout_rate, rngs)
        y = self.wo(h)
        return self.adapter(y) if self.has_adapter else y


class Adapter(nnx.Module):
    """An adapter layer (Houlsby et al., 2019; T5 paper section 3.5.1): `y + wo(relu(wi(y)))`
    with `adapter_size` hidden units. `wo` starts at zero, so the layer starts as the identity
    and an adapted network computes exactly what the network it adapts does."""

    def __init__(self, config: TransformerConfig, *, rngs: Keys):
        d, a = config.d_model, config.adapter_size
        self.wi = Dense(
            d, a, names=(axes.EMBED, axes.ADAPTER), config=config, init=fan_in_init(), rngs=rngs
        )
        self.wo = Dense(
            a,
            d,
            names=(axes.ADAPTER, axes.EMBED),
            config=config,
            init=jax.nn.initializers.zeros,
            rngs=rngs,
        )

    def __call__(self, y: jax.Array) -> jax.Array:
        """[B, L, D] -> [B, L, D]."""
        return y + self.wo(jax.nn.relu(self.wi(y)))
