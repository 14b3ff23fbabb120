"""Checkpoint integrity: fingerprints, damaged checkpoints found and skipped, the one-writer lock.

Damage is done to real Orbax files: a flipped bit and random bytes in an array file (values read
back wrong, silently, without the checksums), a truncated array file and a deleted metadata
item (unreadable), an edited data-iterator file. Restoring the latest step must fall back to the
step before it with exactly the state a direct restore of that step gives.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t2t import nn, optim
from t2t.checkpoints import integrity, lock
from t2t.checkpoints.manager import (
    CheckpointManager,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
)

CONFIG = nn.get_preset("tiny", vocab_size=256)


class CountingIterator:
    def __init__(self, position=0):
        self.position = position

    def save(self, directory):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "position.json"), "w") as f:
            json.dump(self.position, f)

    def restore(self, directory):
        with open(os.path.join(directory, "position.json")) as f:
            self.position = json.load(f)


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _assert_same(a, b):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


# -- fingerprints ------------------------------------------------------------------------------


def test_fingerprints_ignore_the_layout_and_catch_every_single_bit_flip():
    values = np.random.RandomState(0).randn(16, 8).astype(np.float32)
    mesh = jax.make_mesh((4, 2), ("a", "b"))
    sharded = jax.device_put(
        values, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("a", "b"))
    )
    expected = integrity.fingerprints({"w": values})
    assert integrity.fingerprints({"w": sharded}) == expected  # any mesh, the same checksum
    for position in [(0, 0), (7, 3), (15, 7)]:
        for bit in range(32):
            flipped = values.copy()
            flipped.view(np.uint32)[position] ^= np.uint32(1 << bit)
            assert integrity.fingerprints({"w": flipped}) != expected, (position, bit)
    swapped = values.copy()
    swapped[0, 0], swapped[0, 1] = values[0, 1], values[0, 0]
    assert integrity.fingerprints({"w": swapped}) != expected  # positions are weighted
    half = jnp.asarray(values, jnp.bfloat16)
    flipped = np.asarray(half).copy()
    flipped.view(np.uint16)[3, 3] ^= np.uint16(1)
    assert integrity.fingerprints({"w": half}) != integrity.fingerprints({"w": flipped})
    # Names are the same for dicts, named tuples and lists (how Orbax hands trees back).
    assert (
        integrity.leaf_name(
            (
                jax.tree_util.DictKey("v"),
                jax.tree_util.SequenceKey(0),
                jax.tree_util.GetAttrKey("count"),
            )
        )
        == "v/0/count"
    )


# -- damaged checkpoints -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A model directory with checkpoints of steps 1 and 2 (different parameters)."""
    root = tmp_path_factory.mktemp("saved")
    tx = optim.adafactor(optim.constant(1e-3))
    manager = CheckpointManager(root, async_save=False)
    states = {}
    for step in (1, 2):
        params = nnx.state(nn.build(CONFIG, nnx.Rngs(params=step)), nnx.Param)
        _, opt_state = tx.update(params, tx.init(params), params)  # non-zero statistics
        manager.save(
            step,
            params=params,
            opt_state=opt_state,
            data_iterator=CountingIterator(10 * step),
            metadata={"config": CONFIG},
        )
        states[step] = (params, opt_state)
    manager.close()
    return root, states, jax.eval_shape(tx.init, states[1][0])


def _largest_array_file(step_dir, item="params"):
    files = [
        os.path.join(root, name)
        for root, _, names in os.walk(step_dir / item)
        for name in names
        if os.sep + "d" + os.sep in os.path.join(root, name)
    ]
    return max(files, key=os.path.getsize)


def _flip_bit(step_dir):
    path = _largest_array_file(step_dir)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(path, "wb").write(data)


def _random_bytes(step_dir):
    path = _largest_array_file(step_dir)
    data = bytearray(open(path, "rb").read())
    start = min(1000, len(data) // 4)
    data[start : start + 4096] = np.random.RandomState(1).bytes(len(data[start : start + 4096]))
    open(path, "wb").write(data)


def _truncate(step_dir):
    # NOTE: small arrays (the factored optimizer statistics) are copied into the merged index
    # of the OCDBT store (top-level d/), large ones stay in per-process files: cut them all.
    for root, _, names in os.walk(step_dir / "opt_state"):
        if os.path.basename(root) == "d":
            for name in names:
                os.truncate(
                    os.path.join(root, name), os.path.getsize(os.path.join(root, name)) // 2
                )


def _delete_metadata(step_dir):
    shutil.rmtree(step_dir / "metadata")


def _edit_iterator(step_dir):
    (step_dir / "data_iterator" / "process_0" / "position.json").write_text("999")


DAMAGE = {
    "bit_flip": (_flip_bit, "params"),
    "random_bytes": (_random_bytes, "params"),
    "truncated": (_truncate, "opt_state"),
    "metadata_deleted": (_delete_metadata, "metadata"),
    "iterator_edited": (_edit_iterator, "data_iterator"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path, saved, damage):
    source, states, abstract_opt = saved
    shutil.copytree(source, tmp_path / "run")
    damage_fn, item = DAMAGE[damage]
    damage_fn(tmp_path / "run" / "checkpoints" / "2")
    manager = CheckpointManager(tmp_path / "run", read_only=True)
    abstract_params = _abstract(states[1][0])

    def restore(step=None, **kwargs):
        iterator = CountingIterator()
        restored = manager.restore(
            step,
            abstract_params=abstract_params,
            abstract_opt_state=abstract_opt,
            data_iterator=iterator,
            **kwargs,
        )
        return restored, iterator.position

    seen = []
    restored, position = restore(on_damaged=seen.append)
    direct, direct_position = restore(1)
    assert restored.step == 1 and position == direct_position == 10
    _assert_same(restored.params, direct.params)
    _assert_same(restored.opt_state, direct.opt_state)
    _assert_same(restored.params, states[1][0])
    assert [e.step for e in restored.skipped] == [2] and seen == restored.skipped
    assert seen[0].item == item, seen[0]
    with pytest.raises(CorruptCheckpointError, match=f"step 2 .* is damaged \\({item}\\)"):
        restore(2)  # asked for by step: no fallback, a message naming what is damaged
    status = {step: manager.verify(step) for step in (1, 2)}
    assert status[1] == ("ok", [])
    assert status[2][0] == "damaged" and status[2][1], status[2]


def test_a_flipped_bit_is_named_down_to_the_array(tmp_path, saved):
    source, states, abstract_opt = saved
    shutil.copytree(source, tmp_path / "run")
    _flip_bit(tmp_path / "run" / "checkpoints" / "2")
    manager = CheckpointManager(tmp_path / "run", read_only=True)
    with pytest.raises(CorruptCheckpointError) as error:
        manager.restore(2, abstract_params=_abstract(states[1][0]))
    names = set(integrity.fingerprints(nnx.to_pure_dict(states[2][0])))
    named = error.value.detail.split(": ", 1)[1].strip("'").split("'")[0]
    assert "1 array differs from its checksums" in error.value.detail
    assert named in names


def test_every_checkpoint_damaged_is_an_error_not_a_random_start(tmp_path, saved):
    source, states, _ = saved
    shutil.copytree(source, tmp_path / "run")
    for step in (1, 2):
        _flip_bit(tmp_path / "run" / "checkpoints" / str(step))
    manager = CheckpointManager(tmp_path / "run", read_only=True)
    with pytest.raises(CorruptCheckpointError, match="no intact checkpoint is left"):
        manager.restore(abstract_params=_abstract(states[1][0]))


def test_set_aside_moves_a_damaged_step_out_of_the_way_of_new_saves(tmp_path, saved):
    source, states, _ = saved
    shutil.copytree(source, tmp_path / "run")
    manager = CheckpointManager(tmp_path / "run", async_save=False)
    moved = manager.set_aside(2)
    assert moved == str(tmp_path / "run" / "damaged_checkpoints" / "2")
    assert manager.all_steps() == [1] and os.path.isdir(moved)
    manager.save(2, params=states[2][0], metadata={"config": CONFIG})  # the step is free again
    assert manager.all_steps() == [1, 2]


def test_another_network_is_refused_before_any_array_is_read(tmp_path, saved):
    source, _, _ = saved
    other = nn.get_preset("tiny", vocab_size=512)
    params = nnx.state(nn.build(other, nnx.Rngs(params=0)), nnx.Param)
    manager = CheckpointManager(source, read_only=True)
    with pytest.raises(IncompatibleCheckpointError) as error:
        manager.restore(abstract_params=_abstract(params))
    message = str(error.value)
    assert "belongs to another network" in message
    assert "token_embedder/embedding: (256, " in message and "(512, " in message
    assert "INIT_CHECKPOINT" in message


def test_checkpoints_written_without_checksums_still_restore(tmp_path, saved):
    """Checkpoints of an older t2t (no `checksums` in the metadata) read as before."""
    source, states, _ = saved
    shutil.copytree(source, tmp_path / "run")
    path = tmp_path / "run" / "checkpoints" / "2" / "metadata" / "metadata"
    metadata = json.loads(path.read_text())
    del metadata["checksums"]
    path.write_text(json.dumps(metadata))
    manager = CheckpointManager(tmp_path / "run", read_only=True)
    restored = manager.restore(abstract_params=_abstract(states[1][0]))
    assert restored.step == 2
    _assert_same(restored.params, states[2][0])
    assert manager.verify(2) == ("unverified", [])


# -- the lock ----------------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys
    from t2t.checkpoints import lock
    held = lock.RunLock(sys.argv[1], heartbeat_seconds=0.2)
    held.acquire()
    print("held", flush=True)
    sys.stdin.read()  # hold until the test closes stdin (or kills this process)
    held.release()
""")


def _hold(model_dir):
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(model_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert process.stdout.readline().strip() == "held"
    return process


def test_the_lock_names_its_holder_and_is_taken_over_once_the_holder_is_killed(tmp_path):
    holder = _hold(tmp_path)
    with pytest.raises(lock.RunLockedError) as error:
        lock.RunLock(str(tmp_path)).acquire()
    assert f"process {holder.pid} on host" in str(error.value)
    assert "Another run is training in" in str(error.value)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    taken = lock.RunLock(str(tmp_path))
    taken.acquire()  # the holder's process is gone: stale
    assert json.loads((tmp_path / lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    taken.release()
    assert not (tmp_path / lock.LOCK_FILE).exists()


def test_a_released_lock_is_free_and_a_clean_exit_releases_it(tmp_path):
    holder = _hold(tmp_path)
    holder.stdin.close()
    assert holder.wait() == 0
    assert not (tmp_path / lock.LOCK_FILE).exists()
    with lock.RunLock(str(tmp_path)):
        with lock.RunLock(str(tmp_path)):  # re-entrant within one process
            pass
        assert (tmp_path / lock.LOCK_FILE).exists()  # the inner one does not release it
    assert not (tmp_path / lock.LOCK_FILE).exists()


def test_a_lock_of_another_host_is_stale_only_after_its_heartbeat_stops(tmp_path):
    import time

    record = {"pid": 1, "host": "elsewhere", "started": "then", "command": "t2t train"}
    path = tmp_path / lock.LOCK_FILE
    path.write_text(json.dumps({**record, "heartbeat": time.time()}))
    with pytest.raises(lock.RunLockedError, match="process 1 on host elsewhere"):
        lock.RunLock(str(tmp_path), stale_seconds=60).acquire()
    path.write_text(json.dumps({**record, "heartbeat": time.time() - 61}))
    with lock.RunLock(str(tmp_path), stale_seconds=60):
        assert json.loads(path.read_text())["host"] != "elsewhere"


@pytest.mark.parametrize("content", ["", "not json {", "[1, 2]", '{"x": 1}'])
def test_an_empty_or_garbage_lock_file_is_taken_over_at_once(tmp_path, capsys, content):
    """Issue 33: a lock file with no lock record in it read as held by "process None on host
    ?" and blocked the directory for 60 s. A holder writes its record right after creating
    the file, so a record still missing a moment later means none is coming."""
    import time

    (tmp_path / lock.LOCK_FILE).write_text(content)
    start = time.monotonic()
    with lock.RunLock(str(tmp_path), stale_seconds=60):
        assert json.loads((tmp_path / lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert "holds no lock record" in err and "None" not in err
