"""The README and docs/ against the code: every `t2t` command line they show parses with the
current CLI (its subcommand and flags exist), and every gin binding they show names a real
parameter of a registered configurable, or a macro some gin file uses. A renamed flag or option
fails here instead of in a reader's terminal."""

import glob
import inspect
import os
import re
import shlex
import subprocess
import sys

import gin
import pytest

from t2t import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.relpath(p, REPO) for p in glob.glob(f"{REPO}/docs/*.md"))]
FENCE = re.compile(r"```([a-z]*)\n(.*?)```", re.S)


def _blocks(text, skip=("python",)):
    """The fenced code blocks of `text`, but those in a language of `skip`."""
    return [body for language, body in FENCE.findall(text) if language not in skip]


INLINE = re.compile(r"(?<!`)`([^`]+?)`(?!`)")  # may wrap onto the next line of a paragraph
# A binding as the docs write it: `name = value` (or `name=value`) with a dotted name, a
# configurable's parameter; or `NAME = value`, spaced, a macro (`NAME=value` unspaced is an
# environment variable).
BINDING = re.compile(
    r"^(?:((?:[A-Za-z_]\w*/)?[A-Za-z_][\w.]*\.[a-z_]\w*) ?= ?|([A-Z][A-Z0-9_]+) = )(\S.*)$"
)


def _text(path):
    with open(os.path.join(REPO, path)) as f:
        return f.read()


def _inline(text):
    """The inline code spans outside code blocks, each on one line."""
    prose = FENCE.sub("", text)
    return [" ".join(span.split()) for span in INLINE.findall(prose) if "\n\n" not in span]


def _command_lines(text):
    """("block", line) for each `t2t ...` command of the code blocks (continuation lines joined,
    after `&&`, `;` or environment assignments), ("inline", span) for each inline code span
    naming one; a command's output ("t2t check: error: ...") is neither."""
    found = []
    for block in _blocks(text, skip=()):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0]
            found += [("block", part) for part in re.split(r"&&|;|\|", line)]
    found += [("inline", span) for span in _inline(text)]
    commands = []
    for kind, part in found:
        part = part.strip()
        match = re.search(r"(?:^|\s|/)t2t ([a-z_]+(?:\s.*)?)$", part)
        if match and not part.startswith(("python", "pip", "import", "from")):
            commands.append((kind, "t2t " + match.group(1).strip()))
    return commands


def _argv(command):
    try:
        words = shlex.split(command)[1:]
    except ValueError:  # inside a quoted `gcloud ... --command="..."`: its closing quote
        words = shlex.split(command[:-1] if command.endswith('"') else command)[1:]
    words = [w.strip("[]") for w in words]  # "[--beam_size=4]": an optional flag
    return [w for w in words if w not in ("", "...", "…") and not w.startswith("$(")]


def _all_commands():
    return [(path, kind, command) for path in DOCS for kind, command in _command_lines(_text(path))]


COMMANDS = _all_commands()


def test_the_docs_show_commands_and_bindings_to_check():
    """The checks below find what they check: tens of command lines in code blocks, of inline
    spans naming a command and of bindings."""
    assert sum(kind == "block" for _, kind, _ in COMMANDS) > 25
    assert sum(kind == "inline" for _, kind, _ in COMMANDS) > 50
    assert len(_all_bindings()) > 30


def _subparser(name):
    (commands,) = [a for a in cli.build_parser()._actions if a.dest == "command"]
    return commands.choices.get(name)


@pytest.mark.parametrize("path, kind, command", COMMANDS)
def test_every_t2t_command_in_the_docs_parses(path, kind, command, capsys):
    """A command line of a code block parses whole; an inline span (prose naming a command
    and some of its flags) names a subcommand that exists and flags it has."""
    argv, _ = cli.split_gin_bindings(_argv(command))
    parser = _subparser(argv[0])
    assert parser is not None, f"{path}: `{command}`: no command `t2t {argv[0]}`"
    if kind == "inline":
        flags = [word.split("=", 1)[0] for word in argv[1:] if word.startswith("--")]
        unknown = [flag for flag in flags if flag not in parser._option_string_actions]
        assert not unknown, f"{path}: `{command}`: t2t {argv[0]} has no flags {unknown}"
        return
    try:
        cli.build_parser().parse_args(argv)
    except SystemExit as stopped:
        error = capsys.readouterr().err.strip().splitlines()[-1:]
        pytest.fail(f"{path}: `{command}` does not parse ({stopped.code}): {error}")


def _bindings_of(text):
    found = []
    for _, command in _command_lines(text):
        _, bindings = cli.split_gin_bindings(_argv(command))
        found += bindings
    for span in [*_inline(text), *"\n".join(_blocks(text)).splitlines()]:
        match = BINDING.match(span.strip())
        if match:
            found.append(span.strip())
    return found


def _all_bindings():
    return [(path, binding) for path in DOCS for binding in _bindings_of(_text(path))]


@pytest.fixture(scope="module")
def registry():
    from t2t import runs  # noqa: F401 (registers the configurables the gin files use)
    from t2t.data.tasks import builtin  # noqa: F401
    from t2t.studies import runner  # noqa: F401

    macros = set()
    for path in glob.glob(f"{REPO}/gin/**/*.gin", recursive=True):
        with open(path) as f:
            text = f.read()
        macros |= set(re.findall(r"%([A-Z][A-Z0-9_]+)", text))
        macros |= set(re.findall(r"^([A-Z][A-Z0-9_]+)\s*=", text, re.M))
    return macros


def _parameters(configurable):
    target = configurable.wrapped
    if inspect.isclass(target):
        target = target.__init__
    signature = inspect.signature(target)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    return set(signature.parameters), takes_any


@pytest.mark.parametrize("path, binding", _all_bindings())
def test_every_gin_binding_in_the_docs_names_a_real_parameter(path, binding, registry):
    match = BINDING.match(binding)
    name = (match.group(1) or match.group(2)) if match else binding.split("=")[0]
    name = name.strip().split("/")[-1]
    if "." not in name:  # a macro
        assert name in registry, f"{path}: `{binding}`: no gin file uses the macro {name}"
        return
    configurable_name, parameter = name.rsplit(".", 1)
    try:
        configurable = gin.config._REGISTRY.get_match(configurable_name)
    except (KeyError, ValueError) as error:
        pytest.fail(f"{path}: `{binding}`: {error}")
    if configurable is None:
        pytest.fail(f"{path}: `{binding}`: no configurable named {configurable_name!r}")
    names, takes_any = _parameters(configurable)
    assert takes_any or parameter in names, (
        f"{path}: `{binding}`: {configurable_name} has no parameter {parameter!r} "
        f"(it has {sorted(names - {'self'})})"
    )


def test_the_task_and_mixture_counts_in_the_docs_are_the_registrys():
    """Counted in a fresh interpreter: this process's registry also holds the tasks other test
    files register."""
    count = (
        "import seqio\n"
        "from t2t.data import tasks\n"
        "tasks.import_all()\n"
        "print(len(seqio.TaskRegistry.names()), len(seqio.MixtureRegistry.names()))\n"
    )
    done = subprocess.run([sys.executable, "-c", count], capture_output=True, text=True, check=True)
    registered = tuple(int(n) for n in done.stdout.split()[-2:])
    stated = re.search(r"registers all (\d+) tasks\s+and (\d+) mixtures", _text("docs/data.md"))
    assert stated, "docs/data.md no longer says how many tasks import_all registers"
    assert (int(stated[1]), int(stated[2])) == registered
