"""One entry point from a name to a registered seqio task or mixture, with a helpful miss.

seqio's own lookup logs the near names and raises a bare error; here the nearest names are in
the exception, together with the reminder that registrations come from explicit imports.
"""

from __future__ import annotations

import difflib

import seqio

_IMPORT_HINT = (
    "Tasks and mixtures are registered by importing their modules, e.g. "
    "`import t2t.data.tasks.builtin`, `t2t.data.tasks.c4`, `t2t.data.tasks.glue`, "
    "`t2t.data.tasks.mixtures` (or `t2t.data.tasks.import_all()`)."
)


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
        raise TypeError(f"Expected a task or mixture name (str), got {type(name).__name__}: {name!r}.")
    if name in seqio.MixtureRegistry.names():
        return seqio.MixtureRegistry.get(name)
    if name in seqio.TaskRegistry.names():
        return seqio.TaskRegistry.get(name)
    names = registered_names()
    if not names:
        raise ValueError(f"No task or mixture named {name!r}: nothing is registered. {_IMPORT_HINT}")
    near = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    suggestion = f"Nearest registered names: {', '.join(near)}." if near else (
        f"No registered name is close; {len(names)} are registered, e.g. {', '.join(names[:5])}.")
    raise ValueError(f"No task or mixture named {name!r}. {suggestion} {_IMPORT_HINT}")
