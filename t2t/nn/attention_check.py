"""Before a run trains on fused attention kernels: do they compute what the formula says, here?

`attention_ops` picks cuDNN's flash attention on GPUs and Pallas flash attention on TPUs per
attention site (`attention_ops.choose`). Such a kernel can be wrong on one chip, driver or
library version without failing: cuDNN's gradient of a float32 bias was measured 122% off on an
H200 (issue 32; t2t casts the bias to bfloat16 for it), and t2t's TPU flash kernels have run
only in Pallas's interpreter. `check` runs every site that a run puts on such a kernel once, at
the run's lengths and dtype with two rows, on this process's first device, and compares the
output and the gradients of the queries, keys, values and position bias with XLA's attention
computed in float32 at the highest matmul precision. A kernel further off than `TOLERANCE` stops
the run with the fix (`attention_impl='xla'`) before any step trains on wrong gradients. It
costs three small compiles per checked site (the kernel, XLA in the compute dtype, the float32
reference); sites on XLA are not checked.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from t2t import errors
from t2t.nn import attention_ops, masks

# Relative error (the norm of the difference over the reference's norm) a kernel in the compute
# dtype may have against the float32 reference. bfloat16 keeps 8 bits: XLA's own bfloat16
# attention is about 0.5% off at T5.1.1-base's shapes; a wrong kernel is off by tens of percent.
TOLERANCE = 0.05
# What is compared, in `Result.errors`.
QUANTITIES = ("output", "queries' gradient", "keys' gradient", "values' gradient", "bias gradient")


class KernelMismatch(errors.UserError):
    """A fused attention kernel disagrees with the formula on this device."""


@dataclasses.dataclass(frozen=True)
class Result:
    """One site's check: its implementation, and the relative error of each quantity (kernel
    and XLA in the compute dtype, each against the float32 reference)."""

    site: str
    implementation: str
    errors: dict[str, float]
    xla_errors: dict[str, float]

    @property
    def worst(self) -> tuple[str, float]:
        name = max(self.errors, key=self.errors.get)
        return name, self.errors[name]


def check(
    config,
    platform: str,
    lengths: tuple[int, int],
    *,
    packed: bool = False,
    rows: int = 2,
    tolerance: float = TOLERANCE,
    seed: int = 0,
) -> list[Result]:
    """Checks every site `config` runs on a fused kernel on `platform` for batches of `lengths`
    (inputs, targets); returns the sites' results (empty when every site runs XLA).

    Raises:
      KernelMismatch: a kernel's output or a gradient is more than `tolerance` off (the
        message names the site, the quantity, both errors and the fix).
    """
    chosen = attention_ops.describe(config, platform, training=True, lengths=lengths)
    results = []
    for name, site in attention_ops.sites(config, lengths).items():
        implementation = chosen[name]
        if implementation == "xla":
            continue
        result = _check_site(config, name, site, implementation, lengths, packed, rows, seed)
        results.append(result)
        quantity, error = result.worst
        if not error <= tolerance:  # NaN fails too
            raise KernelMismatch(
                f"attention_impl={config.attention_impl!r} runs the {name} on {implementation} "
                f"on this {platform}, and its {quantity} is {error:.1%} off the float32 formula "
                f"(XLA's attention in {config.dtype}: {result.xla_errors[quantity]:.1%}; "
                f"tolerance {tolerance:.0%}), at {site.lengths[0]} x {site.lengths[1]} tokens"
                f"{', packed' if packed else ''}. Training on it would follow wrong gradients: "
                "run it with attention_impl='xla' (--gin.t2t.nn.get_preset.attention_impl="
                "\"'xla'\"), and report the chip, driver and library versions."
            )
    return results


def report(results: list[Result], tolerance: float = TOLERANCE) -> str:
    """One line for the run's log: "attention kernels against the float32 formula: <site> on
    <kernel> <its largest error> (<of what>; XLA in the compute dtype <its error there>), ...;
    tolerance 5%"."""
    if not results:
        return "attention kernels: every site runs XLA, nothing to check"
    parts = []
    for result in results:
        quantity, error = result.worst
        parts.append(
            f"{result.site} on {result.implementation} {error:.2%} ({quantity}; XLA in the "
            f"compute dtype {result.xla_errors[quantity]:.2%})"
        )
    return (
        "attention kernels against the float32 formula: "
        + ", ".join(parts)
        + f"; tolerance {tolerance:.0%}"
    )


@dataclasses.dataclass(frozen=True)
class SiteInputs:
    """Random operands of one attention site at a run's shapes, as `check` compares them."""

    operands: tuple[jax.Array, ...]
    """Queries [rows, L, heads, d_kv], keys and values [rows, heads, K, d_kv], and the
    position bias [1, heads, L, K] where the site adds one; float32."""
    visibility: masks.Visibility
    """The site's mask as the network builds it; the last row's last quarter is padding."""
    real: jax.Array
    """[rows, L] 1.0 for the queries that carry loss (padding queries compute anything)."""
    cotangent: jax.Array
    """[rows, L, heads, d_kv] the output's gradient."""


def site_inputs(config, name: str, site, lengths, *, packed=False, rows=2, seed=0) -> SiteInputs:
    """The operands `check` runs the site `name` (of `attention_ops.sites(config, lengths)`)
    on: logits of unit scale (T5 folds 1/sqrt(d_kv) into the query kernel), a bias of a few
    units, two documents per row when `packed`."""
    length, key_length = site.lengths
    heads, head_dim = config.num_heads, config.d_kv
    keys = jax.random.split(jax.random.PRNGKey(seed), 5)
    q = jax.random.normal(keys[0], (rows, length, heads, head_dim)) * head_dim**-0.5
    k = jax.random.normal(keys[1], (rows, heads, key_length, head_dim))
    v = jax.random.normal(keys[2], (rows, heads, key_length, head_dim))
    bias = jax.random.normal(keys[3], (1, heads, length, key_length))
    visibility, real = _visibility(name, site, lengths, packed, rows)
    return SiteInputs(
        operands=(q, k, v, bias) if site.biased else (q, k, v),
        visibility=visibility,
        real=real,
        cotangent=jax.random.normal(keys[4], (rows, length, heads, head_dim)),
    )


def gradients(inputs: SiteInputs, implementation: str, operand_dtype):
    """A jitted function of the operands (cast to `operand_dtype`) giving the gradients of
    every operand and the output, with `implementation`'s attention; padding queries' outputs
    are zeroed (they differ between implementations: XLA gives them the values' sum, cuDNN
    zeros, flash the padding keys' mean)."""

    def loss(*args):
        q, k, v, *bias = (x.astype(operand_dtype) for x in args)
        out = attention_ops.attention(
            q, k, v, bias[0] if bias else None, inputs.visibility, implementation=implementation
        )
        out = out.astype(jnp.float32) * inputs.real[:, :, None, None]
        return jnp.sum(out * inputs.cotangent), out

    argnums = tuple(range(len(inputs.operands)))
    return jax.jit(jax.grad(loss, argnums=argnums, has_aux=True))


def _check_site(config, name, site, implementation, lengths, packed, rows, seed) -> Result:
    inputs = site_inputs(config, name, site, lengths, packed=packed, rows=rows, seed=seed)
    dtype = jnp.dtype(config.dtype)
    operands = [x.astype(dtype) for x in inputs.operands]

    def computed(implementation, operand_dtype):
        gradient, out = gradients(inputs, implementation, operand_dtype)(*operands)
        return [np.asarray(x, np.float32) for x in (out, *gradient)]

    with jax.default_matmul_precision("highest"):
        reference = computed("xla", jnp.float32)
    kernel = computed(implementation, dtype)
    xla = computed("xla", dtype)
    count = len(reference)
    return Result(
        site=name,
        implementation=implementation,
        errors=dict(zip(QUANTITIES[:count], map(relative, kernel, reference), strict=True)),
        xla_errors=dict(zip(QUANTITIES[:count], map(relative, xla, reference), strict=True)),
    )


def relative(got, want) -> float:
    """The norm of `got - want` over the norm of `want` (of `got` where `want` is zero)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.linalg.norm(want))
    return float(np.linalg.norm(got - want)) / scale if scale else float(np.linalg.norm(got))


def _visibility(name, site, lengths, packed, rows):
    """A site's visibility as the network builds it (`encoder_decoder`, `decoder_only`), for
    `rows` rows whose last has its last quarter padded; and which queries are real [rows, L]."""
    inputs, _ = lengths
    length, key_length = site.lengths

    def valid(n):  # [rows, n]: the last row's last quarter is padding
        positions = np.arange(n)[None, :]
        ends = np.full((rows, 1), n)
        ends[-1] = n - n // 4
        return positions < ends

    def segments(n):  # two documents per row, padding is segment 0
        ids = np.where(np.arange(n)[None, :] < n // 2, 1, 2).repeat(rows, axis=0)
        return np.where(valid(n), ids, 0).astype(np.int32)

    if name == "encoder self-attention":
        query_valid = key_valid = valid(length)
        visibility = masks.Visibility(
            query_valid=jnp.asarray(query_valid),
            key_valid=jnp.asarray(key_valid),
            query_segments=jnp.asarray(segments(length)) if packed else None,
            key_segments=jnp.asarray(segments(length)) if packed else None,
        )
    elif name == "cross-attention":
        query_valid = valid(length) if packed else np.ones((rows, length), bool)
        visibility = masks.Visibility(
            key_valid=jnp.asarray(valid(key_length)),
            query_segments=jnp.asarray(segments(length)) if packed else None,
            key_segments=jnp.asarray(segments(key_length)) if packed else None,
        )
    else:  # a decoder's causal self-attention; a prefix LM's prefix is its inputs
        query_valid = valid(length) if packed else np.ones((rows, length), bool)
        prefix = np.arange(length)[None, :].repeat(rows, axis=0) < inputs if site.prefix else None
        visibility = masks.Visibility(
            causal=True,
            prefix=None if prefix is None else jnp.asarray(prefix),
            query_segments=jnp.asarray(segments(length)) if packed else None,
            key_segments=jnp.asarray(segments(length)) if packed else None,
        )
    return visibility, jnp.asarray(query_valid, jnp.float32)
