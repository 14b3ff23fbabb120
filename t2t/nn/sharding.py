"""Activation sharding constraints by logical axis name: the network's half of the layout.

The network calls `constrain(x, names)` at the points where the layout of an activation matters
(`t2t.nn.axes` lists them: embeddings out, the residual stream, attention queries, keys, values
and output, MLP hidden units, logits, the decoding cache). The rules table and the mesh come from
the context `t2t.partitioning.Partitioner.context()` sets up; the network never names a mesh axis.
Outside such a context (one device, tests, notebooks) `constrain` returns its input unchanged.
The same mesh says which platform the traced program is for (`current_platform`), which the
attention implementations and the fused norm kernels choose by.

Without these constraints XLA's sharding propagation guesses each activation's layout from the
parameters around it, and under FSDP (parameters split over `data` along `embed`) it may split an
activation's `embed` dimension over `data` as well, which its batch already uses: the program
then reshuffles activations with all-to-alls and holds several layouts at once. A constraint
pins the batch to `data` and the tensor-parallel dimensions (heads, MLP units, vocabulary) to
`model`, so XLA gathers weights instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from flax.core import spmd
from jax.sharding import PartitionSpec


def constrain(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """`x` constrained to the layout its logical axis `names` map to under the current rules.

    A dimension whose size its mesh axis does not divide is left replicated (tiny test models on
    a large mesh, a decoding batch of one), as `Partitioner.spec` does for parameters.

    Args:
      x: an activation, one name per dimension.
      names: logical activation axes (`t2t.nn.axes.ACT_*`), None for replicated.

    Returns:
      `x` under `jax.lax.with_sharding_constraint`, or `x` itself outside a mesh and rules
      context.
    """
    assert len(names) == x.ndim, (names, x.shape)
    spec = current_spec(names, x.shape)
    if spec is None:
        return x
    return jax.lax.with_sharding_constraint(x, spec)


def current_spec(names: Sequence[str | None], shape: Sequence[int]) -> PartitionSpec | None:
    """The `PartitionSpec` logical axis `names` of an array of `shape` map to under the current
    rules and mesh (None outside such a context). A dimension its mesh axis does not divide
    stays replicated."""
    rules = spmd.get_logical_axis_rules()
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return None
    table = dict(rules)
    spec = []
    for name, size in zip(names, shape):
        if name is not None and name not in table:
            raise ValueError(
                f"Activation axis {name!r} is not in the rules table; known names are "
                f"{sorted(table)}. Add it to t2t.partitioning.RULES."
            )
        target = None if name is None else table[name]
        if target is not None and (target not in mesh.shape or size % mesh.shape[target]):
            target = None
        spec.append(target)
    return PartitionSpec(*spec)


def current_platform() -> str:
    """The platform the program being traced is for: the current mesh's devices (which may be
    a TPU slice described to the compiler, `t2t compile`), else JAX's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    platform = getattr(device, "platform", None)
    return platform or jax.default_backend()
