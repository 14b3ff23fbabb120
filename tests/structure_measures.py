"""Measures of the code's structure that issue reviews ask for, printed as a table.

    python tests/structure_measures.py            # the library (t2t/) and benchmarks/

- places one plain run option is written: occurrences of `log_every` in t2t/ (signature,
  docstrings, fields, checks, uses);
- calls from the `t2t` console script to the compiled train step: the library's frames on the
  stack when the jitted step is first called, in a 2-step run of the tiny preset;
- lines of benchmarks/*.py, functions over 60 and over 40 lines (with and without their
  docstrings), files over 500 lines.
"""

from __future__ import annotations

import ast
import os
import pathlib
import sys
import tempfile
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _python_files(folder: str) -> list[pathlib.Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "_shipped" not in p.parts)


def function_lengths(folder: str = "t2t", *, docstrings: bool = True) -> list[tuple[int, str]]:
    """(lines, "path:name") of every function and method, longest first; without its docstring's
    lines when `docstrings` is False (the code a reader follows)."""
    found = []
    for path in _python_files(folder):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                first = node.body[0]
                if not docstrings and isinstance(first, ast.Expr):
                    if isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                        lines -= first.end_lineno - first.lineno + 1
                found.append((lines, f"{path.relative_to(ROOT)}:{node.name}"))
    return sorted(found, reverse=True)


def option_places(name: str = "log_every") -> int:
    return sum(p.read_text().count(name) for p in _python_files("t2t"))


def calls_to_step() -> str:
    """The library's frames between the console script and the jitted train step's first call."""
    from t2t import cli
    from t2t.trainer import loop

    frames: list[str] = []
    original = loop.Trainer._compile

    def recording(self, *args):
        compiled = original(self, *args)

        def call(*a):
            if not frames:
                stack = traceback.extract_stack()[:-1]
                library = [f for f in stack if f"{os.sep}t2t{os.sep}" in f.filename]
                frames.append(" -> ".join(f.name for f in library))
            return compiled(*a)

        return call

    loop.Trainer._compile = recording
    with tempfile.TemporaryDirectory() as tmp:
        sys.argv = [
            "t2t",
            "train",
            "--gin_file=gin/experiments/tiny_builtin_demo.gin",
            f"--gin.MODEL_DIR='{tmp}/run'",
            "--gin.TRAIN_STEPS=2",
            "--gin.t2t.runs.EvalOptions.every=None",
            "--gin.EVAL_TASKS=[]",
            "--gin.t2t.runs.EvalOptions.num_predictions=0",
        ]
        code = cli.main()
    loop.Trainer._compile = original
    assert code == 0 and frames, code
    return frames[0]


def main() -> None:
    os.chdir(ROOT)
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or ".").resolve() != ROOT / "tests"]
    lengths = function_lengths()
    code = function_lengths(docstrings=False)
    chain = calls_to_step()
    files = [(len(p.read_text().splitlines()), p) for p in _python_files("t2t")]
    benchmarks = sum(len(p.read_text().splitlines()) for p in _python_files("benchmarks"))
    rows = [
        ("places `log_every` is written in t2t/", option_places()),
        ("library frames from `t2t train` to the jitted step", len(chain.split(" -> "))),
        ("lines of benchmarks/*.py", benchmarks),
        ("functions over 60 lines", sum(n > 60 for n, _ in lengths)),
        ("functions over 40 lines", sum(n > 40 for n, _ in lengths)),
        ("functions over 60 lines, docstring excluded", sum(n > 60 for n, _ in code)),
        ("functions over 40 lines, docstring excluded", sum(n > 40 for n, _ in code)),
        ("files over 500 lines", sum(n > 500 for n, _ in files)),
    ]
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(f"\nfrom the console script to the step: {chain}")
    print("longest functions:", ", ".join(f"{name} ({n})" for n, name in lengths[:8]))


if __name__ == "__main__":
    main()
