"""Token sampling: choosing each row's next token from logits (greedy, temperature, top-k, top-p / nucleus).

Everything here runs on the logits' device without reading a value back to the host, so a decode loop can sample
inside a CUDA graph: the draw is `argmax(probs / E)` with E ~ Exp(1) (the algorithm `torch.multinomial` itself
uses for one sample, without its host-side input check), and top-k / top-p take their limits as numbers or as 0-d
tensors. `TokenChooser` holds the device buffers of one decode: the next input tokens, which rows stopped (a stop
id or their token budget), and whether any row still runs.

Not to be confused with the `@sample` corpus of `zebra data`: this module only ever picks token ids.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from zebra_kernels.choice import record_choice_

ARGMAX_BLOCKS = 64  # first-stage blocks of `argmax_rows` over a large vocabulary
ARGMAX_TWO_STAGE_MIN = 1 << 14  # vocabularies at least this wide take the two stages


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How the next token is chosen.

    Attributes:
        temperature: 0 picks the most likely token (greedy); > 0 divides the logits before sampling.
        top_k: keep only the k most likely tokens (0: no limit; tokens tied with the k-th stay).
        top_p: keep the smallest set of tokens whose probability reaches p (1.0: no limit).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def kind(self) -> str:
        """`greedy`, `plain` (temperature only) or `filtered` (top-k or top-p): what a captured sampler computes."""
        if self.greedy:
            return "greedy"
        return "filtered" if self.top_k or self.top_p < 1.0 else "plain"


def sample_next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The next token of every row.

    Args:
        logits: `[B, V]` scores for the next position.
        params: greedy / temperature / top-k / top-p settings.
        generator: the random stream (seeded by the caller for reproducible samples), on the logits' device.

    Returns:
        `[B]` int64 token ids.
    """
    V = logits.shape[-1]
    return draw(
        logits,
        params.kind,
        temperature=params.temperature,
        top_k=params.top_k or V,
        top_p=params.top_p if params.top_p < 1.0 else float("inf"),
        generator=generator,
    )


def draw(
    logits: torch.Tensor,
    kind: str,
    *,
    temperature: float | torch.Tensor,
    top_k: int | torch.Tensor,
    top_p: float | torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """`[B, V]` logits -> `[B]` tokens, with no host synchronisation (capturable in a CUDA graph).

    Args:
        kind: `greedy` (argmax; the other arguments unused), `plain` or `filtered` (`SamplingParams.kind`).
        temperature: > 0. top_k: tokens to keep, V for all. top_p: nucleus mass, `inf` for all (not 1.0, which
            rounding in the cumulative sum could cut). Each a number or a 0-d tensor on the logits' device.
        generator: the random stream, or None for the default one.
    """
    if kind == "greedy":
        return argmax_rows(logits)
    scores = logits.float() / temperature  # [B, V]
    if kind == "filtered":
        scores = _restrict(scores, top_k, top_p)
    probs = scores.softmax(dim=-1)
    noise = torch.empty_like(probs).exponential_(generator=generator)  # [B, V] ~ Exp(1)
    return argmax_rows(probs.div(noise))  # one sample of probs (torch.multinomial's own one-sample method)


def argmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """`scores.argmax(-1)` of `[B, V]`, the first index of each row's maximum, in two stages when V is large:
    the maxima of `ARGMAX_BLOCKS` contiguous blocks per row, then the first block holding the row's maximum. A
    GPU reduces one row of a 128k vocabulary in a single block (26 us a decode step on an H100, docs/benchmarks.md);
    the first stage spreads it over `ARGMAX_BLOCKS` blocks."""
    B, V = scores.shape
    if V < ARGMAX_TWO_STAGE_MIN or V % ARGMAX_BLOCKS or scores.stride(-1) != 1:
        return scores.argmax(dim=-1)
    width = V // ARGMAX_BLOCKS
    block_max, block_arg = scores.view(B, ARGMAX_BLOCKS, width).max(dim=-1)  # [B, S], [B, S]
    block = block_max.argmax(dim=-1, keepdim=True)  # [B, 1]: the first block with the row's maximum
    return (block_arg.gather(-1, block) + block * width).squeeze(-1)  # [B]


def _restrict(scores: torch.Tensor, top_k: int | torch.Tensor, top_p: float | torch.Tensor) -> torch.Tensor:
    """`scores [B, V]` with -inf outside the top-k tokens (ties with the k-th kept) and then outside the nucleus
    of mass top_p over what is left (the top token always stays)."""
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True)  # [B, V]
    if isinstance(top_k, int):
        kth = sorted_scores[:, top_k - 1 : top_k]  # [B, 1]
    else:
        kth = sorted_scores.gather(-1, (top_k - 1).expand(scores.shape[0], 1))  # [B, 1]
    sorted_scores = sorted_scores.masked_fill(sorted_scores < kth, float("-inf"))
    probs = sorted_scores.softmax(dim=-1)
    # drop a token when the tokens ranked above it already reach top_p, or when it is outside the top k
    drop_sorted = (probs.cumsum(dim=-1) - probs >= top_p) | (sorted_scores == float("-inf"))
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def row_budgets(max_new_tokens: int | Sequence[int], batch: int) -> list[int]:
    """Tokens each of `batch` rows may output: one budget for all, or one per row (checked against `batch`)."""
    if isinstance(max_new_tokens, int):
        return [max_new_tokens] * batch
    budgets = [int(b) for b in max_new_tokens]
    if len(budgets) != batch:
        raise ValueError(f"{len(budgets)} token budgets for {batch} rows")
    return budgets


class TokenChooser:
    """The device side of one decode: sample every row's next token into `tokens` and track which rows stopped.

    `choose(logits)` is all device work (it can be captured in a CUDA graph once and replayed), with these
    buffers, refilled by `start()` for each call:
        tokens `[B, 1]` int64   the chosen tokens: the next step's input
        emitting `[B]` bool     rows whose token this step is output (False while a row still feeds its prompt)
        remaining `[B]` int64   tokens each row may still output (its budget at `start`)
        stopped `[B]` bool      rows that output a stop id or their last allowed token
        finite `[B]` bool       rows whose logits were finite (False: NaN or infinities, a broken model)
        reported `[B]` int64    the tokens as the host reads them: -1 where the logits were not finite
        running `[]` bool       any row not stopped (a cache's feed flag: a step after every row stopped must
                                leave the cache as it was)
    plus the sampling settings as tensors (temperature, top-k, top-p) and `stop_ids` `[S]` (padded with -1).

    Args:
        batch: rows B.
        vocab: V, the logits' width (top-k "no limit").
        device: where the buffers live.
        stop_slots: S, the most stop ids one call may use.
        running: the 0-d bool tensor to keep current (a `ZebraCache.feed`), or None for a buffer of its own.
    """

    def __init__(
        self,
        batch: int,
        vocab: int,
        device: torch.device,
        *,
        stop_slots: int,
        running: torch.Tensor | None = None,
    ):
        self.vocab = vocab
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.emitting = torch.ones(batch, dtype=torch.bool, device=device)
        self.remaining = torch.zeros(batch, dtype=torch.long, device=device)
        self.stopped = torch.zeros(batch, dtype=torch.bool, device=device)
        self.finite = torch.ones(batch, dtype=torch.bool, device=device)
        self.reported = torch.zeros(batch, dtype=torch.long, device=device)
        self.running = running if running is not None else torch.ones((), dtype=torch.bool, device=device)
        self.stop_ids = torch.full((stop_slots,), -1, dtype=torch.long, device=device)
        self.temperature = torch.ones((), dtype=torch.float32, device=device)
        self.top_k = torch.full((), vocab, dtype=torch.long, device=device)
        self.top_p = torch.full((), float("inf"), dtype=torch.float32, device=device)
        self.kind = "greedy"
        self.generator: torch.Generator | None = None

    def start(
        self,
        params: SamplingParams,
        stop_ids: Collection[int],
        max_new_tokens: int | Sequence[int],
        generator: torch.Generator | None,
    ) -> None:
        """Set the buffers for a new decode call (asynchronous host-to-device fills); `max_new_tokens` is one
        budget for every row or one per row."""
        if len(stop_ids) > self.stop_ids.numel():
            raise ValueError(f"at most {self.stop_ids.numel()} stop ids, got {len(stop_ids)}")
        ids = sorted(stop_ids) + [-1] * (self.stop_ids.numel() - len(stop_ids))
        self.stop_ids.copy_(torch.tensor(ids, dtype=torch.long), non_blocking=True)
        self.temperature.fill_(params.temperature or 1.0)
        self.top_k.fill_(params.top_k or self.vocab)
        self.top_p.fill_(params.top_p if params.top_p < 1.0 else float("inf"))
        self.emitting.fill_(True)
        budgets = row_budgets(max_new_tokens, self.remaining.numel())
        self.remaining.copy_(torch.tensor(budgets, dtype=torch.long), non_blocking=True)  # [B]
        self.stopped.copy_(torch.tensor([b <= 0 for b in budgets]), non_blocking=True)  # [B]
        self.running.fill_(any(b > 0 for b in budgets))
        self.kind, self.generator = params.kind, generator

    def choose(self, logits: torch.Tensor) -> None:
        """Sample from `logits` `[B, V]` into `tokens` and update `remaining`, `stopped`, `running` and `finite`."""
        torch.all(torch.isfinite(logits), dim=-1, out=self.finite)
        nxt = draw(
            logits,
            self.kind,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            generator=self.generator,
        )  # [B]
        # count, stop and feed: one Triton launch on a GPU instead of about a dozen (zebra_kernels.choice)
        record_choice_(
            nxt,
            tokens=self.tokens,
            emitting=self.emitting,
            remaining=self.remaining,
            stopped=self.stopped,
            running=self.running,
            stop_ids=self.stop_ids,
        )

    def report(self) -> torch.Tensor:
        """`reported` `[B]`: `tokens` as they are now (prompt tokens forced in included), -1 in the rows whose
        logits were not finite, for the host to read (`DecodeLoop`)."""
        return self.reported.copy_(self.tokens[:, 0]).masked_fill_(~self.finite, -1)
