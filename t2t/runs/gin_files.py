"""Parsing gin files and bindings as the CLI does: search paths (the checkout's or the wheel's
`gin/`), a check that every bound macro is used, and two guards around gin's file lookup."""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
from collections.abc import Sequence

import gin


def default_search_paths() -> list[str]:
    """Where the shipped gin files are: the `gin/` directory and its parent, so both
    `gin/experiments/x.gin` and an `include 'runs/pretrain.gin'` resolve. From a checkout that
    is the repository's `gin/`; installed (a wheel), the copy in the package (`t2t._shipped`)."""
    here = os.path.abspath(__file__)  # local path: the package
    package = os.path.dirname(os.path.dirname(here))  # t2t/
    roots = (os.path.dirname(package), os.path.join(package, "_shipped"))
    return [
        p
        for root in roots
        for p in (os.path.join(root, "gin"), root)
        if os.path.isdir(os.path.join(root, "gin"))  # local path: the package
    ]


def configure(
    gin_files: Sequence[str],
    bindings: Sequence[str] = (),
    search_paths: Sequence[str] = (),
    *,
    finalize: bool = True,
) -> None:
    """Parses gin files (in order) and then bindings, as the `t2t` CLI does.

    Files and their `include`s are looked up as given, then under each search path (given
    ones first, then the repository's `gin/` directory and its parent). Earlier configuration
    is cleared.

    Args:
      gin_files: e.g. ["gin/experiments/tiny_builtin_demo.gin"].
      bindings: e.g. ["MODEL_DIR = '/tmp/demo'", "t2t.runs.train.train_steps = 10"].
      search_paths: extra directories to resolve files and includes in.
      finalize: lock the configuration (no later changes).

    """
    gin.clear_config()
    _guard_system_path_lookup()
    for path in [*search_paths, *default_search_paths()]:
        gin.add_config_file_search_path(path)
    root = logging.getLogger()
    root.addFilter(_quiet_search_misses)
    try:
        gin.parse_config_files_and_bindings(list(gin_files), list(bindings), finalize_config=False)
    except ValueError as error:
        hint = _parameter_hint(str(error))
        if not hint:
            raise
        raise ValueError(f"{error}\n{hint}") from None
    finally:
        root.removeFilter(_quiet_search_misses)
    _check_macros_are_used(bindings)
    if finalize:
        gin.finalize()


# gin's error for a binding of a parameter the function does not have.
_UNKNOWN_PARAMETER = re.compile(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'")


def _parameter_hint(message: str) -> str:
    """ "Did you mean ...?" for gin's unknown-parameter error: where a `train` option moved to
    (its data, checkpoint and evaluation options are groups now), or the closest parameters of
    the configurable (for `train`, with its groups' fields), or all of them ("" for other
    errors)."""
    import inspect

    from t2t.runs.train_run import MOVED_OPTIONS, OPTION_GROUPS

    found = _UNKNOWN_PARAMETER.search(message)
    if not found:
        return ""
    name, parameter = found.groups()
    try:  # NOTE: gin has no public way to list a configurable's parameters
        configurable = gin.config._REGISTRY.get_match(name)
        full_name = configurable.selector
        parameters = {p: f"{name}.{p}" for p in inspect.signature(configurable.wrapped).parameters}
    except Exception:  # noqa: BLE001 (no hint rather than a second error)
        return ""
    if full_name == "t2t.runs.train":
        if parameter in MOVED_OPTIONS:
            return (
                f"t2t.runs.train.{parameter} is now {MOVED_OPTIONS[parameter]} (train's data, "
                "checkpoint and evaluation options are bound by group)."
            )
        for group in OPTION_GROUPS:
            for field in dataclasses.fields(group):
                parameters.setdefault(field.name, f"t2t.runs.{group.__name__}.{field.name}")
    close = difflib.get_close_matches(parameter, list(parameters), n=3)
    if close:
        return f"Did you mean {' or '.join(parameters[c] for c in close)}?"
    named = (full.removeprefix(f"{name}.") for full in parameters.values())
    return f"{name} takes: {', '.join(named)}."


_MACRO_BINDING = re.compile(r"^\s*([A-Za-z_]\w*)\s*=", re.MULTILINE)


def _check_macros_are_used(bindings: Sequence[str]) -> None:
    """Refuses a binding of a macro that nothing refers to: a misspelt `TRAIN_STEP=10`.

    gin defines any macro it is given, so a typo would otherwise go unnoticed and the run would
    take the gin file's value. Only bindings are checked; gin files may define spare macros.
    """
    from gin import config as gin_config

    bound = {name for binding in bindings for name in _MACRO_BINDING.findall(binding)}
    if not bound:
        return
    defined, used = set(), set()

    def walk(value):
        if isinstance(value, gin_config.ConfigurableReference):
            scope, _, selector = value.scoped_selector.rpartition("/")
            if selector == "gin.macro":
                used.add(scope)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)

    for (scope, selector), params in gin_config._CONFIG.items():  # noqa: SLF001
        if selector == "gin.macro":
            defined.add(scope)
        for value in params.values():
            walk(value)
    for name in sorted(bound - used):
        # the macros a configuration refers to, bound here or not (`TRAIN_STEP` beside
        # `TRAIN_STEPS`), and the gin files' spare ones
        close = difflib.get_close_matches(name, sorted(used | (defined - bound)), n=3)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(
            f"The binding {name} = ... sets a gin macro that no configuration refers to (as "
            f"%{name}), so it would change nothing.{hint}"
        )


def _guard_system_path_lookup() -> None:
    """Makes gin's Python-path lookup of a config file answer "no" instead of crashing.

    gin also looks for `include 'runs/pretrain.gin'` as file `pretrain.gin` of a Python package
    `runs`. When a plain directory of that name is importable (a `runs/` model directory in the
    working directory of `python -m pytest` or a notebook), it is a namespace package without a
    file, and gin-config 0.5's check raises a TypeError instead of moving on to the search
    paths. The check is wrapped, in gin's reader table, to treat that case as "not there".
    """
    from gin import config as gin_config
    from gin import resource_reader

    def exists(path: str) -> bool:
        try:
            return resource_reader.system_path_file_exists(path)
        except TypeError:  # a namespace package: no origin file, so no config file in it
            return False

    gin_config._FILE_READERS[:] = [  # noqa: SLF001 (gin has no public way to replace a reader)
        (reader, exists if check is resource_reader.system_path_file_exists else check)
        for reader, check in gin_config._FILE_READERS
    ]


def _quiet_search_misses(record: logging.LogRecord) -> bool:
    """Drops gin's error log for each search path a file is not in (it is found in the next)."""
    return not (record.module == "resource_reader" and record.msg.startswith("Path not found"))
