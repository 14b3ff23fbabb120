"""The one way t2t registers seqio tasks and mixtures, and finds them by name.

Registering: `add_task` / `add_mixture` replace a task that the same t2t module registered
before (its `register()` run again, e.g. with another vocabulary or objective knobs) and refuse
any other task of that name, so a user's task and t2t's never silently replace each other.

Finding: seqio's own lookup logs the near names and raises a bare error; here the nearest names
are in the exception, together with the reminder that registrations come from explicit imports.
"""

from __future__ import annotations

import difflib
import os

import seqio

from t2t import files

_IMPORT_HINT = (
    "Tasks and mixtures are registered by importing their modules: give the module that "
    "registers yours to the command, e.g. `t2t train --import=my_tasks ...` (repeatable; the "
    "working directory is searched), or import it in Python. The shipped ones: "
    "`t2t.data.tasks.builtin`, `t2t.data.tasks.c4`, `t2t.data.tasks.glue`, "
    "`t2t.data.tasks.mixtures` (or `t2t.data.tasks.import_all()`)."
)


# (kind, name) -> (the module that registered it through `add_task` / `add_mixture`, the object).
_OWNERS: dict[tuple[str, str], tuple[str, object]] = {}


def add_task(name: str, owner: str, **task_args) -> seqio.Task:
    """Registers `seqio.Task(name, **task_args)` on behalf of module `owner` (its `__name__`).

    Raises:
      ValueError: a task of that name was registered by another module or outside t2t.
    """
    _make_room(seqio.TaskRegistry, "task", name, owner)
    task = seqio.TaskRegistry.add(name, **task_args)
    _OWNERS[("task", name)] = (owner, task)
    return task


def add_mixture(name: str, tasks, owner: str, **mixture_args) -> seqio.Mixture:
    """Registers `seqio.Mixture(name, tasks, **mixture_args)` on behalf of module `owner`.

    Raises:
      ValueError: a mixture of that name was registered by another module or outside t2t.
    """
    _make_room(seqio.MixtureRegistry, "mixture", name, owner)
    mixture = seqio.MixtureRegistry.add(name, tasks, **mixture_args)
    _OWNERS[("mixture", name)] = (owner, mixture)
    return mixture


def _make_room(registry, kind: str, name: str, owner: str) -> None:
    if name in registry.names():
        previous, registered = _OWNERS.get((kind, name), (None, None))
        if registry.get(name) is not registered:
            previous = None  # replaced outside t2t since
        if previous != owner:
            raise ValueError(
                f"A {kind} named {name!r} is already registered "
                f"({f'by {previous}' if previous else 'outside t2t'}); {owner} registers another "
                f"under the same name. Rename one of them, or remove the first with "
                f"seqio.{registry.__name__}.remove({name!r})."
            )
        registry.remove(name)


def registered_names() -> list[str]:
    """Every registered task and mixture name, sorted."""
    return sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))


def get_task_or_mixture(name: str) -> seqio.Task | seqio.Mixture:
    """Returns the registered mixture (preferred) or task called `name`.

    Raises:
      TypeError: when `name` is not a string.
      ValueError: when nothing is registered under `name`; the message lists the nearest names.
    """
    if not isinstance(name, str):
        raise TypeError(
            f"Expected a task or mixture name (str), got {type(name).__name__}: {name!r}."
        )
    if name in seqio.MixtureRegistry.names():
        return seqio.MixtureRegistry.get(name)
    if name in seqio.TaskRegistry.names():
        return seqio.TaskRegistry.get(name)
    names = registered_names()
    if not names:
        raise ValueError(
            f"No task or mixture named {name!r}: nothing is registered. {_IMPORT_HINT}"
        )
    near = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    suggestion = (
        f"Nearest registered names: {', '.join(near)}."
        if near
        else (
            f"No registered name is close; {len(names)} are registered, e.g. {', '.join(names[:5])}."
        )
    )
    raise ValueError(f"No task or mixture named {name!r}. {suggestion} {_IMPORT_HINT}")


def check_ready(provider: seqio.Task | seqio.Mixture, *, use_cached: bool = False) -> None:
    """Checks, before any example is read, that every task of `provider` can be read offline.

    Without these checks the first read fails deep inside tf.data or tries the network: seqio
    asserts on a missing cache, TFDS downloads a dataset that is not prepared, and a missing
    SentencePiece file fails at the first tokenization.

    Raises:
      UserError: a task has no seqio cache (`use_cached`), a TFDS dataset is not prepared, or a
        vocabulary file does not exist; the message says how to fix it.
    """
    from t2t.errors import UserError

    for task in seqio.get_subtasks(provider):
        for name, feature in task.output_features.items():
            path = getattr(feature.vocabulary, "sentencepiece_model_file", None)
            if path and not files.is_remote(path) and not files.exists(path):
                if path == os.environ.get("T2T_VOCABULARY"):
                    fix = (
                        "$T2T_VOCABULARY names it: point it at a SentencePiece model (T5's is "
                        "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model; copy it "
                        "locally, or train one with `t2t vocab`)."
                    )
                else:
                    fix = (
                        "Put the SentencePiece model there, or fix the path where the task "
                        "is registered."
                    )
                raise UserError(
                    f"Task {task.name}: the {name!r} vocabulary {path} does not exist. {fix}"
                )
        if use_cached:
            if not task.cache_dir:
                dirs = seqio.get_global_cache_dirs() or ["(none set)"]
                raise UserError(
                    f"Task {task.name} has no seqio cache in the cache directories "
                    f"{', '.join(dirs)}. Build it with `t2t cache --task {task.name} "
                    "--output_cache_dir DIR` and train with --seqio_cache_dir DIR, or drop "
                    "use_cached=True to preprocess on the fly."
                )
            continue
        source = task.source
        if isinstance(source, seqio.TfdsDataSource):
            try:
                builder = source.tfds_dataset.builder
                prepared = builder.is_prepared()
            except Exception:  # noqa: BLE001 (cannot tell here: the read will say what is wrong)
                continue
            if not prepared:
                tfds_name = source.tfds_dataset.name
                raise UserError(
                    f"Task {task.name} reads the TFDS dataset {tfds_name}, which is not "
                    f"prepared in {builder.data_dir_root}. Prepare it once where the network "
                    f"is reachable: `tfds build {tfds_name.split(':')[0]} --data_dir=DIR` "
                    "(some datasets need a manual download first; `tfds build` says which), "
                    "then pass --tfds_data_dir=DIR (or set $TFDS_DATA_DIR=DIR)."
                )


def check_vocabulary_fits(
    provider: seqio.Task | seqio.Mixture, vocab_size: int, *, fix: str
) -> None:
    """Checks that an embedding of `vocab_size` rows has a row for every id `provider`'s tasks
    can produce. Without it, an id past the last row reads NaN from the embedding (JAX's
    out-of-bounds gather) and the first step's loss is NaN, with nothing saying why.

    Raises:
      UserError: a feature's vocabulary has more ids than `vocab_size`; the message names the
        task, the feature and both sizes, then says `fix`.
    """
    from t2t.errors import UserError

    for task in seqio.get_subtasks(provider):
        for name, feature in task.output_features.items():
            size = feature.vocabulary.vocab_size
            if size > vocab_size:
                raise UserError(
                    f"Task {task.name}'s {name!r} vocabulary has {size} ids but the model's "
                    f"embedding only {vocab_size} rows. {fix}"
                )
