"""The rule of `t2t.files`: Python's `open`, `os`, `glob` and `shutil` touch only files t2t makes
for itself (temporary files, its own cache, its package's data), never a path a user gives,
which may be in a bucket. Every call of theirs in the library is either gone through the layer or
marked `# local path: WHY` on its line (the why is read in review). A call added without either
fails here."""

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("t2t", "preprocessors", "c4_pipeline")
EXEMPT = {"t2t/files.py"}  # the layer itself
EXEMPT_DIRS = ("t2t/testing/",)  # the emulator: its own certificate files
MARK = "# local path:"

OS_CALLS = {
    "makedirs", "mkdir", "rename", "replace", "remove", "unlink", "listdir", "scandir", "walk",
    "stat", "rmdir", "link", "symlink", "chmod", "open",
}  # fmt: skip
OS_PATH_CALLS = {
    "exists", "isdir", "isfile", "islink", "lexists", "getsize", "getmtime", "abspath",
    "realpath", "normpath",
}  # fmt: skip


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _file_system_call(call: ast.Call) -> str | None:
    name = _dotted(call.func)
    head, _, last = name.rpartition(".")
    if name == "open":
        return name
    if head == "os" and last in OS_CALLS or head == "os.path" and last in OS_PATH_CALLS:
        return name
    if head in ("glob", "shutil") or name.startswith(("tf.io.gfile.", "tensorflow.io.gfile.")):
        return name
    return None


def unmarked_calls(root: str = REPO) -> list[str]:
    found = []
    for package in PACKAGES:
        for directory, _, names in os.walk(os.path.join(root, package)):
            for name in names:
                path = os.path.join(directory, name)
                relative = os.path.relpath(path, root).replace(os.sep, "/")
                if not name.endswith(".py") or relative in EXEMPT:
                    continue
                if relative.startswith(EXEMPT_DIRS):
                    continue
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                lines = source.splitlines()
                for node in ast.walk(ast.parse(source)):
                    if isinstance(node, ast.Call) and _file_system_call(node):
                        span = lines[node.lineno - 1 : (node.end_lineno or node.lineno)]
                        if not any(MARK in line for line in span):
                            found.append(f"{relative}:{node.lineno}: {_file_system_call(node)}")
    return found


def test_no_user_path_is_touched_without_the_layer():
    found = unmarked_calls()
    assert not found, (
        "These calls bypass t2t.files (use it for any path a user gives; mark a file t2t makes "
        f"for itself with '{MARK} why' on the line):\n" + "\n".join(found)
    )


def test_the_rule_sees_the_calls_it_forbids(tmp_path):
    package = tmp_path / "t2t"
    package.mkdir()
    (package / "module.py").write_text(
        "import os, glob, shutil\nimport tensorflow as tf\n"
        "open(p)\nos.makedirs(p)\nos.path.exists(p)\nglob.glob(p)\nshutil.copyfile(a, b)\n"
        "tf.io.gfile.exists(p)\nos.path.join(a, b)\n"
        "open(own)  # local path: a temporary file\n"
    )
    assert [line.split(": ")[1] for line in unmarked_calls(str(tmp_path))] == [
        "open",
        "os.makedirs",
        "os.path.exists",
        "glob.glob",
        "shutil.copyfile",
        "tf.io.gfile.exists",
    ]
