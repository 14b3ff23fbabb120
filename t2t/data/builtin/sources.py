"""Raw documentation text from the running Python interpreter, gathered without side effects.

Standard-library docstrings are read by parsing source files with `ast` (no import runs any
module code). Modules written in C have no source, so a short allow-list of them (`builtins`,
`math`, ...) is imported: importing these runs no user-visible code. The walk is sorted, so
the same interpreter always yields the same docstrings in the same order.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import sysconfig
from collections.abc import Iterator

# Directories of the standard library that hold tests, tools, vendored code or build files
# rather than library documentation.
_SKIPPED_DIRS = frozenset(
    {
        "__pycache__",
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "lib2to3",
        "turtledemo",
        "ensurepip",
        "lib-dynload",
        "__phello__",
        "encodings",
    }
)
_SKIPPED_FILES = frozenset({"this.py", "antigravity.py", "__hello__.py"})
# C modules whose import has no side effect; their docstrings exist only at run time.
_C_MODULES = ("builtins", "math", "cmath", "itertools", "time", "gc", "sys", "marshal")


@dataclasses.dataclass(frozen=True)
class Docstring:
    """A docstring and where it came from.

    Attributes:
      module: dotted module name (`email.mime.text`).
      qualname: the documented object inside the module ('' for the module itself,
        `Class.method` for a method).
      text: the docstring with common indentation removed (`inspect.cleandoc`).
    """

    module: str
    qualname: str
    text: str

    @property
    def package(self) -> str:
        """The top-level package (`email` for `email.mime.text`)."""
        return self.module.split(".")[0]


def pydoc_topics() -> list[tuple[str, str]]:
    """The `pydoc_data` topics as sorted (name, text) pairs."""
    from pydoc_data import topics

    return sorted(topics.topics.items())


def stdlib_docstrings(stdlib_dir: str | None = None) -> Iterator[Docstring]:
    """Yields every docstring of the standard library (source modules, then C modules)."""
    stdlib_dir = stdlib_dir or sysconfig.get_paths()["stdlib"]
    for path, module in _source_modules(stdlib_dir):
        yield from _source_docstrings(path, module)
    for module in _C_MODULES:
        yield from _runtime_docstrings(module)


def _source_modules(stdlib_dir: str) -> Iterator[tuple[str, str]]:
    for root, dirs, files in os.walk(stdlib_dir):  # local path: Python's own docs
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith("config-"))
        relative = os.path.relpath(root, stdlib_dir)
        package = [] if relative == "." else relative.split(os.sep)
        for name in sorted(files):
            if (
                not name.endswith(".py")
                or name in _SKIPPED_FILES
                or name.startswith("_sysconfigdata")
            ):
                continue
            stem = name[: -len(".py")]
            parts = package if stem == "__init__" else package + [stem]
            if parts:
                yield os.path.join(root, name), ".".join(parts)


def _source_docstrings(path: str, module: str) -> Iterator[Docstring]:
    try:
        with open(path, encoding="utf-8") as f:  # local path: Python's own docs
            tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return  # a few stdlib files are templates or in other encodings: not documentation
    yield from _node_docstrings(tree, module, prefix="")


def _node_docstrings(node: ast.AST, module: str, prefix: str) -> Iterator[Docstring]:
    text = ast.get_docstring(node, clean=True)
    if text:
        yield Docstring(module, prefix, text)
    for child in node.body:
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{child.name}" if prefix else child.name
            yield from _node_docstrings(child, module, name)


def _runtime_docstrings(module_name: str) -> Iterator[Docstring]:
    module = importlib.import_module(module_name)
    if module.__doc__:
        yield Docstring(module_name, "", inspect.cleandoc(module.__doc__))
    for name in sorted(vars(module)):
        value = vars(module)[name]
        if name.startswith("_") or not (inspect.isclass(value) or callable(value)):
            continue
        if isinstance(value.__doc__, str):
            yield Docstring(module_name, name, inspect.cleandoc(value.__doc__))
        if inspect.isclass(value):
            for attribute in sorted(vars(value)):
                member = vars(value)[attribute]
                doc = getattr(member, "__doc__", None)
                if not attribute.startswith("_") and callable(member) and isinstance(doc, str):
                    yield Docstring(module_name, f"{name}.{attribute}", inspect.cleandoc(doc))
