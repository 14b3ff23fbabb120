"""Autoregressive decoding: greedy, temperature sampling (top-k, top-p) and beam search.

Decoding is independent of the network. Every function takes a `tokens_to_logits(tokens [B, 1],
cache) -> (logits [B, V], cache)` callable and its initial cache, and runs one
`jax.lax.while_loop` that writes into preallocated `[B, T]` (or `[B, K, T]`) buffers and stops
early once every sequence has ended. Call the functions under `jax.jit`; they have no Python side
effects.

Cache contract: the cache is a pytree whose every leaf has the batch dimension first. Beam search
expands a cache to `B * K` rows by repeating each row K times, and reorders it by gathering
along axis 0, knowing nothing else about it. One exception: leaves under a dict key `SHARED`
("shared") are per-input constants (e.g. the cross-attention keys and values of the encoded
inputs). Beam search leaves them at B rows, one copy for the K beams of an input, and
`tokens_to_logits` must return them unchanged; a model reading them for `B * K` rows takes row
`r` of the beams from row `r // K` of the shared leaves.

Cache growth: with a `resize_cache(cache, steps)` callable, decoding runs in phases whose
lengths double from `first_cache_length` up to `max_decode_length`, and before each phase asks
for a cache that holds `steps` decoding positions (the phase's end). A model whose attention reads
the whole cache then reads only as many positions as the phase needs, so a step's cost follows
the decoded length instead of the maximum, as with a cache that grows. Without it (the default
for these functions) the cache keeps its size and one `while_loop` runs. Each phase is its own
`while_loop`, compiled separately.

Token conventions (docs/spec.md section 1): decoding starts from token 0 (PAD doubles as the decoder
start token), EOS is 1, and positions after a sequence's EOS hold 0.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

PAD_ID = 0
EOS_ID = 1
# NOTE: a finite "minus infinity" for masked logits and empty beam slots, so sums and softmax
# stay finite (no inf - inf = nan).
NEG_INF = -1.0e7
# The cache key of per-input entries that beam search does not expand (see the cache contract).
SHARED = "shared"

Cache = Any
TokensToLogits = Callable[[jax.Array, Cache], tuple[jax.Array, Cache]]
ResizeCache = Callable[[Cache, int], Cache]
# The first phase's length when the cache grows: at or below it one loop runs. Measured on
# T5-small at batch 16 (benchmarks/cache_growth_bench.py): at 64 positions growing from 32 ran
# 1.04x (greedy) and 1.06x (beam-4) faster, from 16 1.02x and 1.10x; at 256, 1.11x and 1.14-1.17x
# from 16 or 64. Each phase adds its compile time (0.2-0.7 s here), hence not 16.
FIRST_CACHE_LENGTH = 32

METHODS = ("greedy", "beam", "sample")
# Which beam candidates may finish (see `beam_search`): "t5x" as T5X and Mesh TensorFlow (the
# paper's evaluation), "hf" as HF transformers `generate` (the parity tests).
BEAM_RULES = ("t5x", "hf")


# Decoding steps with this many rows (inclusive range) multiply kernel first on the CPU by
# default: a T5-small decode measured 1.35-1.59x faster at 4-16 rows, 1.18-1.22x at 32, but
# 0.96x at 64 (beam-4 of 16 inputs) and 0.95-0.98x at one row (`benchmarks/kernel_first_bench.py`).
KERNEL_FIRST_ROWS = (2, 32)


@dataclasses.dataclass(frozen=True)
class DecodingConfig:
    """How to decode, passed whole from the command line down to the decoding loop.

    Gin files bind it as `t2t.decoding.DecodingConfig.beam_size = 4` (registered at the gin
    edge, `t2t.runs`, which builds it for the run functions); the CLI's decoding flags override
    those bindings. This module itself carries no gin.

    Attributes:
      method: "greedy", "beam" or "sample".
      beam_size, alpha: beam width and GNMT length penalty exponent (the paper: 4 and 0.6).
      beam_rule: which candidates may finish a beam (`BEAM_RULES`, see `beam_search`).
      max_decode_length: output tokens to decode; None: the batch's targets length.
      min_length: EOS is barred before this many tokens.
      temperature, top_k, top_p, seed: sampling (`method="sample"`).
      first_cache_length: the self-attention cache's first phase (speed only; see above).
      kernel_first_steps: whether the decoding steps multiply by copies of the decoder's
        kernels transposed once per decode, kernel first (`t2t.nn.layers.kernel_first_matmul`;
        speed only, the tokens do not change; one extra copy of the decoder's kernels during
        the decode). None (the default) decides per decode (`uses_kernel_first_steps`).
    """

    method: str = "greedy"
    beam_size: int = 4
    alpha: float = 0.6
    beam_rule: str = "t5x"
    max_decode_length: int | None = None
    min_length: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    first_cache_length: int = FIRST_CACHE_LENGTH
    kernel_first_steps: bool | None = None

    def __post_init__(self):
        def positive_int(name, value, allow_none=False):
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Expected {name} to be a positive int, got {value!r}.")

        if self.method not in METHODS:
            raise ValueError(f"Expected method in {METHODS}, got {self.method!r}.")
        if self.beam_rule not in BEAM_RULES:
            raise ValueError(f"Expected beam_rule in {BEAM_RULES}, got {self.beam_rule!r}.")
        positive_int("beam_size", self.beam_size)
        positive_int("first_cache_length", self.first_cache_length)
        positive_int("max_decode_length", self.max_decode_length, allow_none=True)
        if not self.alpha >= 0:
            raise ValueError(f"Expected alpha >= 0, got {self.alpha!r}.")
        if not isinstance(self.min_length, int) or self.min_length < 0:
            raise ValueError(f"Expected min_length to be an int >= 0, got {self.min_length!r}.")
        _validate_sampling(self.temperature, self.top_k, self.top_p, None)
        if self.kernel_first_steps not in (None, True, False):
            raise ValueError(
                "Expected kernel_first_steps None (decide per decode), True or "
                f"False, got {self.kernel_first_steps!r}."
            )

    def uses_kernel_first_steps(self, rows: int, platform: str) -> bool:
        """Whether a decode whose steps have `rows` rows (batch x beams, the whole batch's
        before any data-parallel split) on `platform` ("cpu", "gpu", "tpu": the caller's
        devices) multiplies kernel first: `kernel_first_steps` when set, else on when the
        platform is the CPU and `rows` lies in `KERNEL_FIRST_ROWS`."""
        if self.kernel_first_steps is not None:
            return self.kernel_first_steps
        low, high = KERNEL_FIRST_ROWS
        return platform == "cpu" and low <= rows <= high

    @classmethod
    def of(cls, config: DecodingConfig | None = None, **overrides) -> DecodingConfig:
        """`config` (default: `DecodingConfig()`) with `overrides`, fields of DecodingConfig.

        Raises:
          ValueError: for a name that is not a field, with the closest ones.
        """
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            close = {n: difflib.get_close_matches(n, fields, n=1) for n in unknown}
            hints = "; ".join(f"{n!r}: did you mean {c[0]!r}?" for n, c in close.items() if c)
            raise ValueError(
                f"Unknown decoding option(s) {unknown}{' (' + hints + ')' if hints else ''}; "
                f"DecodingConfig's fields are {fields}."
            )
        return dataclasses.replace(config if config is not None else cls(), **overrides)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeLoop:
    """What a decoding loop is given besides its step function and cache: how long, when to
    stop, how to start, and how its cache grows. `greedy`, `sample` and `beam_search` take one
    (`loop=`) or its fields as keywords (`max_decode_length=8, min_length=2`)."""

    max_decode_length: int
    """T, the number of positions decoded at most."""
    eos_id: int = EOS_ID
    """The token that ends a sequence."""
    min_length: int = 0
    """EOS is suppressed at positions `< min_length` (forces that many tokens)."""
    start_tokens: jax.Array | None = None
    """[B] the first token fed to the model; default PAD (the T5 start token)."""
    prompt: jax.Array | None = None
    """Optional [B, T] tokens forced at positions `< prompt_lengths` (decoder-only models fed
    their prompt one step at a time); they are copied into the output. Not for beam search."""
    prompt_lengths: jax.Array | None = None
    """[B] number of forced prompt positions per row."""
    resize_cache: ResizeCache | None = None
    """`(cache, steps) -> cache` holding `steps` decoding positions: decode in phases of a
    growing cache (see the module docstring); None keeps the cache as given."""
    first_cache_length: int = FIRST_CACHE_LENGTH
    """The first phase's length when `resize_cache` is given."""

    @classmethod
    def of(cls, loop: DecodeLoop | None = None, **fields) -> DecodeLoop:
        """`loop` with `fields` over it, or a new loop of `fields`.

        Raises:
          ValueError: for a name that is not a field (with the closest one), or without
            `max_decode_length`.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(fields) - set(names))
        if unknown:
            close = {n: difflib.get_close_matches(n, names, n=1) for n in unknown}
            hints = "; ".join(f"{n!r}: did you mean {c[0]!r}?" for n, c in close.items() if c)
            raise TypeError(
                f"Unknown decoding loop option(s) {unknown}{' (' + hints + ')' if hints else ''}"
                f"; DecodeLoop's fields are {names}."
            )
        if loop is not None:
            return dataclasses.replace(loop, **fields)
        if "max_decode_length" not in fields:
            raise TypeError("A decoding loop needs max_decode_length.")
        return cls(**fields)


def cache_batch_size(cache: Cache) -> int:
    """The batch size B shared by every leaf of a cache (the leading dimension)."""
    leaves = jax.tree_util.tree_leaves(cache)
    if not leaves:
        raise ValueError("Expected a cache with at least one array leaf, got an empty pytree.")
    sizes = {leaf.shape[0] if np.ndim(leaf) else None for leaf in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            "Expected every cache leaf to have the batch dimension first (one shared leading "
            f"size), got leading sizes {sorted(map(str, sizes))}. See the cache contract in "
            "t2t/decoding.py."
        )
    return sizes.pop()


def _start_tokens(start_tokens: jax.Array | None, batch_size: int) -> jax.Array:
    if start_tokens is None:
        return jnp.full((batch_size,), PAD_ID, jnp.int32)
    start_tokens = jnp.asarray(start_tokens, jnp.int32)
    if start_tokens.shape != (batch_size,):
        raise ValueError(
            f"Expected start_tokens of shape [B] = ({batch_size},) to match the cache, got "
            f"{start_tokens.shape}."
        )
    return start_tokens


def _suppress_eos(logits: jax.Array, suppress: jax.Array, eos_id: int) -> jax.Array:
    """Sets the EOS logit to NEG_INF where `suppress` (scalar or [B]) holds.

    NOTE: a select against a column mask, not `.at[:, eos_id].set`: the select fuses into the
    consumers of the logits, while the in-place update made XLA copy the [B, V] logits three
    times per decoding step (measured on CPU: 0.4 ms of a 25 ms T5-small step at B = 16).
    """
    rows = jnp.reshape(suppress, (-1, 1))  # [B, 1] or [1, 1]
    is_eos = jnp.arange(logits.shape[-1]) == eos_id  # [V]
    return jnp.where(rows & is_eos, jnp.asarray(NEG_INF, logits.dtype), logits)


_TOP_K_CHUNK = 128


def chunked_top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`jax.lax.top_k` over the last axis of [R, V], computed through chunk maxima.

    The k largest entries of a row lie in the k chunks (of 128 consecutive entries) with the
    largest maxima, so one cheap max-reduction over [R, V / 128, 128] picks the chunks and the
    exact top-k runs on [R, k * 128] only. Ties resolve like `lax.top_k` (lower index first):
    chunks are ranked with lower index first among equal maxima and gathered in index order.

    NOTE: on CPU this is 5-15x faster than `lax.top_k` or `jnp.argmax` over a 32k vocabulary,
    which matters once per decoding step.

    Returns:
      values [R, k] (descending) and indices [R, k] int32.
    """
    rows, vocab = x.shape
    if vocab < 4 * k * _TOP_K_CHUNK:
        return jax.lax.top_k(x, k)
    pad = (-vocab) % _TOP_K_CHUNK
    if pad:
        x = jnp.pad(x, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    chunks = x.reshape(rows, -1, _TOP_K_CHUNK)  # [R, G, 128] (G groups of 128)
    _, chunk_ids = jax.lax.top_k(jnp.max(chunks, axis=-1), k)  # [R, k]
    chunk_ids = jnp.sort(chunk_ids, axis=-1)
    candidates = jnp.take_along_axis(chunks, chunk_ids[:, :, None], axis=1)  # [R, k, 128]
    values, positions = jax.lax.top_k(candidates.reshape(rows, -1), k)  # [R, k]
    chunk = jnp.take_along_axis(chunk_ids, positions // _TOP_K_CHUNK, axis=1)
    return values, (chunk * _TOP_K_CHUNK + positions % _TOP_K_CHUNK).astype(jnp.int32)


def _argmax(logits: jax.Array) -> jax.Array:
    """[B, V] -> [B] index of the largest logit, the lowest index among ties (as jnp.argmax)."""
    return chunked_top_k(logits, 1)[1][:, 0]


# ---------------------------------------------------------------------------------------------
# Greedy decoding and sampling share one loop; they differ in how a token is chosen.


class _SamplingState(NamedTuple):
    step: jax.Array  # [] int32: index of the position written next.
    tokens: jax.Array  # [B] int32: the token fed to the model at this step.
    sequences: jax.Array  # [B, T] int32: the output buffer.
    done: jax.Array  # [B] bool: the row has produced EOS.
    cache: Cache


def _validate_lengths(max_decode_length: int, min_length: int) -> None:
    if max_decode_length < 1:
        raise ValueError(f"Expected max_decode_length >= 1, got {max_decode_length}.")
    if not 0 <= min_length <= max_decode_length:
        raise ValueError(
            f"Expected 0 <= min_length <= max_decode_length ({max_decode_length}), got "
            f"{min_length}."
        )


def cache_lengths(max_decode_length: int, first_cache_length: int) -> tuple[int, ...]:
    """The phase ends of a growing cache: first, 2 * first, 4 * first, ... then the maximum.

    >>> cache_lengths(256, 32)
    (32, 64, 128, 256)
    >>> cache_lengths(100, 64)
    (64, 100)
    """
    if first_cache_length < 1:
        raise ValueError(f"Expected first_cache_length >= 1, got {first_cache_length}.")
    ends, length = [], first_cache_length
    while length < max_decode_length:
        ends.append(length)
        length *= 2
    return tuple(ends) + (max_decode_length,)


def _run_phases(
    cond: Callable[[Any], jax.Array],
    body: Callable[[Any], Any],
    initial: Any,
    *,
    max_decode_length: int,
    resize_cache: ResizeCache | None,
    first_cache_length: int,
) -> Any:
    """`jax.lax.while_loop(cond, body, initial)`, in phases of a growing cache when asked.

    `initial` is a NamedTuple with `step` (the next position) and `cache` fields.
    """
    ends = cache_lengths(max_decode_length, first_cache_length)  # Validates the first length.
    if resize_cache is None:
        return jax.lax.while_loop(cond, body, initial)
    state = initial
    for end in ends:
        state = state._replace(cache=resize_cache(state.cache, end))
        state = jax.lax.while_loop(
            lambda s, end=end: jnp.logical_and(s.step < end, cond(s)), body, state
        )
    return state


def _prompt_arrays(
    prompt: jax.Array | None, prompt_lengths: jax.Array | None, batch_size: int, length: int
) -> tuple[jax.Array, jax.Array]:
    if prompt is None:
        return jnp.zeros((batch_size, length), jnp.int32), jnp.zeros((batch_size,), jnp.int32)
    prompt = jnp.asarray(prompt, jnp.int32)
    if prompt.shape != (batch_size, length) or prompt_lengths is None:
        raise ValueError(
            f"Expected prompt of shape [B, T] = ({batch_size}, {length}) together with "
            f"prompt_lengths [B], got prompt {prompt.shape} and prompt_lengths {prompt_lengths}."
        )
    return prompt, jnp.asarray(prompt_lengths, jnp.int32)


def _decode_loop(
    tokens_to_logits: TokensToLogits,
    cache: Cache,
    choose: Callable[[jax.Array, jax.Array], jax.Array],
    loop: DecodeLoop,
) -> jax.Array:
    """Runs `choose(logits [B, V], step) -> tokens [B]` until EOS or the length limit."""
    max_decode_length, min_length, eos_id = loop.max_decode_length, loop.min_length, loop.eos_id
    _validate_lengths(max_decode_length, min_length)
    batch_size = cache_batch_size(cache)
    prompt, prompt_lengths = _prompt_arrays(
        loop.prompt, loop.prompt_lengths, batch_size, max_decode_length
    )

    def cond(state: _SamplingState) -> jax.Array:
        return jnp.logical_and(state.step < max_decode_length, ~jnp.all(state.done))

    def body(state: _SamplingState) -> _SamplingState:
        logits, cache = tokens_to_logits(state.tokens[:, None], state.cache)  # [B, V]
        logits = _suppress_eos(logits, state.step < min_length, eos_id)
        chosen = choose(logits.astype(jnp.float32), state.step)
        forced = state.step < prompt_lengths  # [B]
        token = jnp.where(forced, prompt[:, state.step], chosen)
        token = jnp.where(state.done, PAD_ID, token).astype(jnp.int32)
        sequences = jax.lax.dynamic_update_slice(state.sequences, token[:, None], (0, state.step))
        done = state.done | (~forced & (token == eos_id))
        return _SamplingState(state.step + 1, token, sequences, done, cache)

    initial = _SamplingState(
        step=jnp.array(0, jnp.int32),
        tokens=_start_tokens(loop.start_tokens, batch_size),
        sequences=jnp.zeros((batch_size, max_decode_length), jnp.int32),
        done=jnp.zeros((batch_size,), bool),
        cache=cache,
    )
    final = _run_phases(
        cond,
        body,
        initial,
        max_decode_length=max_decode_length,
        resize_cache=loop.resize_cache,
        first_cache_length=loop.first_cache_length,
    )
    return final.sequences


def greedy(
    tokens_to_logits: TokensToLogits, cache: Cache, loop: DecodeLoop | None = None, **fields
) -> jax.Array:
    """Greedy decoding: the most likely token at every step.

    Args:
      tokens_to_logits: `(tokens [B, 1], cache) -> (logits [B, V], cache)`.
      cache: the initial cache (every leaf `[B, ...]`).
      loop: the loop's length, stopping, start and cache growth (`DecodeLoop`); or
      **fields: its fields, e.g. `max_decode_length=8, min_length=2` (over `loop`'s).

    Returns:
      [B, T] int32 tokens; each row ends at its EOS, zeros after.
    """
    loop = DecodeLoop.of(loop, **fields)
    return _decode_loop(tokens_to_logits, cache, lambda logits, step: _argmax(logits), loop)


def top_k_filter(logits: jax.Array, k: int) -> jax.Array:
    """Keeps the k largest logits of each row (ties at the k-th value kept), NEG_INF elsewhere.

    Example: logits [1, 3, 2, 0] with k = 2 -> [NEG_INF, 3, 2, NEG_INF].
    """
    kth_largest = chunked_top_k(logits, k)[0][..., -1:]  # [B, 1]
    return jnp.where(logits < kth_largest, NEG_INF, logits)


def top_p_filter(logits: jax.Array, p: float) -> jax.Array:
    """Nucleus filter: keeps the smallest set of most likely tokens whose mass is >= p.

    Example: probabilities [0.1, 0.5, 0.3, 0.1] with p = 0.7 keep tokens 1 and 2 (0.5 + 0.3 >=
    0.7, while 0.5 alone is not); p = 0.85 adds both 0.1 tokens (ties at the smallest kept
    probability are all kept).
    """
    sorted_logits = -jnp.sort(-logits, axis=-1)  # [B, V], descending
    sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs  # [B, V]
    # The first token is always kept; a token is kept while the mass before it is < p.
    kept = jnp.logical_or(mass_before < p, jnp.arange(logits.shape[-1]) == 0)
    threshold = jnp.min(jnp.where(kept, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits < threshold, NEG_INF, logits)


def _validate_sampling(temperature: float, top_k: int, top_p: float, vocab: int | None) -> None:
    if temperature < 0:
        raise ValueError(f"Expected temperature >= 0 (0 means greedy), got {temperature}.")
    if top_k < 0 or (vocab is not None and top_k > vocab):
        raise ValueError(f"Expected 0 <= top_k <= vocab size (0 disables it), got {top_k}.")
    if not 0 < top_p <= 1:
        raise ValueError(f"Expected 0 < top_p <= 1 (1 disables it), got {top_p}.")


def sample(
    tokens_to_logits: TokensToLogits,
    cache: Cache,
    rng: jax.Array,
    loop: DecodeLoop | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    **fields,
) -> jax.Array:
    """Temperature sampling, optionally restricted to the top-k tokens and/or the top-p nucleus.

    Logits are divided by the temperature, then filtered by top-k, then by top-p. Temperature 0
    is greedy decoding. Step t draws with `jax.random.fold_in(rng, t)`, so the same rng gives the
    same output.

    Args:
      tokens_to_logits, cache, loop, fields: as for `greedy`.
      rng: a PRNG key.
      temperature: softmax temperature (> 0), or 0 for argmax.
      top_k: sample among the k most likely tokens; 0 disables the filter.
      top_p: sample among the smallest set of tokens with mass >= top_p; 1 disables it.

    Returns:
      [B, T] int32 tokens; each row ends at its EOS, zeros after.
    """
    loop = DecodeLoop.of(loop, **fields)
    _validate_sampling(temperature, top_k, top_p, None)

    def choose(logits: jax.Array, step: jax.Array) -> jax.Array:
        if temperature == 0:
            return _argmax(logits)
        logits = logits / temperature
        if top_k:
            _validate_sampling(temperature, top_k, top_p, logits.shape[-1])
            logits = top_k_filter(logits, top_k)
        if top_p < 1:
            logits = top_p_filter(logits, top_p)
        return jax.random.categorical(jax.random.fold_in(rng, step), logits, axis=-1)

    return _decode_loop(tokens_to_logits, cache, choose, loop)


# ---------------------------------------------------------------------------------------------
# Beam search.


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT length penalty ((5 + length) / 6) ** alpha; beam scores are log_prob / penalty."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def _is_shared(path) -> bool:
    return any(isinstance(key, jax.tree_util.DictKey) and key.key == SHARED for key in path)


def expand_cache(cache: Cache, beam_size: int) -> Cache:
    """Repeats each batch row of every leaf K times: [B, ...] -> [B * K, ...] (row b*K + k).

    Leaves under a `SHARED` key stay [B, ...]: the K beams of an input read the same row.
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: leaf if _is_shared(path) else jnp.repeat(leaf, beam_size, axis=0),
        cache,
    )


def _slots_keeping_parents(parents: jax.Array) -> jax.Array:
    """Assigns the K new beams of each row to cache slots so that few slots must be rewritten.

    The first child of a parent takes over its parent's slot (whose cache is already right);
    the other children take, in order, the slots of parents that left no child.

    Example: parents [2, 2, 0, 2] (slots 1 and 3 left no child) -> slots [2, 1, 0, 3].

    Args:
      parents: [B, K] the parent slot of each new beam.

    Returns:
      [B, K] the slot of each new beam (a permutation of 0..K-1 per row).
    """
    beam_size = parents.shape[1]
    same_parent = parents[:, :, None] == parents[:, None, :]  # [B, K, K]
    earlier = jnp.tril(jnp.ones((beam_size, beam_size), bool), -1)
    is_first = ~jnp.any(same_parent & earlier, axis=2)  # [B, K]
    has_child = jnp.any(parents[:, :, None] == jnp.arange(beam_size), axis=1)  # [B, K] slots
    free_slots = jnp.argsort(has_child, axis=1, stable=True)  # childless slots first
    extra_rank = jnp.maximum(jnp.cumsum(~is_first, axis=1) - 1, 0)
    return jnp.where(is_first, parents, jnp.take_along_axis(free_slots, extra_rank, axis=1))


def _copy_cache_rows(old: Cache, new: Cache, sources: jax.Array) -> Cache:
    """Rewrites each slot whose beam descends from another slot: row b*K+k <- row b*K+sources.

    Sources are slots kept by their own first child (see `_slots_keeping_parents`), so they are
    never overwritten and the copies may run in place, in any order. Only the rows that change
    are copied (typically a fifth of them), instead of gathering the whole cache every step.

    NOTE: leaves under a `SHARED` key, and any leaf that `tokens_to_logits` returned unchanged
    (the same traced array), are left as is: beams only move within their batch entry, which
    holds one shared copy, or K equal copies since `expand_cache`.

    Args:
      old: the cache given to `tokens_to_logits` (to recognize unchanged leaves).
      new: the cache it returned, leaves [B * K, ...].
      sources: [B, K] the slot each slot's beam continues.
    """
    batch_size, beam_size = sources.shape
    targets = jnp.arange(batch_size * beam_size)
    origins = (jnp.arange(batch_size)[:, None] * beam_size + sources).reshape(-1)
    moves = origins != targets
    order = jnp.argsort(~moves, stable=True)  # the rows to rewrite first
    targets, origins = targets[order], origins[order]

    old_leaves = jax.tree_util.tree_leaves(old)
    paths_and_leaves, treedef = jax.tree_util.tree_flatten_with_path(new)
    new_leaves = [leaf for _, leaf in paths_and_leaves]
    changed = [
        i
        for i, (path, leaf) in enumerate(paths_and_leaves)
        if leaf is not old_leaves[i] and not _is_shared(path)
    ]

    def copy_row(i, leaves):
        return [
            jax.lax.dynamic_update_index_in_dim(
                leaf, jax.lax.dynamic_index_in_dim(leaf, origins[i], 0), targets[i], 0
            )
            for leaf in leaves
        ]

    copied = jax.lax.fori_loop(0, jnp.sum(moves), copy_row, [new_leaves[i] for i in changed])
    for i, leaf in zip(changed, copied):
        new_leaves[i] = leaf
    return jax.tree_util.tree_unflatten(treedef, new_leaves)


class _BeamState(NamedTuple):
    step: jax.Array  # [] int32: index of the position written next.
    alive_tokens: jax.Array  # [B, K] int32: the token each live beam feeds next.
    alive_seqs: jax.Array  # [B, K, T] int32
    alive_log_probs: jax.Array  # [B, K] float32: sum of log-probs; NEG_INF for empty slots.
    finished_seqs: jax.Array  # [B, K, T] int32
    finished_scores: jax.Array  # [B, K] float32: length-penalized; NEG_INF for empty slots.
    cache: Cache  # leaves [B * K, ...], shared leaves [B, ...]


def _take_beams(values: jax.Array, indices: jax.Array) -> jax.Array:
    """Gathers along the beam axis: values [B, M, ...], indices [B, K] -> [B, K, ...]."""
    indices = indices.reshape(indices.shape + (1,) * (values.ndim - 2))
    return jnp.take_along_axis(values, indices, axis=1)


def _beam_done(state: _BeamState, alpha: float, max_decode_length: int) -> jax.Array:
    """[B] True where no live beam can still beat the worst of the K finished ones.

    NOTE: log-probs only fall as a beam grows and the penalty grows with length (alpha >= 0), so
    a live beam's best possible final score is its log-prob divided by the largest penalty.
    """
    best_alive = jnp.max(state.alive_log_probs, axis=1) / length_penalty(max_decode_length, alpha)
    worst_finished = jnp.min(state.finished_scores, axis=1)
    return best_alive <= worst_finished


def _beam_step(
    state: _BeamState,
    tokens_to_logits: TokensToLogits,
    *,
    alpha: float,
    max_decode_length: int,
    eos_id: int,
    min_length: int,
    rule: str,
) -> _BeamState:
    """One step of beam search: expand every live beam by every token, keep the best."""
    batch_size, beam_size = state.alive_log_probs.shape
    logits, cache = tokens_to_logits(state.alive_tokens.reshape(-1, 1), state.cache)
    logits = logits.astype(jnp.float32)
    # The model's own normalizer: barring EOS below min_length removes candidates but does not
    # renormalize, so beam scores stay the model's log-likelihoods (as HF's min-length rule).
    log_normalizer = jax.nn.logsumexp(logits, axis=-1, keepdims=True)  # [B * K, 1]
    logits = _suppress_eos(logits, state.step < min_length, eos_id)
    vocab = logits.shape[-1]
    if vocab < 2 * beam_size:
        raise ValueError(f"Expected a vocabulary of at least 2K = {2 * beam_size}, got {vocab}.")
    # NOTE: 2K candidates guarantee K that do not end in EOS, to keep K beams alive. The best 2K
    # of all K * V continuations are among each beam's own best 2K tokens, so the search runs on
    # [B * K, 2K] per-beam winners instead of log-softmaxing and sorting [B, K * V].
    beam_logits, beam_tokens = chunked_top_k(logits, 2 * beam_size)  # [B * K, 2K]
    token_log_probs = beam_logits - log_normalizer
    candidates = state.alive_log_probs[..., None] + token_log_probs.reshape(
        batch_size, beam_size, 2 * beam_size
    )  # [B, K, 2K]
    top_log_probs, top_indices = jax.lax.top_k(candidates.reshape(batch_size, -1), 2 * beam_size)
    parents = top_indices // (2 * beam_size)  # [B, 2K]
    tokens = jnp.take_along_axis(beam_tokens.reshape(batch_size, -1), top_indices, axis=1)
    seqs = _take_beams(state.alive_seqs, parents)  # [B, 2K, T]
    seqs = jax.lax.dynamic_update_slice(seqs, tokens[..., None], (0, 0, state.step))

    # Live beams: the best K candidates that did not end, placed in slots near their parents.
    ended = tokens == eos_id
    alive_candidates = jnp.where(ended, NEG_INF, top_log_probs)  # [B, 2K]
    _, keep = jax.lax.top_k(alive_candidates, beam_size)  # [B, K]
    slots = _slots_keeping_parents(_take_beams(parents, keep))
    keep = _take_beams(keep, jnp.argsort(slots, axis=1))  # [B, K] the candidate in each slot

    # Finished beams: the best K among those finished before and the candidates ending now.
    # NOTE: the "t5x" rule lets any of the 2K candidates finish, by EOS only. The "hf" rule lets
    # only the K best finish (as if the K best were selected and those ending moved aside, so
    # width 1 with alpha 0 is greedy), by EOS or by reaching the length limit.
    if rule == "hf":
        ended = jnp.logical_or(ended, state.step == max_decode_length - 1)
        ended = jnp.logical_and(ended, jnp.arange(2 * beam_size) < beam_size)
    scores = top_log_probs / length_penalty(state.step + 1, alpha)
    scores = jnp.where(jnp.logical_and(ended, top_log_probs > NEG_INF / 2), scores, NEG_INF)
    finished_scores, pick = jax.lax.top_k(
        jnp.concatenate([state.finished_scores, scores], axis=1), beam_size
    )
    finished_seqs = _take_beams(jnp.concatenate([state.finished_seqs, seqs], axis=1), pick)

    return _BeamState(
        step=state.step + 1,
        alive_tokens=_take_beams(tokens, keep),
        alive_seqs=_take_beams(seqs, keep),
        alive_log_probs=_take_beams(alive_candidates, keep),
        finished_seqs=finished_seqs,
        finished_scores=finished_scores,
        cache=_copy_cache_rows(state.cache, cache, _take_beams(parents, keep)),
    )


def beam_search(
    tokens_to_logits: TokensToLogits,
    cache: Cache,
    loop: DecodeLoop | None = None,
    *,
    beam_size: int,
    alpha: float = 0.6,
    rule: str = "t5x",
    **fields,
) -> tuple[jax.Array, jax.Array]:
    """Beam search with the GNMT length penalty (docs/spec.md section 8).

    A finished sequence of n tokens (its EOS included) with log-probability lp scores
    `lp / ((5 + n) / 6) ** alpha`. Each step ranks the 2K best continuations of the K live beams;
    the K best of those not ending in EOS live on. Which candidates finish depends on `rule`:

    - "t5x" (T5X, Mesh TensorFlow; the paper's evaluation): any of the 2K candidates ending in
      EOS. A beam reaching `max_decode_length` without EOS does not finish; a row with no
      finished beam at all returns its live beams, scored by log-probability without penalty.
    - "hf" (HF transformers `generate`): only those among the K best candidates ending in EOS,
      and every beam alive at `max_decode_length`, penalized as if it had ended there.

    The two can return different beams: e.g. a short sequence ranked K+1..2K by a step finishes
    under "t5x" only. The search stops for all rows when no live beam of any row can still beat
    that row's K-th best finished beam.

    Args:
      tokens_to_logits: `(tokens [B * K, 1], cache) -> (logits [B * K, V], cache)`.
      cache: the initial cache with leaves `[B, ...]`; it is expanded to `[B * K, ...]` here,
        except the leaves under a `SHARED` key.
      loop, fields: as for `greedy`, without a prompt: the length T, EOS, `min_length` (EOS
        suppressed before it; scores stay the model's log-likelihoods, the other tokens'
        probabilities are not renormalized), start tokens and cache growth (the cache given to
        `resize_cache` has `B * K` rows).
      beam_size: K.
      alpha: length penalty exponent (>= 0); 0 ranks by log-probability alone.
      rule: "t5x" or "hf", which candidates may finish (above).

    Returns:
      sequences [B, K, T] int32 (zeros after EOS) and scores [B, K] float32, best first.
    """
    loop = DecodeLoop.of(loop, **fields)
    if loop.prompt is not None:
        raise ValueError("Beam search takes no forced prompt; decode it greedily or by sampling.")
    max_decode_length, min_length, eos_id = loop.max_decode_length, loop.min_length, loop.eos_id
    _validate_lengths(max_decode_length, min_length)
    if beam_size < 1 or alpha < 0:
        raise ValueError(f"Expected beam_size >= 1 and alpha >= 0, got {beam_size}, {alpha}.")
    if rule not in BEAM_RULES:
        raise ValueError(f"Expected rule in {BEAM_RULES}, got {rule!r}.")
    initial = _initial_beams(cache, loop.start_tokens, beam_size, max_decode_length)

    def cond(state: _BeamState) -> jax.Array:
        not_done = ~jnp.all(_beam_done(state, alpha, max_decode_length))
        return jnp.logical_and(state.step < max_decode_length, not_done)

    def body(state: _BeamState) -> _BeamState:
        return _beam_step(
            state,
            tokens_to_logits,
            alpha=alpha,
            max_decode_length=max_decode_length,
            eos_id=eos_id,
            min_length=min_length,
            rule=rule,
        )

    final = _run_phases(
        cond,
        body,
        initial,
        max_decode_length=max_decode_length,
        resize_cache=loop.resize_cache,
        first_cache_length=loop.first_cache_length,
    )
    if rule == "hf":
        return final.finished_seqs, final.finished_scores
    return _finished_else_live(final)


def _initial_beams(cache: Cache, start_tokens, beam_size: int, length: int) -> _BeamState:
    """The search's start: K copies of each row, only the first live (so the K beams differ
    from step 1), nothing finished, the cache expanded to `B * K` rows."""
    batch_size = cache_batch_size(cache)
    start = _start_tokens(start_tokens, batch_size)
    empty = jnp.full((batch_size, beam_size), NEG_INF, jnp.float32)
    return _BeamState(
        step=jnp.array(0, jnp.int32),
        alive_tokens=jnp.repeat(start[:, None], beam_size, axis=1),
        alive_seqs=jnp.zeros((batch_size, beam_size, length), jnp.int32),
        alive_log_probs=empty.at[:, 0].set(0.0),
        finished_seqs=jnp.zeros((batch_size, beam_size, length), jnp.int32),
        finished_scores=empty,
        cache=expand_cache(cache, beam_size),
    )


def _finished_else_live(final: _BeamState) -> tuple[jax.Array, jax.Array]:
    """The "t5x" rule's result: each row's finished beams, or where nothing finished, its live
    beams, best first, scored by log-probability without penalty."""
    none_finished = jnp.all(final.finished_scores <= NEG_INF / 2, axis=1)  # [B]
    order = jnp.argsort(-final.alive_log_probs, axis=1)
    live_seqs = _take_beams(final.alive_seqs, order)
    live_scores = _take_beams(final.alive_log_probs, order)
    return (
        jnp.where(none_finished[:, None, None], live_seqs, final.finished_seqs),
        jnp.where(none_finished[:, None], live_scores, final.finished_scores),
    )


# ---------------------------------------------------------------------------------------------
# Ensembles (paper section 3.6).


def ensemble_tokens_to_logits(fns: Sequence[TokensToLogits]) -> TokensToLogits:
    """Combines N models into one `tokens_to_logits` whose logits are the mean of theirs.

    The ensemble's cache is the tuple of the N caches (every leaf still batch-first, so beam
    search expands and reorders it like any cache). The paper ensembles by averaging logits
    before the softmax.

    Args:
      fns: the N models' `tokens_to_logits`.

    Returns:
      `(tokens [B, 1], (cache_1, ..., cache_N)) -> (mean logits [B, V], (new caches))`.
    """
    fns = tuple(fns)
    if not fns:
        raise ValueError("Expected at least one tokens_to_logits to ensemble, got none.")

    def tokens_to_logits(tokens: jax.Array, caches: tuple[Cache, ...]) -> tuple[jax.Array, Any]:
        if not isinstance(caches, tuple) or len(caches) != len(fns):
            raise ValueError(
                f"Expected the ensemble cache to be a tuple of {len(fns)} caches, one per model, "
                f"got {type(caches).__name__} of length {len(caches)}."
            )
        outputs = [fn(tokens, cache) for fn, cache in zip(fns, caches)]
        logits = jnp.mean(jnp.stack([o[0].astype(jnp.float32) for o in outputs]), axis=0)
        return logits, tuple(o[1] for o in outputs)

    return tokens_to_logits
