"""Every command in README.md and docs/*.md is one a reader can type (issue 17 item 7).

- Every `zebra ...` command in a ```bash block is parsed by zebra's click command (`make_context` through the
  groups), so an unknown command, an unknown or renamed flag, a bad choice or a missing argument fails here.
- Every ```bash block is also executed, line by line in order, in a fresh folder (below), unless the line just
  before its fence says why it cannot run on a CPU offline: `<!-- docs-test: not run (REASON) -->`. A new block
  is picked up with no change here; docs/development.md states the rule.
- A block that reads an optional input (tests/optional_inputs.py, e.g. Debian's python3.11-doc) says so
  on the line before its fence, `<!-- docs-test: needs python3.11-doc -->`: it runs where the input is installed,
  skips elsewhere, and is required in CI.
- A fenced block without a language that holds a `zebra` command is an error: label it ```bash.

The folder a block runs in holds what the docs assume a reader has: `runs/tiny` (a short `zebra train tiny`,
shared with the chat and eval tests), `export/` (its HF export) and `prompt.txt`.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer._click.exceptions import ClickException, UsageError  # Typer's own copy of click

from zebra.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = r"<!-- docs-test: (?:not run \((?P<reason>[^)]+)\)|needs (?P<needs>[\w.-]+)) -->"
FENCE = re.compile(
    rf"(?:^{MARKER}\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```",
    re.M | re.S,
)
SHELL_SEPARATORS = {"&&", "||", ";", "|", "&"}
REDIRECTIONS = {">", ">>", "<"}


@dataclass(frozen=True)
class Block:
    doc: str  # README.md or docs/NAME.md
    line: int  # of the opening fence
    body: str
    not_run: str | None  # the reason given in the marker, or None: the block is executed
    needs: str | None = None  # the optional input it reads (a key of OPTIONAL_INPUTS)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def _blocks(lang: str = "bash") -> list[Block]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            if m["lang"] == lang:
                line = text.count("\n", 0, m.start("lang")) + 1
                found.append(Block(str(doc.relative_to(ROOT)), line, m["body"], m["reason"], m["needs"]))
    return found


def shell_lines(body: str) -> list[str]:
    """The block's commands, one per entry: continuation lines joined, blank and comment-only lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [line for line in joined.splitlines() if shlex.split(line, comments=True)]


def zebra_commands(line: str) -> list[list[str]]:
    """The arguments of every `zebra` command in a shell line (after &&, |, ;; without redirections, comments
    and leading VAR=value assignments)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands, words = [], []
    tokens = list(lexer)
    for i, token in enumerate([*tokens, ";"]):
        if token in SHELL_SEPARATORS:
            while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                words.pop(0)
            if words[:1] == ["zebra"]:
                commands.append(words[1:])
            words = []
        elif token in REDIRECTIONS or (i and tokens[i - 1] in REDIRECTIONS):
            continue
        else:
            words.append(token)
    return commands


ROOT_COMMAND = typer.main.get_command(app)


def parse(args: list[str]):
    """Parse ARGS as `zebra ARGS` does, down to the leaf command, without running anything: a group's
    make_context leaves the command name and its arguments in ctx._protected_args + ctx.args, as Typer's own
    group.invoke reads them."""
    command = ROOT_COMMAND
    ctx = command.make_context("zebra", list(args))
    while hasattr(command, "resolve_command"):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            raise UsageError(f"`{ctx.command_path}` needs a command", ctx=ctx)
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
    return ctx


DOC_COMMANDS = [
    pytest.param(args, id=f"{block.where} zebra {shlex.join(args)}"[:120])
    for block in _blocks()
    for line in shell_lines(block.body)
    for args in zebra_commands(line)
]


def test_the_docs_have_commands_to_check():
    assert len(DOC_COMMANDS) > 50
    assert {p.values[0][0] for p in DOC_COMMANDS} >= {"train", "convert", "eval", "chat", "data", "recipes"}


@pytest.mark.parametrize("args", DOC_COMMANDS)
def test_every_documented_command_parses(args):
    try:
        parse(args)
    except ClickException as e:
        pytest.fail(f"`zebra {shlex.join(args)}`: {e.format_message()}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "tiny", "--no-such-flag"], "No such option"),
        (["trian", "tiny"], "No such command"),
        (["jobs", "list", "[--json]"], "unexpected extra argument"),
        (["convert", "x", "--to"], "requires an argument"),
        (["recipes", "cp", "tiny"], "dest"),
        (["data", "nope"], "No such command"),
    ],
)
def test_the_parser_refuses_what_zebra_refuses(args, message):
    with pytest.raises(ClickException, match=message):
        parse(args)


def test_shell_lines_give_the_zebra_commands():
    body = "OMP_NUM_THREADS=1 zebra bench decode tiny \\\n  --new 32   # note\n# only a comment\n\n"
    body += "echo 'The zebra' | zebra generate export/ --file - > out.txt && zebra recipes list\n"
    lines = shell_lines(body)
    assert [zebra_commands(line) for line in lines] == [
        [["bench", "decode", "tiny", "--new", "32"]],
        [["generate", "export/", "--file", "-"], ["recipes", "list"]],
    ]


@pytest.mark.parametrize("lang", ["", "text", "console", "sh", "shell"])
def test_no_zebra_command_hides_in_an_unlabelled_block(lang):
    hidden = [
        f"{block.where}: {line}"
        for block in _blocks(lang)
        for line in block.body.splitlines()
        if line.startswith("zebra ")
    ]
    assert not hidden, "label these blocks ```bash so that tests/cli/test_docs_commands.py checks them"


@pytest.fixture(scope="session")
def docs_world(tmp_path_factory) -> Path:
    """What the docs assume a reader has: runs/tiny (with export/), export/ and prompt.txt."""
    from tests.generation.conftest import trained_tiny_run

    world = tmp_path_factory.mktemp("docs-world")
    run = trained_tiny_run(tmp_path_factory.getbasetemp())
    shutil.copytree(run, world / "runs" / "tiny", ignore=shutil.ignore_patterns("data_cache"))
    shutil.copytree(run / "export", world / "export")
    (world / "prompt.txt").write_text("Once upon a time")
    return world


def _runnable_blocks() -> list[Block]:
    """The blocks to execute, each list of commands once: a block whose commands repeat an earlier block's (its
    comments aside), as README.md's recipes tour repeats docs/recipes.md's, would run them again in the same
    folder."""
    first: dict[tuple, Block] = {}
    for block in _blocks():
        if block.not_run is None:
            commands = tuple(tuple(shlex.split(line, comments=True)) for line in shell_lines(block.body))
            first.setdefault(commands, block)
    return list(first.values())


RUN_BLOCKS = [
    pytest.param(block, id=block.where, marks=[pytest.mark.slow, *[pytest.mark.optional] * bool(block.needs)])
    for block in _runnable_blocks()
]


def test_every_marker_sits_on_the_line_before_a_bash_fence():
    misplaced = [
        f"{doc.relative_to(ROOT)}:{i + 1}"
        for doc in DOCS
        for i, (line, following) in enumerate(itertools.pairwise([*doc.read_text().splitlines(), ""]))
        if line.startswith("<!-- docs-test") and not (re.fullmatch(MARKER, line) and following == "```bash")
    ]
    assert not misplaced, (
        "a marker is `<!-- docs-test: not run (REASON) -->` or `<!-- docs-test: needs INPUT -->` right above a"
        " ```bash fence"
    )


def test_a_block_needs_only_known_optional_inputs():
    from optional_inputs import OPTIONAL_INPUTS

    unknown = [f"{b.where}: {b.needs}" for b in _blocks() if b.needs and b.needs not in OPTIONAL_INPUTS]
    assert not unknown, f"unknown optional inputs (known: {', '.join(OPTIONAL_INPUTS)})"


def test_some_blocks_run_and_every_other_says_why():
    assert len(RUN_BLOCKS) >= 4
    assert all(block.not_run.strip() for block in _blocks() if block.not_run is not None)


@pytest.mark.parametrize("block", RUN_BLOCKS)
def test_every_runnable_block_runs(block, docs_world, tmp_path):
    if block.needs:
        from optional_inputs import require_input

        require_input(block.needs)
    here = tmp_path / "here"
    shutil.copytree(docs_world, here)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "120",
    }
    for line in shell_lines(block.body):
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", line],
            cwd=here,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=600,
        )
        assert done.returncode == 0, (
            f"{block.where}: `{line}` exited {done.returncode}\n{done.stdout}{done.stderr}"
        )
