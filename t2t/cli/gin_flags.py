"""The flags every gin-configured subcommand shares (gin files, search paths, --import, data
directories), their parsing into gin, and the small flag types (comma-separated ints, lengths)."""

from __future__ import annotations

import argparse
import os
import sys
import tokenize

from t2t.errors import UserError


def add_gin_flags(parser) -> None:
    """--gin_file, --gin_search_paths and --import; `--gin.NAME=VALUE` is gathered by `main`."""
    parser.add_argument(
        "--gin_file",
        action="append",
        default=[],
        help="gin file configuring the run (repeatable, parsed in order), e.g. "
        "gin/experiments/tiny_builtin_demo.gin",
    )
    parser.add_argument(
        "--gin_search_paths",
        action="append",
        default=[],
        help="directories to look up gin files and their includes in "
        "(repeatable or comma-separated; the checkout's gin/ is always searched)",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        help="a Python module to import first, e.g. one registering your tasks "
        "(repeatable; the working directory is searched; gin files may also "
        "`import` them)",
    )
    parser.add_argument(
        "--tfds_data_dir",
        help="where TFDS datasets are prepared (default $TFDS_DATA_DIR or "
        "~/tensorflow_datasets); prepare one with `tfds build NAME --data_dir=DIR`",
    )
    parser.add_argument(
        "--seqio_cache_dir",
        dest="seqio_cache_dirs",
        action="append",
        default=[],
        help="a seqio cache root written by `t2t cache --task` "
        "(repeatable), read by tasks with use_cached=True",
    )
    parser.epilog = (
        "Gin bindings: --gin.NAME=VALUE (e.g. --gin.MODEL_DIR=\"'/tmp/run'\"). "
        "Flags override gin bindings of the same argument. --traceback shows the "
        "stack of an error; --verbose keeps the libraries' own log lines."
    )


def configure(args, *, finalize: bool = True) -> None:
    """Imports the --import modules, then parses the gin files and --gin.NAME=VALUE bindings.

    `finalize=False` leaves required macros of runs that are not called (MODEL_DIR for
    `t2t compile`) unchecked."""
    import importlib

    from t2t import runs

    if args.imports and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # `--import mytasks` finds ./mytasks.py, as python -m
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise UserError(
                f"--import {module}: {type(error).__name__}: {error}. The module must be "
                "importable from the working directory or $PYTHONPATH (e.g. ./mytasks.py for "
                "--import mytasks, or an installed package)."
            ) from error
    if getattr(args, "tfds_data_dir", None):
        import seqio

        seqio.set_tfds_data_dir_override(args.tfds_data_dir)
        os.environ["TFDS_DATA_DIR"] = args.tfds_data_dir
    if getattr(args, "seqio_cache_dirs", None):
        import seqio

        seqio.add_global_cache_dirs(
            [d for item in args.seqio_cache_dirs for d in item.split(",") if d]
        )
    paths = [p for item in args.gin_search_paths for p in item.split(",") if p]
    try:
        runs.configure(args.gin_file, args.gin_bindings, paths, finalize=finalize)
    except tokenize.TokenError as error:  # e.g. a bracket never closed: gin reads to the end
        raise ValueError(
            f"gin could not parse {_unbalanced(args.gin_file, args.gin_bindings, paths)}: "
            f"{error.args[0]} (a bracket or quote opened and never closed)."
        ) from None
    except SyntaxError as error:  # gin could not parse a file or a --gin.NAME=VALUE binding
        where = f"{error.filename}, line {error.lineno}" if error.filename else "a binding"
        # gin's message ends with its own reason ("Failed to parse token 'runs'"); the lines
        # before it repeat Python's parser, object addresses included.
        reason = ((error.msg or "").strip().splitlines() or ["invalid syntax"])[-1].strip()
        quote = (
            "quote strings, e.g. MODEL_DIR = 'runs/x'"
            if error.filename
            else "quote strings inside the flag, e.g. --gin.MODEL_DIR=\"'runs/x'\""
        )
        raise ValueError(
            f"gin could not parse {where}: {(error.text or '').strip()!r} ({reason.rstrip('.')}). "
            f"Values are Python literals, %MACROS or @references: {quote}."
        ) from error


def _unbalanced(gin_files: list[str], bindings: list[str], search_paths: list[str]) -> str:
    """Which gin file (or binding) has a bracket or string left open."""
    import io

    from t2t import runs

    def opens_unclosed(text: str) -> bool:
        try:
            list(tokenize.generate_tokens(io.StringIO(text).readline))
        except tokenize.TokenError:
            return True
        except SyntaxError:
            return False
        return False

    for binding in bindings:
        if opens_unclosed(binding):
            return f"the binding --gin.{binding.replace(' = ', '=', 1)}"
    for name in gin_files:
        for root in ["", *search_paths, *runs.default_search_paths()]:
            path = os.path.join(root, name)
            if os.path.isfile(path):  # local path: gin reads local files
                with open(path) as f:  # local path: gin reads local files
                    if opens_unclosed(f.read()):
                        return path
                break
    return "a gin file included by " + ", ".join(gin_files)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def lengths(text: str) -> dict[str, int]:
    """'inputs=512,targets=114' -> {"inputs": 512, "targets": 114}."""
    try:
        return {k.strip(): int(v) for k, v in (item.split("=") for item in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected FEATURE=LENGTH[,FEATURE=LENGTH], e.g. inputs=512,targets=114; got {text!r}"
        ) from None
