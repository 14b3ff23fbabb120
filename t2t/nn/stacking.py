"""How a stack runs its layers: one by one or scanned, with or without rematerialization.

Two configuration fields of the network choose, and neither changes what is computed:

- `scan_layers`: the layers' parameters are stacked along a leading `layers` axis (logical name
  `t2t.nn.axes.LAYERS`) in one module `layers`, and the stack runs them with `jax.lax.scan`, so
  the program holds one layer's code and compile time stops growing with depth. Unscanned, each
  layer is its own module `layers_{i}` and the loop is unrolled. `stack_layers` /
  `unstack_layers` convert parameter trees between the two layouts exactly.
- `remat_policy`: what the backward pass may keep of a layer's forward pass; the rest is
  recomputed (`jax.checkpoint`). "none" keeps everything XLA wants; "full" keeps only each
  layer's input; "dots" keeps every matmul output; "dots_with_no_batch_dims" keeps the outputs
  of the projections (matmuls without batch dimensions: q/k/v/o, MLP, logits) and recomputes
  attention scores, softmax, norms and activations. Every policy also keeps the attention
  softmax's normalizers (`[B, N, L, 1]`), so recomputing the probabilities reads the logits
  once, not twice.

A third field, `unroll_layers`, keeps the scanned layout's stacked parameters but unrolls the loop
as the unscanned stack does: layer i reads slice i of each stacked parameter (`jnp.split`, whose
gradient is one concatenation per parameter). The program runs as the unscanned one, and the
optimizer updates each stacked parameter at once (`t2t.optim.per_layer`) instead of each layer's
one by one: on an accelerator, 12 times fewer, larger kernels for the update.

Each layer draws its dropout from its own key, split from one key per stack, so the scanned and
the unrolled stacks give the same masks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from t2t.nn import attention_ops, axes
from t2t.pytrees import is_variable

# What every rematerialized layer keeps besides its policy's arrays: the attention softmax's
# normalizer ([B, N, L, 1] per attention; `t2t.nn.attention_ops.SOFTMAX_NORMALIZER`), so the
# backward pass does not read the [B, N, L, S] logits once more to recompute it.
_KEPT = jax.checkpoint_policies.save_only_these_names(attention_ops.SOFTMAX_NORMALIZER)

# remat_policy -> the `jax.checkpoint` policy (None: no rematerialization; "full" keeps only
# the softmax normalizers).
REMAT_POLICIES: dict[str, Callable | None] = {
    "none": None,
    "full": _KEPT,
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.checkpoint_dots, _KEPT
    ),
    "dots_with_no_batch_dims": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable, _KEPT
    ),
}

LAYERS_MODULE = "layers"  # the stacked module's attribute (and path component) when scanned


def layer_name(index: int) -> str:
    """The attribute (and path component) of unscanned layer `index`: "layers_{index}"."""
    return f"layers_{index}"


def stack_modules(modules: Sequence[nnx.Module]) -> nnx.Module:
    """One module of the layers' structure whose every parameter is the layers' stacked [L, ...].

    The stacked parameters carry the logical axis `layers` first. Built from the unscanned
    layers, so a scanned model initializes to exactly the stacked unscanned parameters of the
    same seed.
    """
    graphdef, first = nnx.split(modules[0])
    states = [first] + [nnx.split(m)[1] for m in modules[1:]]

    def stack(*variables):
        head = variables[0]
        names = tuple(head.get_metadata().get("out_sharding") or ())
        value = jnp.stack([v.get_value() for v in variables])  # [L, ...]
        stacked = head.replace(value)
        if names:
            stacked.set_metadata("out_sharding", (axes.LAYERS, *names))
        return stacked

    return nnx.merge(graphdef, jax.tree.map(stack, *states, is_leaf=is_variable))


def unstack_module(module: nnx.Module, count: int) -> list[nnx.Module]:
    """The `count` layers of a stacked module (`stack_modules`), each parameter slice i of the
    stacked one; differentiable, the gradients concatenated back along the `layers` axis."""
    graphdef, state = nnx.split(module)

    def split(variable):
        names = tuple(variable.get_metadata().get("out_sharding") or ())
        slices = []
        for part in jnp.split(variable.get_value(), count):
            layer = variable.replace(jnp.squeeze(part, 0))
            if names:
                layer.set_metadata("out_sharding", names[1:])
            slices.append(layer)
        return slices

    parts = jax.tree.map(split, state, is_leaf=is_variable)
    return [
        nnx.merge(
            graphdef,
            jax.tree.map(lambda p, i=i: p[i], parts, is_leaf=lambda x: isinstance(x, list)),
        )
        for i in range(count)
    ]


def _layer_rngs(rngs: nnx.Rngs | None, count: int) -> jax.Array | None:
    """[count] dropout keys, one per layer, or None without dropout."""
    return None if rngs is None else jax.random.split(rngs.dropout(), count)


def _rngs_of(key: jax.Array | None) -> nnx.Rngs | None:
    return None if key is None else nnx.Rngs(dropout=key)


def apply_layers(
    body: Callable[..., tuple[jax.Array, Any]],
    layers: nnx.Module | Sequence[nnx.Module],
    x: jax.Array,
    *,
    rngs: nnx.Rngs | None,
    remat_policy: str,
    shared: nnx.Module | Sequence[nnx.Module] | None = None,
    num_layers: int,
    unroll: bool = False,
) -> tuple[jax.Array, list[Any]]:
    """Runs `x` through every layer: `x, out_i = body(layer_i, shared_i, x, rngs_i)`.

    Args:
      body: one layer's computation; `shared_i` is None unless `shared` is given, `rngs_i` the
        layer's dropout (None when deterministic); returns the new `x` and anything per layer
        (None when nothing).
      layers: the stacked module (scanned) or the list of layer modules (unrolled).
      x: the carried activations.
      rngs: dropout when given.
      remat_policy: a key of `REMAT_POLICIES`.
      shared: modules laid out like `layers` whose layer i `body` also receives (the encoder
        layers a shared decoder borrows).
      num_layers: L.
      unroll: run a stacked module's layers one by one, each on its slice of the stacked
        parameters (`unroll_layers`), instead of scanning them.

    Returns:
      The final `x` and the per-layer outputs as a list of L entries.
    """
    keys = _layer_rngs(rngs, num_layers)
    policy = REMAT_POLICIES[remat_policy]
    if unroll and isinstance(layers, nnx.Module):
        layers = unstack_module(layers, num_layers)
        if isinstance(shared, nnx.Module):
            shared = unstack_module(shared, num_layers)
    if isinstance(layers, nnx.Module):
        return _scan(body, layers, shared, x, keys, policy, num_layers)
    return _loop(body, layers, shared, x, keys, policy)


def _merged(body: Callable[..., tuple[jax.Array, Any]]) -> Callable[..., tuple[jax.Array, Any]]:
    """`body` over split modules (graph definitions and states), as jax's transforms take them."""

    def pure(layer_graphdef, layer_state, shared_graphdef, shared_state, x, key):
        layer = nnx.merge(layer_graphdef, layer_state)
        borrowed = None if shared_state is None else nnx.merge(shared_graphdef, shared_state)
        return body(layer, borrowed, x, _rngs_of(key))

    return pure


def _scan(body, layers, shared, x, keys, policy, num_layers) -> tuple[jax.Array, list[Any]]:
    """`apply_layers` over a stacked module: one `lax.scan` over its leading axis."""
    pure = _merged(body)
    graphdef, state = nnx.split(layers)
    shared_graphdef, shared_state = (None, None) if shared is None else nnx.split(shared)

    def step(x, inputs):
        layer_state, borrowed_state, key = inputs
        return pure(graphdef, layer_state, shared_graphdef, borrowed_state, x, key)

    if policy is not None:
        step = jax.checkpoint(step, policy=policy, prevent_cse=False)
    x, outputs = jax.lax.scan(step, x, (state, shared_state, keys))
    return x, [jax.tree.map(lambda y, i=i: y[i], outputs) for i in range(num_layers)]


def _loop(body, layers, shared, x, keys, policy) -> tuple[jax.Array, list[Any]]:
    """`apply_layers` over a list of layer modules, one by one."""
    pure = _merged(body)
    outputs = []
    for i, layer in enumerate(layers):
        key = None if keys is None else keys[i]
        borrowed = None if shared is None else shared[i]
        if policy is None:
            x, out = body(layer, borrowed, x, _rngs_of(key))
        else:
            layer_graphdef, layer_state = nnx.split(layer)
            borrowed_graphdef, borrowed_state = (
                (None, None) if borrowed is None else nnx.split(borrowed)
            )
            x, out = jax.checkpoint(pure, policy=policy, static_argnums=(0, 2))(
                layer_graphdef, layer_state, borrowed_graphdef, borrowed_state, x, key
            )
        outputs.append(out)
    return x, outputs


# -- checkpoint layouts ------------------------------------------------------------------------

_STACKS = ("encoder", "decoder")


def _num_layers(stack: Mapping[str, Any]) -> int:
    return sum(1 for key in stack if key.startswith("layers_") and key[7:].isdigit())


def stack_layers(tree: Mapping[str, Any]) -> dict[str, Any]:
    """A parameter tree (nested dicts of arrays, T5X names) from the unscanned layout to the
    scanned one: `encoder/layers_{i}/...` [...] -> `encoder/layers/...` [L, ...] (likewise the
    decoder). Other entries pass unchanged. Exact: values are only moved.
    """
    out = dict(tree)
    for name in _STACKS:
        stack = tree.get(name)
        if not isinstance(stack, Mapping) or LAYERS_MODULE in stack:
            continue
        count = _num_layers(stack)
        if not count:
            continue
        layers = [stack[layer_name(i)] for i in range(count)]
        rest = {k: v for k, v in stack.items() if k not in {layer_name(i) for i in range(count)}}
        out[name] = {**rest, LAYERS_MODULE: jax.tree.map(lambda *xs: _stack(xs), *layers)}
    return out


def unstack_layers(tree: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `stack_layers`: `encoder/layers/...` [L, ...] -> `encoder/layers_{i}/...`."""
    out = dict(tree)
    for name in _STACKS:
        stack = tree.get(name)
        if not isinstance(stack, Mapping) or LAYERS_MODULE not in stack:
            continue
        stacked = stack[LAYERS_MODULE]
        count = jax.tree.leaves(stacked)[0].shape[0]
        rest = {k: v for k, v in stack.items() if k != LAYERS_MODULE}
        out[name] = {
            **rest,
            **{layer_name(i): jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(count)},
        }
    return out


def _stack(values):
    if isinstance(values[0], jax.Array) or not hasattr(values[0], "shape"):
        return jnp.stack(values)
    import numpy as np  # host arrays (a checkpoint read on the host) stay on the host

    return np.stack(values)
