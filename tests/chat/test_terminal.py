"""`zebra chat` in a real terminal (pexpect pty): streams, obeys its commands, exits cleanly."""

from __future__ import annotations

import functools
import re
import signal
import subprocess
import sys

import pexpect
import pytest
from tests.generation.conftest import without_tokenizer
from typer.testing import CliRunner

from zebra.cli.main import app

PROMPT = ">>> "


def spawn_chat(export, *args: str) -> pexpect.spawn:
    """`zebra chat` on a pty as a terminal starts it: SIGINT at its default even when pytest itself runs with
    SIGINT ignored (a background job of a non-interactive shell), which the child would otherwise inherit."""
    child = pexpect.spawn(
        sys.executable,
        ["-m", "zebra.cli.main", "chat", str(export), "--device", "cpu", *args],
        encoding="utf-8",
        codec_errors="replace",
        timeout=180,
        dimensions=(50, 250),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    child.expect("zebra chat: plain continuation")
    child.expect_exact(PROMPT)
    return child


def zebra_in_process(*args: str):
    """`zebra ARGS` in this process -> click Result (where the test is not about the process itself)."""
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


@functools.cache
def generate(export, prompt: str, max_new: int) -> str:
    """What `zebra generate` prints at temperature 0 (in this process, once per set of arguments: the real
    process's stdout is tests/chat/test_session.py's)."""
    done = zebra_in_process("generate", str(export), "--prompt", prompt, "--max-new", str(max_new),
                            "--temperature", "0", "--device", "cpu")  # fmt: skip
    assert done.exit_code == 0, done.output
    return done.stdout


def reply_of(child: pexpect.spawn) -> str:
    child.expect_exact(PROMPT)
    return child.before


def quit_cleanly(child: pexpect.spawn) -> None:
    """`/quit` ends the chat with exit status 0."""
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_streams_obeys_commands_and_quits(trained_export):
    expected = generate(trained_export, "The zebra", 12)
    child = spawn_chat(trained_export, "--temperature", "0", "--max-new", "12")
    child.sendline("The zebra")
    child.expect_exact("The zebra")  # the echoed input line
    assert _clean(reply_of(child)) == _clean(expected)  # the same greedy text `zebra generate` writes

    child.sendline("/stats")
    stats = reply_of(child)
    assert "prefill 9 tok" in stats and "cache " in stats and "bytes" in stats and "tok/s" in stats

    child.sendline("/temp 0.8")
    assert "[temperature 0.8]" in reply_of(child)
    child.sendline("/temp -1")
    assert "usage: /temp" in reply_of(child)
    child.sendline("/max 3")
    assert "[max 3 new tokens]" in reply_of(child)
    child.sendline("hello")
    reply_of(child)
    child.sendline("/stats")
    decoded = int(re.search(r"decode (\d+) tok", reply_of(child)).group(1))
    assert 1 <= decoded <= 3  # /max 3 (fewer only when an end-of-text token came first)

    child.sendline("/system You are a zebra.")
    assert "[system prompt set; conversation reset]" in reply_of(child)
    child.sendline("/reset")
    assert "[conversation reset]" in reply_of(child)
    child.sendline("/stats")
    assert "context 0 tok" in reply_of(child)
    child.sendline("/nope")
    assert "unknown command /nope" in reply_of(child)
    quit_cleanly(child)


def test_ctrl_c_stops_the_reply_not_the_program(random_export):
    """Random weights at temperature 0 ramble on (no end-of-text token in the first thousands), so Ctrl-C lands
    mid-reply; an early end would fail the `[stopped]` expectation, not pass silently."""
    child = spawn_chat(random_export, "--temperature", "0", "--max-new", "100000")
    child.sendline("Tell me everything")
    child.expect_exact("Tell me everything")
    child.expect(r"\S{20}")  # the reply is streaming
    child.sendintr()
    child.expect_exact("[stopped]")
    child.expect_exact(PROMPT)
    child.sendline("/stats")
    stats = reply_of(child)
    assert "decode" in stats and "max 100000" in stats
    child.send("half-typed")  # the /quit below would not quit if Ctrl-C left this on the line
    child.expect_exact("half-typed")
    child.sendintr()  # Ctrl-C at the prompt only clears the line
    child.expect_exact("/quit or Ctrl-D")
    quit_cleanly(child)


def copy_run(run_dir, dest, *, age: float = 0.0):
    """A copy of the trained run at DEST (its folder `age` seconds older than now)."""
    import os
    import shutil
    import time

    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("data_cache"))
    os.utime(dest, (time.time() - age, time.time() - age))
    return dest


def spawn_in(cwd, *args: str) -> pexpect.spawn:
    return pexpect.spawn(
        sys.executable, ["-m", "zebra.cli.main", "chat", *args, "--device", "cpu"], cwd=cwd, encoding="utf-8",
        codec_errors="replace", timeout=180, dimensions=(50, 250),
    )  # fmt: skip


def test_no_model_and_one_here_asks_nothing_and_ctrl_d_exits_cleanly(trained_export, tmp_path):
    """`zebra chat` starts straight at the prompt; temperature and length have defaults (issue 17 item 4).
    Ctrl-D at the prompt ends it with status 0 and no traceback."""
    copy_run(trained_export.parent, tmp_path / "runs" / "mine")
    child = spawn_in(tmp_path)
    child.expect_exact("model: runs/mine")
    child.expect_exact(PROMPT)
    assert "?" not in child.before  # no question was asked
    child.sendline("/stats")
    assert "temperature 0.7; max 256]" in reply_of(child)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "Traceback" not in (child.before or "")


def test_no_model_and_several_on_a_terminal_asks_only_which(trained_export, tmp_path):
    copy_run(trained_export.parent, tmp_path / "runs" / "old", age=3600)
    copy_run(trained_export.parent, tmp_path / "runs" / "new")
    child = spawn_in(tmp_path, "--temperature", "0", "--max-new", "7")
    child.expect("Which model")
    child.expect_exact("runs/new")  # the newest is offered first
    child.send("\r")
    child.expect_exact(PROMPT)
    assert "Temperature" not in child.before and "Longest" not in child.before
    child.sendline("/stats")
    assert "temperature 0; max 7]" in reply_of(child)
    quit_cleanly(child)


def test_no_model_without_a_terminal_is_one_line(trained_export, tmp_path):
    chat = [sys.executable, "-m", "zebra.cli.main", "chat"]
    done = subprocess.run(chat, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert done.returncode == 1
    assert "missing MODEL" in done.stderr and "Traceback" not in done.stderr

    copy_run(trained_export.parent, tmp_path / "runs" / "a")
    copy_run(trained_export.parent, tmp_path / "runs" / "b", age=60)
    done = subprocess.run(chat, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "missing MODEL, and there are 2 candidates" in done.stderr
    assert "pass one of: runs/a, runs/b" in done.stderr


def test_an_export_without_tokenizer_files_takes_tokenizer(trained_export, tmp_path):
    """generate and chat on an export converted without a tokenizer (issue 17 item 2)."""
    bare = without_tokenizer(trained_export, tmp_path / "bare")
    generate_bare = ["generate", str(bare), "--prompt", "The zebra", "--max-new", "12", "--temperature", "0",
                     "--device", "cpu"]  # fmt: skip
    done = zebra_in_process(*generate_bare)
    assert done.exit_code == 1 and "Traceback" not in done.output
    assert f"MODEL {bare}: no tokenizer files" in done.stderr and "pass --tokenizer" in done.stderr
    done = zebra_in_process(*generate_bare, "--tokenizer", "byte")
    expected = generate(trained_export, "The zebra", 12)
    assert done.exit_code == 0 and done.stdout == expected

    child = spawn_in(tmp_path, str(bare), "--tokenizer", "byte", "--temperature", "0", "--max-new", "12")
    child.expect_exact(PROMPT)
    child.sendline("The zebra")
    child.expect_exact("The zebra")
    assert _clean(reply_of(child)) == _clean(expected)
    child.sendline("/quit")
    child.expect(pexpect.EOF)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", "a", "--file", "b"], "exactly one of --prompt and --file"),
        ([], "exactly one of --prompt"),
    ],
)
def test_generate_flag_errors(random_export, args, message):
    done = subprocess.run(
        [sys.executable, "-m", "zebra.cli.main", "generate", str(random_export), *args],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and message in done.stderr


@pytest.mark.parametrize(
    "command", [["generate", "--prompt", "The zebra"], ["chat"]], ids=["generate", "chat"]
)
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--top-p", "0"], "Invalid value for '--top-p': 0.0 is not in the range 0<x<=1"),
        (["--temperature", "inf"], "Invalid value for '--temperature': inf is not a finite number >= 0"),
        (["--temperature", "nan"], "Invalid value for '--temperature': nan is not a finite number >= 0"),
        (["--max-new", "99999999999999999999"], "Invalid value for '--max-new'"),
    ],
)
def test_flags_outside_the_engines_range_are_usage_errors(random_export, command, flags, message):
    """Refused while the flags are read, before the model loads (chat took them and failed at the first reply)."""
    name, *command_flags = command
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "zebra.cli.main",
            name,
            str(random_export),
            "--device",
            "cpu",
            *command_flags,
            *flags,
        ],
        input="The zebra\n/quit\n",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and message in " ".join(done.stderr.replace("│", "").split()), done.stderr


@pytest.mark.parametrize(
    "args",
    [["generate", "--prompt", "The zebra", "--max-new", "50"], ["chat"]],
    ids=["generate", "chat"],
)
def test_a_reader_that_left_ends_the_command_quietly(random_export, args):
    """`zebra generate ... | head -c 5`: stdout's reader has gone, so the next write fails; zebra ends as Unix
    tools do on SIGPIPE (status 141, nothing on stderr), not with the bug hint."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the first write: the failure does not depend on timing
    command, *flags = args
    done = subprocess.run(
        [sys.executable, "-m", "zebra.cli.main", command, str(random_export), "--device", "cpu", *flags],
        input="The zebra\n/quit\n",
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")


def _clean(text: str) -> str:
    return text.replace("\r", "").strip()
