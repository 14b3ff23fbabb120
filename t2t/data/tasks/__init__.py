"""seqio task and mixture registrations, one module per family.

Importing `t2t.data.tasks` registers nothing. Each module registers its tasks when imported:
  - `builtin`:    objectives and supervised tasks on the built-in corpus (no download);
  - `c4`:         every pretraining objective on TFDS `c4/en`;
  - `glue`, `superglue`: GLUE and SuperGLUE (each sub-task, and the single concatenated mixture);
  - `generation`: SQuAD, CNN/Daily Mail, WMT En-De / En-Fr / En-Ro;
  - `mixtures`:   the paper's multi-task, leave-one-out and supervised-only mixtures.
`t2t.data.tasks.text.register_text_file_tasks` registers the objectives on text files a user
names. The CLI and gin files import what they need (`import t2t.data.tasks.glue` in a gin file).
"""

from __future__ import annotations

import importlib

from t2t.data import tf_setup

# Registration modules touch TensorFlow (TFDS metadata, vocabularies): keep it off accelerators
# from the start, before anything initializes its devices.
tf_setup.hide_accelerators_from_tensorflow()

MODULES = ("builtin", "c4", "glue", "superglue", "generation", "mixtures")


def import_all() -> None:
    """Imports (and so registers) every registration module listed in MODULES."""
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
