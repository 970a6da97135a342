"""The interactive chat loop: read a line, run a command or a turn, stream the reply.

Ctrl-C during a reply stops that reply (the conversation keeps what was shown); Ctrl-C at the prompt clears the
line; Ctrl-D or /quit ends the session.
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import TextIO

from zebra.chat import MAX_NEW_TOKENS
from zebra.chat.session import ChatSession
from zebra.generation import CacheFullError
from zebra.generation.finite import NonFiniteLogits

REPLACEMENT = "\ufffd"  # what a byte that is not UTF-8 reads as

HELP = """commands:
  /reset         forget the conversation (keeps the system prompt)
  /system TEXT   set the system prompt and start over (/system alone clears it)
  /temp X        sampling temperature (0 = greedy)
  /max N         longest reply in tokens
  /stats         speed of the last turn and the size of the cache
  /help          this list
  /quit          leave (or Ctrl-D)"""


class Repl:
    """Drives a `ChatSession` from `read_line` (raises EOFError at the end) and writes to `stream`."""

    def __init__(
        self,
        session: ChatSession,
        *,
        read_line: Callable[[str], str] = input,
        stream: TextIO | None = None,
        prompt: str = ">>> ",
    ):
        self.session = session
        self.read_line = read_line
        self.stream = stream or sys.stdout
        self.prompt = prompt
        self.told_replacement = False  # bytes that are not UTF-8 (read as U+FFFD) are told once

    def run(self) -> None:
        mode = "chat template" if self.session.templated else "plain continuation (no chat template)"
        s = self.session.settings
        self._say(
            f"zebra chat: {mode}; temperature {s.temperature:g} (/temp X), replies up to {s.max_new_tokens} "
            "tokens (/max N); /help for commands, /quit or Ctrl-D to leave"
        )
        while True:
            try:
                line = self.read_line(self.prompt)
            except EOFError:
                self._say("")
                return
            except KeyboardInterrupt:
                self._say("^C (/quit or Ctrl-D to leave)")
                continue
            except (
                UnicodeDecodeError
            ):  # a stdin that was not set to replace them: the line is lost, not the chat
                self._say("[that line was not UTF-8 text; type it again]")
                continue
            if REPLACEMENT in line and not self.told_replacement:
                self.told_replacement = True
                self._say(f"[bytes that are not UTF-8 were read as {REPLACEMENT}]")
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not self.command(line):
                    return
                continue
            self.turn(line)

    def command(self, line: str) -> bool:
        """Run one slash command; False means quit."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        s = self.session.settings
        if name in ("/quit", "/exit"):
            return False
        if name == "/reset":
            self.session.reset()
            self._say("[conversation reset]")
        elif name == "/system":
            self.session.set_system(arg or None)
            self._say("[system prompt set; conversation reset]" if arg else "[system prompt cleared]")
        elif name == "/temp":
            value = _number(arg, float)
            if value is None or not (math.isfinite(value) and value >= 0):
                self._say("[usage: /temp X with X a finite number >= 0, e.g. /temp 0.7; 0 is greedy]")
            else:
                s.temperature = value
                self._say(f"[temperature {value:g}]")
        elif name == "/max":
            value = _number(arg, int)
            if value is None or not 1 <= value <= MAX_NEW_TOKENS:
                self._say(f"[usage: /max N with 1 <= N <= {MAX_NEW_TOKENS:,}, e.g. /max 200]")
            else:
                s.max_new_tokens = value
                self._say(f"[max {value} new tokens]")
        elif name == "/stats":
            self._say(self.stats_line())
        elif name == "/help":
            self._say(HELP)
        else:
            self._say(f"[unknown command {name}; /help lists them]")
        return True

    def stats_line(self) -> str:
        st = self.session.last
        return (
            f"[prefill {st.prefill_tokens} tok at {st.prefill_tokens_per_s:.1f} tok/s; "
            f"decode {st.new_tokens} tok at {st.decode_tokens_per_s:.1f} tok/s; "
            f"context {self.session.context_tokens} tok; "
            f"cache {self.session.engine.cache_bytes(self.session.state):,} bytes; "
            f"temperature {self.session.settings.temperature:g}; max {self.session.settings.max_new_tokens}]"
        )

    def turn(self, text: str) -> None:
        with _stop_on_sigint() as stop:
            try:
                for piece in self.session.send(text, should_stop=stop.is_set, on_note=self._note):
                    self.stream.write(piece)
                    self.stream.flush()
            # a safety net: the session keeps every turn within the context and the cache
            except CacheFullError:
                self._say(
                    f"\n[the context is full ({self.session.context_tokens} tokens); conversation reset]"
                )
                self.session.reset()
                return
            except NonFiniteLogits as e:  # the session lives on: the turn is dropped, not the conversation
                kept = "the conversation is as before it" if self.session.kept else "conversation reset"
                self._say(f"\n[error: {e.message}; hint: {e.fix}; {kept}]")
                return
            stopped = stop.is_set()
        self.stream.write("\n")
        if stopped:
            self._say("[stopped]")
        if self.session.last.context_full:
            self._say(
                f"[the context of {self.session.engine.context} tokens is full; the next message starts a new "
                "conversation]"
            )
        self.stream.flush()

    def _note(self, text: str) -> None:
        self._say(f"[{text}]")

    def _say(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def _number(text: str, kind: type) -> float | int | None:
    try:
        return kind(text)
    except ValueError:
        return None


@contextmanager
def _stop_on_sigint():
    """While a reply streams, Ctrl-C sets an event (checked between tokens) instead of raising."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
