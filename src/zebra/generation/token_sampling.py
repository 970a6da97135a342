"""Token sampling: choosing each row's next token from logits (greedy, temperature, top-k, top-p / nucleus).

Not to be confused with the `@sample` corpus of `zebra data`: this module only ever picks token ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How the next token is chosen.

    Attributes:
        temperature: 0 picks the most likely token (greedy); > 0 divides the logits before sampling.
        top_k: keep only the k most likely tokens (0: no limit).
        top_p: keep the smallest set of tokens whose probability reaches p (1.0: no limit).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample_next_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None
) -> torch.Tensor:
    """The next token of every row.

    Args:
        logits: `[B, V]` scores for the next position.
        params: greedy / temperature / top-k / top-p settings.
        generator: the random stream (seeded by the caller for reproducible samples).

    Returns:
        `[B]` int64 token ids.
    """
    if params.greedy:
        return logits.argmax(dim=-1)
    scores = logits.float() / params.temperature  # [B, V]
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]  # [B, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)  # [B, V]
        probs = sorted_scores.softmax(dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (the top token always stays)
        drop_sorted = probs.cumsum(dim=-1) - probs >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
