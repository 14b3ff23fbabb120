"""seqio task and mixture registrations, one module per family.

Importing `t2t.data.tasks` registers nothing. Each module registers its tasks when imported:
  - `builtin`:    objectives and supervised tasks on the built-in corpus (no download);
  - `c4`:         every pretraining objective on TFDS `c4/en`;
  - `glue`, `superglue`: GLUE and SuperGLUE (each sub-task, and the single concatenated mixture);
  - `generation`: SQuAD, CNN/Daily Mail, WMT En-De / En-Fr / En-Ro;
  - `mixtures`:   the paper's multi-task, leave-one-out and supervised-only mixtures.
`t2t.data.tasks.text.register_text_file_tasks` registers the objectives on text files a user
names. The CLI and gin files import what they need (`import t2t.data.tasks.glue` in a gin file);
a run that names a task no import registered imports only the module that owns the name
(`import_for`), found by its prefix.
"""

from __future__ import annotations

import importlib

from t2t.data import tf_setup

# Registration modules touch TensorFlow (TFDS metadata, vocabularies): keep it off accelerators
# from the start, before anything initializes its devices.
tf_setup.hide_accelerators_from_tensorflow()

MODULES = ("builtin", "c4", "glue", "superglue", "generation", "mixtures")


# Name prefix -> the module that registers names starting with it (first match wins).
_OWNERS_BY_PREFIX = (
    ("builtin_", "builtin"),
    ("c4_", "c4"),
    ("glue", "glue"),
    ("super_glue", "superglue"),
    ("dpr_", "superglue"),
    ("squad", "generation"),
    ("cnn_dailymail", "generation"),
    ("wmt_", "generation"),
    ("all_", "mixtures"),
    ("leave_one_out_", "mixtures"),
    ("supervised_", "mixtures"),
    ("large_supervised_", "mixtures"),
)


def module_for(name: str) -> str | None:
    """The registration module (of MODULES) that owns a task or mixture name, or None."""
    return next((module for prefix, module in _OWNERS_BY_PREFIX if name.startswith(prefix)), None)


def import_for(names) -> list[str]:
    """Imports the registration module owning each name (nothing else); returns those imported.

    A name no module owns is left for the registry's lookup to report, with the nearest names.
    """
    modules = sorted({m for m in map(module_for, names) if m is not None})
    for module in modules:
        importlib.import_module(f"{__name__}.{module}")
    return modules


def import_all() -> None:
    """Imports (and so registers) every registration module listed in MODULES."""
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
