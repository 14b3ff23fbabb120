"""Decoding on stub `tokens_to_logits` with known answers: greedy, sampling filters, beam search
(length penalty changing the winner, rows finishing at different steps), ensembles."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t import decoding

PAD, EOS, A, B = 0, 1, 2, 3
TINY = 1e-6  # probability of the tokens a hand-made table does not mention


def _table(rows):
    """rows: per batch row, {last_token: {next_token: prob}} -> log-prob table [R, V, V]."""
    vocab = 4
    table = np.full((len(rows), vocab, vocab), TINY)
    for r, transitions in enumerate(rows):
        for last, nexts in transitions.items():
            for token, prob in nexts.items():
                table[r, last, token] = prob
    table /= table.sum(-1, keepdims=True)
    return np.log(table).astype(np.float32)


def _markov(table, calls=None):
    """A Markov stub: next-token log-probs depend on the batch row and the last token only."""
    table = jnp.asarray(table)

    def count(step):
        calls.append(int(step))

    def tokens_to_logits(tokens, cache):
        if calls is not None:
            jax.debug.callback(count, cache["index"][0])
        logits = table[cache["row"], tokens[:, 0]]  # [B, V]
        return logits, {"row": cache["row"], "index": cache["index"] + 1}

    return tokens_to_logits


def _cache(batch_size):
    return {"row": jnp.arange(batch_size), "index": jnp.zeros(batch_size, jnp.int32)}


# Row 0: EOS first (0.45) or "A" (0.55) and then EOS (0.8). Greedy takes A EOS; ranked by
# log-probability alone [EOS] wins (log .45 = -0.799 > log .55 + log .8 = -0.821); the GNMT
# penalty with alpha = 1 divides by 1 and 7/6 and makes A EOS win (-0.704 > -0.799).
# Row 1: A, B, EOS with probability 0.9 each: it finishes two steps after row 0.
ROWS = [
    {PAD: {EOS: 0.45, A: 0.55}, A: {EOS: 0.8, A: 0.2}, B: {EOS: 1.0}},
    {PAD: {A: 0.9, B: 0.1}, A: {B: 0.9, A: 0.1}, B: {EOS: 0.9, A: 0.1}},
]


def test_greedy_rows_end_at_their_own_eos_and_loop_stops():
    calls = []
    out = decoding.greedy(_markov(_table(ROWS), calls), _cache(2), max_decode_length=6)
    jax.effects_barrier()
    np.testing.assert_array_equal(out, [[A, EOS, 0, 0, 0, 0], [A, B, EOS, 0, 0, 0]])
    assert len(calls) == 3  # Stopped once both rows had ended, not after 6 steps.


def test_greedy_min_length_suppresses_eos():
    out = decoding.greedy(_markov(_table(ROWS)), _cache(2), max_decode_length=4, min_length=4)
    assert not np.any(np.asarray(out) == EOS)
    assert np.all(np.asarray(out) != PAD)


def test_min_length_suppresses_eos_only_before_it():
    # Row 0 would end at position 1 (A EOS); with EOS barred there it takes A (0.2) and ends at
    # position 2. Row 1 ends at position 2 anyway.
    out = decoding.greedy(_markov(_table(ROWS)), _cache(2), max_decode_length=4, min_length=2)
    np.testing.assert_array_equal(out, [[A, A, EOS, 0], [A, B, EOS, 0]])
    # Beam search: the one-token [EOS] of row 0 (its best beam at alpha 0) is barred, so both
    # beams of row 0 have at least two tokens: A A EOS (0.55 x 0.2 x 0.8) comes first.
    seqs, scores = decoding.beam_search(
        _markov(_table(ROWS)),
        _cache(2),
        beam_size=2,
        max_decode_length=4,
        alpha=0.0,
        min_length=2,
    )
    np.testing.assert_array_equal(seqs[0, 0], [A, A, EOS, 0])
    np.testing.assert_allclose(scores[0, 0], math.log(0.55 * 0.2 * 0.8), atol=1e-4)
    assert np.all(np.asarray(seqs)[..., :2] != EOS)


def test_greedy_forces_prompt_tokens():
    prompt = jnp.array([[B, A, 0, 0, 0], [0, 0, 0, 0, 0]])
    out = decoding.greedy(
        _markov(_table(ROWS)),
        _cache(2),
        max_decode_length=5,
        prompt=prompt,
        prompt_lengths=jnp.array([2, 0]),
    )
    # Row 0 continues from "B A" with A's best next token, EOS.
    np.testing.assert_array_equal(out, [[B, A, EOS, 0, 0], [A, B, EOS, 0, 0]])


def test_beam_search_length_penalty_changes_the_winner():
    table = _table(ROWS)
    seqs, scores = decoding.beam_search(
        _markov(table), _cache(2), beam_size=2, max_decode_length=5, alpha=0.0
    )
    np.testing.assert_array_equal(seqs[0, 0], [EOS, 0, 0, 0, 0])
    np.testing.assert_array_equal(seqs[0, 1], [A, EOS, 0, 0, 0])
    np.testing.assert_allclose(scores[0], [math.log(0.45), math.log(0.55 * 0.8)], atol=1e-4)

    seqs, scores = decoding.beam_search(
        _markov(table), _cache(2), beam_size=2, max_decode_length=5, alpha=1.0
    )
    np.testing.assert_array_equal(seqs[0, 0], [A, EOS, 0, 0, 0])
    np.testing.assert_allclose(
        scores[0], [math.log(0.55 * 0.8) / (7 / 6), math.log(0.45)], atol=1e-4
    )
    # Row 1 finishes two steps later: A B EOS scores 3 log 0.9 / ((5 + 3) / 6).
    np.testing.assert_array_equal(seqs[1, 0], [A, B, EOS, 0, 0])
    assert scores[1, 0] == pytest.approx(3 * math.log(0.9) / (8 / 6), abs=1e-4)


def test_beam_search_rows_finishing_at_different_steps_default_alpha():
    calls = []
    seqs, scores = decoding.beam_search(
        _markov(_table(ROWS), calls), _cache(2), beam_size=2, max_decode_length=20
    )
    jax.effects_barrier()
    np.testing.assert_array_equal(seqs[0, 0, :3], [A, EOS, 0])
    np.testing.assert_array_equal(seqs[1, 0, :4], [A, B, EOS, 0])
    assert np.all(np.diff(np.asarray(scores), axis=1) <= 0)  # Best first.
    assert len(calls) < 20  # Stopped before the length limit.


def test_beam_search_unfinished_beams_end_at_the_length_limit_under_the_hf_rule():
    seqs, scores = decoding.beam_search(
        _markov(_table(ROWS)), _cache(2), beam_size=2, max_decode_length=2, alpha=0.6, rule="hf"
    )
    np.testing.assert_array_equal(seqs[1, 0], [A, B])  # No EOS within 2 tokens.
    assert scores[1, 0] == pytest.approx(2 * math.log(0.9) / (7 / 6) ** 0.6, abs=1e-4)


def test_t5x_rule_finishes_by_eos_only_and_falls_back_to_live_beams():
    # Width 1 ranks 2 candidates a step. Row 1 never has EOS among them within 2 tokens, so
    # nothing finishes and its live beam A B comes back with its log-probability, unpenalized.
    # Row 0: [EOS] (0.45) finishes at step 0 as the second candidate; A EOS (0.55 x 0.8) beats
    # it once penalized: log .44 / (7/6)^0.6 = -0.748 > log .45 = -0.799.
    seqs, scores = decoding.beam_search(
        _markov(_table(ROWS)), _cache(2), beam_size=1, max_decode_length=2, alpha=0.6
    )
    np.testing.assert_array_equal(seqs[:, 0], [[A, EOS], [A, B]])
    np.testing.assert_allclose(
        scores[:, 0], [math.log(0.44) / (7 / 6) ** 0.6, 2 * math.log(0.9)], atol=1e-4
    )
    hf_seqs, hf_scores = decoding.beam_search(
        _markov(_table(ROWS)), _cache(2), beam_size=1, max_decode_length=2, alpha=0.6, rule="hf"
    )
    np.testing.assert_array_equal(hf_seqs[:, 0], [[A, EOS], [A, B]])
    assert hf_scores[1, 0] == pytest.approx(2 * math.log(0.9) / (7 / 6) ** 0.6, abs=1e-4)


def test_t5x_rule_lets_any_of_the_2k_candidates_finish():
    # Width 1, alpha 0: step 0 ranks A (0.6) over EOS (0.4). Under the T5X rule the second
    # candidate [EOS] finishes (log .4), and the live A EOS (0.6 x 0.6 = .36) cannot beat it.
    # Under the HF rule only the best candidate may finish: A EOS, which greedy decoding takes.
    rows = [{PAD: {A: 0.6, EOS: 0.4}, A: {EOS: 0.6, B: 0.4}, B: {EOS: 1.0}}]
    t5x = decoding.beam_search(
        _markov(_table(rows)), _cache(1), beam_size=1, max_decode_length=4, alpha=0.0, rule="t5x"
    )
    hf = decoding.beam_search(
        _markov(_table(rows)), _cache(1), beam_size=1, max_decode_length=4, alpha=0.0, rule="hf"
    )
    greedy = decoding.greedy(_markov(_table(rows)), _cache(1), max_decode_length=4)
    np.testing.assert_array_equal(t5x[0][0, 0], [EOS, 0, 0, 0])
    assert t5x[1][0, 0] == pytest.approx(math.log(0.4), abs=1e-4)
    np.testing.assert_array_equal(hf[0][0, 0], [A, EOS, 0, 0])
    assert hf[1][0, 0] == pytest.approx(math.log(0.36), abs=1e-4)
    np.testing.assert_array_equal(greedy[0], hf[0][0, 0])
    with pytest.raises(ValueError, match="rule"):
        decoding.beam_search(
            _markov(_table(rows)), _cache(1), beam_size=1, max_decode_length=4, rule="mesh"
        )


def test_decoding_config_validates_and_overrides():
    config = decoding.DecodingConfig(method="beam", beam_size=3)
    assert decoding.DecodingConfig.of(config, alpha=0.0) == decoding.DecodingConfig(
        method="beam", beam_size=3, alpha=0.0
    )
    assert decoding.DecodingConfig().beam_rule == "t5x"
    for bad in (
        dict(method="nucleus"),
        dict(beam_rule="mesh"),
        dict(beam_size=0),
        dict(first_cache_length=0),
        dict(max_decode_length=-1),
        dict(alpha=-1.0),
        dict(top_p=0.0),
        dict(min_length=-2),
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            decoding.DecodingConfig(**bad)


def test_beam_search_keeps_shared_cache_entries_at_one_copy_per_input():
    """Leaves under `decoding.SHARED` stay [B, ...] for the K beams of each input; the search
    gives the same beams as with the per-input data repeated in every beam's row."""
    table = jnp.asarray(_table(ROWS))
    shapes = []

    def tokens_to_logits(tokens, cache):
        rows = tokens.shape[0]
        per_input = cache[decoding.SHARED]["row"]  # [B]
        shapes.append((rows, per_input.shape[0]))
        row = per_input[jnp.arange(rows) // (rows // per_input.shape[0])]
        return table[row, tokens[:, 0]], {**cache, "index": cache["index"] + 1}

    cache = {"index": jnp.zeros(2, jnp.int32), decoding.SHARED: {"row": jnp.arange(2)}}
    expanded = decoding.expand_cache(cache, 2)
    assert expanded["index"].shape == (4,) and expanded[decoding.SHARED]["row"].shape == (2,)
    for alpha in (0.0, 1.0):
        kwargs = dict(beam_size=2, max_decode_length=5, alpha=alpha)
        shared = decoding.beam_search(tokens_to_logits, cache, **kwargs)
        repeated = decoding.beam_search(_markov(_table(ROWS)), _cache(2), **kwargs)
        np.testing.assert_array_equal(shared[0], repeated[0])
        np.testing.assert_allclose(shared[1], repeated[1], atol=1e-6)
    assert set(shapes) == {(4, 2)}


def _random_tokens_to_logits(seed, vocab=16, batch_size=3):
    """A stub whose logits depend on the whole prefix (a hash of it kept in the cache)."""
    weights = jax.random.normal(jax.random.PRNGKey(seed), (vocab, vocab)) * 3.0

    def tokens_to_logits(tokens, cache):
        state = 0.5 * cache["state"] + weights[tokens[:, 0]]  # [B, V]
        return state, {"state": state}

    return tokens_to_logits, {"state": jnp.zeros((batch_size, vocab))}


def _history_stub(seed, vocab=16, batch_size=3, eos_from=None, calls=None):
    """A stub that keeps every token fed so far in a [B, S] `history` cache and reads it all
    each step, so decoding in phases is only right if resizing keeps what was written.

    Logits are exact in float32 (integer weights, power-of-two decay, integer counts), so a
    cache padded with empty positions gives bit-identical logits. With `eos_from`, row r ends at position
    `eos_from + 2 * r`. Records the history length of every traced step in `lengths`.
    """
    weights = jnp.round(jax.random.normal(jax.random.PRNGKey(seed), (vocab, vocab)) * 3.0)
    lengths = []

    def count(index):
        calls.append(int(index))

    def tokens_to_logits(tokens, cache):
        lengths.append(cache["history"].shape[1])
        if calls is not None:
            jax.debug.callback(count, cache["index"][0])
        rows, index = jnp.arange(tokens.shape[0]), cache["index"]
        history = cache["history"].at[rows, index].set(tokens[:, 0] + 1)  # 0 marks empty.
        decay = 0.5 ** (index[:, None] - jnp.arange(history.shape[1])[None, :])  # [B, S]
        fed = jax.nn.one_hot(history - 1, vocab)  # [B, S, V], zero rows where empty
        decayed = fed * jnp.where(history > 0, decay, 0.0)[..., None]
        # Every token fed so far is penalized by its count, so no token repeats for long.
        logits = jnp.einsum("bsv,vw->bw", decayed, weights) - 8.0 * fed.sum(axis=1)
        if eos_from is not None:
            ends = index >= eos_from + 2 * rows
            logits = logits.at[:, EOS].add(jnp.where(ends, 1e4, -1e4))
        return logits, {"history": history, "index": index + 1}

    cache = {
        "history": jnp.zeros((batch_size, 1), jnp.int32),
        "index": jnp.zeros(batch_size, jnp.int32),
    }
    return tokens_to_logits, cache, lengths


def _resize_history(cache, steps):
    history = cache["history"]
    if steps <= history.shape[1]:
        return {**cache, "history": history[:, :steps]}
    return {**cache, "history": jnp.pad(history, ((0, 0), (0, steps - history.shape[1])))}


def test_cache_lengths_double_up_to_the_maximum():
    assert decoding.cache_lengths(256, decoding.FIRST_CACHE_LENGTH) == (32, 64, 128, 256)
    assert decoding.cache_lengths(9, 2) == (2, 4, 8, 9)
    assert decoding.cache_lengths(256, 64) == (64, 128, 256)
    assert decoding.cache_lengths(64, 64) == (64,)
    assert decoding.cache_lengths(10, 64) == (10,)
    with pytest.raises(ValueError, match="first_cache_length >= 1"):
        decoding.cache_lengths(10, 0)


@pytest.mark.parametrize("method", ["greedy", "sample", "beam"])
def test_decoding_in_phases_of_a_growing_cache_equals_one_phase(method):
    def run(**kwargs):
        fn, cache, lengths = _history_stub(4)
        if method == "greedy":
            out = decoding.greedy(fn, cache, max_decode_length=9, **kwargs)
        elif method == "sample":
            out = decoding.sample(fn, cache, jax.random.PRNGKey(2), max_decode_length=9, **kwargs)
        else:
            out = decoding.beam_search(
                fn, cache, beam_size=3, max_decode_length=9, alpha=0.6, rule="hf", **kwargs
            )
        return out, lengths

    (one, one_lengths), (phased, phased_lengths) = (
        run(resize_cache=_resize_history, first_cache_length=9),
        run(resize_cache=_resize_history, first_cache_length=2),
    )
    jax.tree.map(np.testing.assert_array_equal, phased, one)
    assert one_lengths == [9] and phased_lengths == [2, 4, 8, 9]
    tokens = np.asarray(one if method != "beam" else one[0])
    assert len(np.unique(tokens)) > 3  # Not a degenerate repeated token.


def test_decoding_in_phases_stops_once_every_row_has_ended():
    outputs, steps = [], []
    for first in (20, 2):
        calls = []
        fn, cache, _ = _history_stub(5, eos_from=2, calls=calls)
        out = decoding.greedy(
            fn, cache, max_decode_length=20, resize_cache=_resize_history, first_cache_length=first
        )
        jax.effects_barrier()
        outputs.append(np.asarray(out))
        steps.append(calls)
    np.testing.assert_array_equal(outputs[1], outputs[0])
    # Rows end at positions 2, 4 and 6: seven steps, in one phase or across phases 2, 4, 8.
    assert steps[0] == steps[1] == list(range(7))
    np.testing.assert_array_equal((outputs[0] == EOS).argmax(axis=1), [2, 4, 6])


def test_beam_width_one_alpha_zero_is_greedy_under_the_hf_rule():
    for seed in range(3):
        fn, cache = _random_tokens_to_logits(seed)
        greedy = decoding.greedy(fn, cache, max_decode_length=10)
        seqs, _ = decoding.beam_search(
            fn, cache, beam_size=1, max_decode_length=10, alpha=0.0, rule="hf"
        )
        np.testing.assert_array_equal(seqs[:, 0], greedy)


def test_beam_scores_are_sequence_log_probs():
    fn, cache = _random_tokens_to_logits(7)
    seqs, scores = decoding.beam_search(fn, cache, beam_size=3, max_decode_length=6, alpha=0.6)
    # Teacher-force each returned sequence through the stub and sum its log-probs.
    for k in range(3):
        tokens = np.asarray(seqs[:, k])
        state, total, lengths = cache, np.zeros(3), np.zeros(3)
        previous = np.zeros(3, np.int32)
        alive = np.ones(3, bool)
        for t in range(6):
            logits, state = fn(jnp.asarray(previous)[:, None], state)
            log_probs = np.asarray(jax.nn.log_softmax(logits))
            total += np.where(alive, log_probs[np.arange(3), tokens[:, t]], 0.0)
            lengths += alive
            alive &= tokens[:, t] != EOS
            previous = tokens[:, t]
        expected = total / ((5 + lengths) / 6) ** 0.6
        np.testing.assert_allclose(scores[:, k], expected, rtol=1e-5, atol=1e-5)


def test_top_k_filter_example():
    out = decoding.top_k_filter(jnp.array([[1.0, 3.0, 2.0, 0.0]]), 2)
    np.testing.assert_array_equal(out, [[decoding.NEG_INF, 3.0, 2.0, decoding.NEG_INF]])


@pytest.mark.parametrize(
    "p, kept",
    [(0.4, [1]), (0.7, [1, 2]), (0.799, [1, 2]), (0.85, [0, 1, 2, 3]), (1.0, [0, 1, 2, 3])],
)
def test_top_p_keeps_smallest_set_with_mass_at_least_p(p, kept):
    logits = jnp.log(jnp.array([[0.1, 0.5, 0.3, 0.1]]))
    out = np.asarray(decoding.top_p_filter(logits, p))[0]
    np.testing.assert_array_equal(np.flatnonzero(out > decoding.NEG_INF / 2), kept)


def _one_step_stub(probs, batch_size):
    logits = jnp.log(jnp.asarray(probs, jnp.float32))

    def tokens_to_logits(tokens, cache):
        return jnp.broadcast_to(logits, (tokens.shape[0], logits.shape[0])), cache

    return tokens_to_logits, {"unused": jnp.zeros((batch_size,))}


def test_sampling_with_top_p_draws_from_the_nucleus_in_proportion():
    fn, cache = _one_step_stub([0.1, 0.5, 0.3, 0.1], 4000)
    out = np.asarray(
        decoding.sample(fn, cache, jax.random.PRNGKey(0), max_decode_length=1, top_p=0.7)
    )[:, 0]
    assert set(np.unique(out)) == {1, 2}
    assert np.mean(out == 1) == pytest.approx(0.5 / 0.8, abs=0.03)


def test_sampling_with_top_k_and_temperature():
    fn, cache = _one_step_stub([0.1, 0.5, 0.3, 0.1], 4000)
    out = np.asarray(
        decoding.sample(
            fn, cache, jax.random.PRNGKey(1), max_decode_length=1, top_k=2, temperature=2.0
        )
    )[:, 0]
    assert set(np.unique(out)) == {1, 2}
    # Temperature 2 turns probabilities into their square roots before renormalizing.
    expected = math.sqrt(0.5) / (math.sqrt(0.5) + math.sqrt(0.3))
    assert np.mean(out == 1) == pytest.approx(expected, abs=0.03)


def test_sampling_limits_equal_greedy_and_rng_determines_output():
    fn, cache = _random_tokens_to_logits(3, batch_size=8)
    greedy = decoding.greedy(fn, cache, max_decode_length=10)
    rng = jax.random.PRNGKey(5)
    for kwargs in ({"temperature": 0.0}, {"temperature": 1e-4}, {"top_k": 1}):
        out = decoding.sample(fn, cache, rng, max_decode_length=10, **kwargs)
        np.testing.assert_array_equal(out, greedy, err_msg=str(kwargs))
    first = decoding.sample(fn, cache, rng, max_decode_length=10)
    np.testing.assert_array_equal(first, decoding.sample(fn, cache, rng, max_decode_length=10))
    other = decoding.sample(fn, cache, jax.random.PRNGKey(6), max_decode_length=10)
    assert not np.array_equal(first, other)


def test_ensemble_averages_logits_before_softmax():
    # Mean logits (a geometric mean of probabilities) pick B: sqrt(.01 * .9) > sqrt(.98 * .001);
    # averaging the probabilities instead would pick A: (.98 + .001) / 2 > (.01 + .9) / 2.
    first = jnp.log(jnp.array([0.005, 0.005, 0.98, 0.01]))
    second = jnp.log(jnp.array([0.0495, 0.0495, 0.001, 0.9]))

    def constant(logits):
        return lambda tokens, cache: (jnp.broadcast_to(logits, (tokens.shape[0], 4)), cache)

    fn = decoding.ensemble_tokens_to_logits([constant(first), constant(second)])
    caches = ({"a": jnp.zeros((2,))}, {"b": jnp.zeros((2, 3))})
    logits, new = fn(jnp.zeros((2, 1), jnp.int32), caches)
    np.testing.assert_allclose(logits[0], (first + second) / 2)
    assert isinstance(new, tuple) and len(new) == 2
    np.testing.assert_array_equal(decoding.greedy(fn, caches, max_decode_length=1), [[B], [B]])
    seqs, _ = decoding.beam_search(
        fn, caches, beam_size=2, max_decode_length=1, alpha=0.0, rule="hf"
    )
    np.testing.assert_array_equal(seqs[:, 0, 0], [B, B])


def test_clear_errors():
    fn, cache = _random_tokens_to_logits(0)
    with pytest.raises(ValueError, match="batch dimension first"):
        decoding.greedy(fn, {"a": jnp.zeros((2,)), "b": jnp.zeros((3,))}, max_decode_length=2)
    with pytest.raises(ValueError, match="top_p"):
        decoding.sample(fn, cache, jax.random.PRNGKey(0), max_decode_length=2, top_p=0.0)
    with pytest.raises(ValueError, match="at least 2K"):
        decoding.beam_search(fn, cache, beam_size=9, max_decode_length=2)


@pytest.mark.parametrize("vocab, k", [(32128, 1), (32128, 8), (5000, 3)])
def test_chunked_top_k_equals_lax_top_k_with_ties(vocab, k):
    rng = np.random.default_rng(vocab + k)
    x = rng.integers(-3, 3, (6, vocab)).astype(np.float32)  # Many ties at the maximum.
    x[1] = rng.normal(size=vocab)
    x[2, -1] = 10.0  # The maximum in the last (padded) chunk.
    x[3, :] = 2.0
    values, indices = jax.jit(decoding.chunked_top_k, static_argnums=1)(jnp.asarray(x), k)
    expected_values, expected_indices = jax.lax.top_k(jnp.asarray(x), k)
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_array_equal(indices[:, 0], np.argmax(x, axis=1))


def test_beam_slots_keep_parents_docstring_example():
    slots = decoding._slots_keeping_parents(jnp.array([[2, 2, 0, 2], [0, 1, 2, 3], [3, 3, 3, 3]]))
    np.testing.assert_array_equal(slots, [[2, 1, 0, 3], [0, 1, 2, 3], [3, 0, 1, 2]])


def test_a_decode_loop_spec_equals_its_fields_as_keywords():
    """`DecodeLoop` is what greedy, sampling and beam search share; given whole or as keywords
    (over a given one) the tokens are the same, and an unknown name is refused."""
    fn, cache = _markov(_table(ROWS)), _cache(2)
    loop = decoding.DecodeLoop(max_decode_length=6, min_length=2)
    np.testing.assert_array_equal(
        decoding.greedy(fn, cache, loop),
        decoding.greedy(fn, cache, max_decode_length=6, min_length=2),
    )
    longer = decoding.greedy(fn, cache, loop, max_decode_length=8)
    assert longer.shape == (2, 8)
    np.testing.assert_array_equal(
        longer, decoding.greedy(fn, cache, max_decode_length=8, min_length=2)
    )
    rng = jax.random.PRNGKey(0)
    np.testing.assert_array_equal(
        decoding.sample(fn, cache, rng, loop, temperature=0.5),
        decoding.sample(fn, cache, rng, max_decode_length=6, min_length=2, temperature=0.5),
    )
    with pytest.raises(TypeError, match="'min_lenght': did you mean 'min_length'"):
        decoding.greedy(fn, cache, max_decode_length=6, min_lenght=2)
    with pytest.raises(TypeError, match="needs max_decode_length"):
        decoding.greedy(fn, cache, min_length=2)
    with pytest.raises(ValueError, match="takes no forced prompt"):
        decoding.beam_search(
            fn,
            cache,
            loop,
            beam_size=2,
            prompt=np.zeros((2, 6), np.int32),
            prompt_lengths=np.ones(2),
        )
