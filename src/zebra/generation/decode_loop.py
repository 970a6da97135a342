"""The host side of a decode: choose, feed and stream token columns without waiting on the device every token.

Per step the device chooses every row's next token (`TokenChooser.choose`: sampling, stop ids and token budgets
all on the device, replayed from a CUDA graph on a static runner), copies it to a pinned host buffer
asynchronously, and feeds it to the next step from the device tensor. The host reads a column of tokens only
after it has launched the step that feeds it, so stop checks lag one step behind the device:

    choose token i -> copy it to the host -> launch step i (feeds token i) -> read token i -> yield it -> ...

The step launched before the host saw token i is harmless when token i ended the stream: the chooser has already
set the cache's feed flag to False when every row stopped (a stop id or the token budget), so that step leaves the
cache as it was, and nothing past a stop is ever output. Runners without a feed flag (`lagged = False`: the
dynamic cache) read each token before launching its step instead.

What the state holds afterwards (exact for batch 1, which is what a chat continues): `length` counts the tokens
in the cache, `logits` are those after its last token (None when the last step was not fed), and `unfed` is the
last output token when the cache does not hold it yet (it stopped the row, or the stream ended before its step).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence

import torch

from zebra.core.host_copy import HostCopy
from zebra.generation.decode_step import DecodeRunner
from zebra.generation.finite import nonfinite_logits
from zebra.generation.state import DecodeState
from zebra.generation.token_sampling import SamplingParams, TokenChooser, row_budgets


class _Rows:
    """Host bookkeeping of every row: prompt tokens still to feed, tokens output (of its budget), stopped or not."""

    def __init__(
        self, forced_lengths: Sequence[int], max_new_tokens: int | Sequence[int], stop_ids: Collection[int]
    ):
        self.forced = list(forced_lengths)
        self.max_new = row_budgets(max_new_tokens, len(self.forced))
        self.stop_ids = frozenset(stop_ids)
        self.produced = [0] * len(self.forced)
        self.done = [budget <= 0 for budget in self.max_new]

    def all_done(self) -> bool:
        return all(self.done)

    def all_done_after(self, i: int) -> bool:
        """Every row is done once token i is out, whatever its value (budgets only; stop ids are not known)."""
        rows = zip(self.done, self.forced, self.produced, self.max_new, strict=True)
        return all(done or (forced <= i and made + 1 >= most) for done, forced, made, most in rows)

    def take(self, i: int, tokens: list[int]) -> list[int | None]:
        """Record token column i; returns what each row outputs (None: still in its prompt, or done)."""
        column: list[int | None] = [None] * len(tokens)
        for b, token in enumerate(tokens):
            if self.done[b] or i < self.forced[b]:
                continue
            column[b] = token
            self.produced[b] += 1
            self.done[b] = token in self.stop_ids or self.produced[b] >= self.max_new[b]
        return column


class DecodeLoop:
    """One decode call on `state` (see the module docstring); iterate it for the token columns.

    Args:
        runner: the engine's runner (its `lagged` decides whether stop checks may lag a step; they do not when
            the cache has no room for a step ahead).
        state: a prefilled state (`state.logits` set).
        forced: per row, the prompt tokens it still feeds before it outputs (longer prompts in a batch).
        max_new_tokens: tokens each row may output: one budget for all rows, or one per row.
        sampling: how tokens are chosen.
        stop_ids: tokens that end a row (output, never fed).
        seed: the device generator's seed.
        should_stop: checked between tokens; True ends the stream (every token output so far is then fed on a
            lagged runner, all but the last otherwise: `state.unfed` says which).
    """

    def __init__(
        self,
        runner: DecodeRunner,
        state: DecodeState,
        forced: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingParams,
        stop_ids: Collection[int],
        seed: int,
        should_stop: Callable[[], bool] | None,
    ):
        self.runner, self.state = runner, state
        self.should_stop = should_stop or (lambda: False)
        self.rows = _Rows([len(f) for f in forced], max_new_tokens, stop_ids)
        self.chooser: TokenChooser = runner.chooser(state, sampling, stop_ids, max_new_tokens, seed)
        self.host = HostCopy((state.batch,), torch.long, runner.device)  # the chosen tokens on their way
        width = max(self.rows.forced)
        device = runner.device
        padded = [list(f) + [0] * (width - len(f)) for f in forced]
        self.forced_tokens = torch.tensor(padded, dtype=torch.long, device=device)  # [B, F]
        self.forced_lengths = torch.tensor(self.rows.forced, device=device)  # [B]

    def __iter__(self) -> Iterator[list[int | None]]:
        lagged, state = self.runner.lagged, self.state
        state.unfed = None
        try:
            i = 0
            while not self.rows.all_done() and not self.should_stop():
                self._choose(i)
                ahead = lagged and not self.rows.all_done_after(i) and state.has_room(1)
                if (
                    ahead
                ):  # step i goes before token i is read; the feed flag voids it if token i ends the stream
                    self._feed()
                column = self.rows.take(i, self._read(i))
                fed = ahead and not self.rows.all_done()
                if ahead and not fed:  # the chooser stopped every row: that step did not enter the cache
                    self.runner.retract(state)
                    state.length -= 1
                    state.logits = None
                state.unfed = None if fed or state.batch != 1 else column[0]
                if any(t is not None for t in column):
                    yield column
                if not ahead and not self.rows.all_done() and not self.should_stop():
                    self._feed()  # a full cache raises CacheFullError here, after the token was output
                    state.unfed = None
                i += 1
        finally:
            self.runner.finish(state, self.chooser)

    def _choose(self, i: int) -> None:
        """Choose token column i on the device (prompt tokens where a row is still feeding its prompt) and start
        its copy to the host."""
        chooser = self.chooser
        width = self.forced_tokens.shape[1]
        if i <= width and width:  # rows whose prompt is done output from this step on
            torch.le(self.forced_lengths, i, out=chooser.emitting)
        self.runner.choose(self.state, chooser)
        if i < width:
            column = torch.where(chooser.emitting, chooser.tokens[:, 0], self.forced_tokens[:, i])
            chooser.tokens[:, 0].copy_(column)
        self.host.start(chooser.report())

    def _read(self, i: int) -> list[int]:
        """Token column i on the host; NonFiniteLogits when a row's logits were not finite (-1)."""
        tokens = self.host.read()
        if min(tokens) < 0:
            raise nonfinite_logits(
                self.runner.model, "after the prompt" if i == 0 else f"at decode step {i + 1}"
            )
        return tokens

    def _feed(self) -> None:
        self.state.check_room(1)
        self.runner.feed(self.state, self.chooser)
        self.state.length += 1
