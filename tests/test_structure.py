"""The import contracts of docs/architecture.md are enforced: `lint-imports` passes on the code and
fails on deliberate violations (a copy of the packages where the network imports the edge, or
gin, or one of its modules imports one above it); and the network, loss, optimizer and model
wrappers import without gin, seqio or TensorFlow, as on a bare accelerator machine."""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


@pytest.mark.skipif(not os.path.exists(LINT_IMPORTS), reason="import-linter is not installed")
@pytest.mark.parametrize(
    "violation, broken_contract, message",
    [
        ("from t2t import runs", "t2t layers BROKEN", "t2t.nn is not allowed to import t2t.runs"),
        (
            "import gin",
            "network, loss, optimizer and decoding free of gin, seqio and TensorFlow BROKEN",
            "t2t.nn.masks -> gin",
        ),
        # A circle inside the network (layers.py and attention_ops.py had one until issue 53).
        (
            "from t2t.nn import attention_ops",
            "t2t.nn modules in layers BROKEN",
            "t2t.nn.masks is not allowed to import t2t.nn.attention_ops",
        ),
    ],
)
def test_a_violation_breaks_its_contract(tmp_path, violation, broken_contract, message):
    for name in ("t2t", "preprocessors"):
        shutil.copytree(
            os.path.join(REPO, name),
            tmp_path / name,
            ignore=shutil.ignore_patterns("__pycache__", "_shipped"),
        )
    shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))

    def lint() -> subprocess.CompletedProcess:
        return subprocess.run(
            [LINT_IMPORTS], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
        )

    kept = lint()
    assert kept.returncode == 0 and "Contracts: 4 kept, 0 broken." in kept.stdout, kept.stdout
    with open(tmp_path / "t2t" / "nn" / "masks.py", "a") as f:
        f.write(f"\n{violation}  # noqa: E402,F401\n")
    broken = lint()
    assert broken.returncode != 0
    assert broken_contract in broken.stdout, broken.stdout
    assert message in broken.stdout, broken.stdout


def test_the_network_loss_optimizer_and_models_import_without_gin_seqio_or_tensorflow():
    """What the GPU benchmark imports on a machine with only jax, flax and optax (and what
    DESIGN's forbidden contracts promise), checked in a fresh interpreter where importing gin,
    seqio or TensorFlow fails: the network, its loss, the optimizer, decoding, the model
    wrappers and the trainer import, and one jitted train step runs."""
    code = """
import sys
for name in ("gin", "seqio", "tensorflow", "tensorflow_text", "tensorflow_datasets"):
    sys.modules[name] = None  # `import gin` now raises ImportError
import jax, numpy as np
import t2t.nn, t2t.nn.flops, t2t.losses, t2t.optim, t2t.decoding, t2t.models, t2t.trainer
from flax import nnx
from t2t import partitioning
from t2t.trainer import steps

config = t2t.nn.get_preset("tiny", vocab_size=64)
model = t2t.models.model_for(config)
partitioner = partitioning.make_partitioner(1, 1, devices=jax.devices()[:1])
params = nnx.split(partitioner.init_model(lambda: t2t.nn.build(config, nnx.Rngs(params=0))))[1]
tx = t2t.optim.adafactor(1e-2)
opt_state = partitioner.init_optimizer(tx, params)
tokens = np.random.RandomState(0).randint(2, 64, (4, 8)).astype(np.int32)
batch = {
    "encoder_input_tokens": tokens,
    "decoder_target_tokens": tokens,
    "decoder_input_tokens": np.pad(tokens[:, :-1], ((0, 0), (1, 0))),
    "decoder_loss_weights": np.ones((4, 8), np.float32),
}
step = jax.jit(steps.make_train_step(model, tx))
losses = []
for i in range(3):
    params, opt_state, metrics = step(params, opt_state, batch, jax.random.PRNGKey(0), np.int32(i))
    losses.append(float(metrics["loss"]))
print(losses[-1] < losses[0], sorted(m for m in ("gin", "seqio", "tensorflow") if sys.modules.get(m)))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "True []", done.stdout + done.stderr


def _conftest():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    spec = importlib.util.spec_from_file_location("t2t_tests_conftest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_suite_records_its_file_durations_and_orders_by_them(tmp_path):
    import types

    conftest = _conftest()
    recorder = conftest._DurationRecorder(str(tmp_path / "durations.json"))
    for nodeid, seconds in [
        ("tests/a.py::test_x", 1.0),  # setup, call, teardown of one test add up
        ("tests/a.py::test_x", 2.5),
        ("tests/sub/b.py::test_y[1]", 7.0),
        ("tests/a.py::test_z", 0.5),
    ]:
        recorder.pytest_runtest_logreport(types.SimpleNamespace(nodeid=nodeid, duration=seconds))
    recorder.pytest_sessionfinish(None, 0)
    seconds = conftest.file_durations(str(tmp_path / "durations.json"))
    assert list(seconds.items()) == [("tests/sub/b.py", 7.0), ("tests/a.py", 4.0)]
    assert conftest.file_durations(str(tmp_path / "none.json")) == {}


def test_a_renamed_or_new_test_file_runs_unordered_instead_of_failing(tmp_path, monkeypatch):
    """The recorded durations only order the suite: a file they do not name (new, or renamed
    since `make test-durations`) runs after the recorded ones, and a name whose file is gone
    is ignored."""
    import types

    conftest = _conftest()
    durations = tmp_path / "durations.json"
    durations.write_text(
        json.dumps({"seconds": {"tests/gone.py": 90.0, "tests/b.py": 50.0, "tests/a.py": 10.0}})
    )
    monkeypatch.setattr(conftest, "_DURATIONS", str(durations))
    monkeypatch.setattr(conftest.file_durations, "__defaults__", (str(durations),))
    names = ["tests/new.py", "tests/a.py", "tests/b.py", "tests/new.py", "tests/a.py"]
    items = [
        types.SimpleNamespace(path=tmp_path / n, nodeid=f"{n}::t{i}") for i, n in enumerate(names)
    ]
    conftest.pytest_collection_modifyitems(types.SimpleNamespace(rootpath=tmp_path), items)
    assert [i.nodeid for i in items] == [
        "tests/b.py::t2",
        "tests/a.py::t1",
        "tests/a.py::t4",
        "tests/new.py::t0",
        "tests/new.py::t3",
    ]
