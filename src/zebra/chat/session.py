"""A chat conversation kept in the model's recurrent state instead of a re-read transcript.

Each user turn prefills only its new tokens on top of the live cache: the recurrent and conv states stay the
same size whatever the history, the MLA latents grow by `kv_lora_rank + qk_rope` values per token and layer.
With a chat template the new tokens are the part of the re-rendered conversation after what the cache already
holds; when the template rewrites earlier text (e.g. trims the reply) the conversation is re-prefilled once from
scratch, which is always correct.

On a model with a context (`Engine.context`: attention layers) the conversation is bounded by it: a reply stops
where the conversation reaches it, and a message that does not fit what is left starts a new conversation (the
message alone, told through `on_note`). A message longer than the context by itself is still answered, told as
past the context. A model of recurrent layers only has no such bound.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from zebra.generation import Engine, SamplingParams, TextStream
from zebra.generation.finite import NonFiniteLogits
from zebra.generation.text import past_context_note


@dataclass
class TurnStats:
    """What the last turn cost: prefill and decode tokens and seconds, and the cache afterwards."""

    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    new_tokens: int = 0
    decode_seconds: float = 0.0
    context_tokens: int = 0
    cache_bytes: int = 0
    reprefilled: bool = False
    context_full: bool = False  # the conversation reached the model's context: the next message starts over

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_seconds if self.decode_seconds else 0.0


@dataclass
class ChatSettings:
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 0.95
    max_new_tokens: int = 256
    system: str | None = None
    seed: int | None = None


@dataclass
class _Transcript:
    """What the live cache holds, as messages and as text."""

    messages: list[dict[str, str]] = field(default_factory=list)
    text: str = ""  # the exact text whose tokens are in the cache (plus `pending`)
    pending: list[int] = field(default_factory=list)  # sampled, shown, not yet fed to the cache


class ChatSession:
    """One conversation over an `Engine`: `send(text)` streams the reply as text pieces.

    Args:
        engine: the generation engine (owns the model and the cache).
        tokenizer: its tokenizer; its chat template is used when it has one.
        settings: sampling and system prompt (mutable between turns: /temp, /max, /system).
    """

    def __init__(self, engine: Engine, tokenizer: Any, settings: ChatSettings | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.settings = settings or ChatSettings()
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        self.stop_ids = _stop_ids(tokenizer)
        self.last = TurnStats()
        self.kept = True  # after a turn whose logits were not finite: the conversation before it was kept
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (a fresh cache); the system prompt stays."""
        self.state = self.engine.new_state(batch=1)
        self.transcript = _Transcript()
        if self.settings.system:
            self.transcript.messages.append({"role": "system", "content": self.settings.system})

    def set_system(self, text: str | None) -> None:
        self.settings.system = text or None
        self.reset()

    @property
    def context_tokens(self) -> int:
        """Tokens of the conversation: those in the cache plus the reply's last, fed with the next turn."""
        return self.state.length + len(self.transcript.pending)

    def send(
        self,
        user_text: str,
        should_stop: Callable[[], bool] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> Iterator[str]:
        """Prefill the new turn on top of the live cache, then stream the reply as text pieces.

        `on_note` is told, before the reply, when the conversation is reset because this message does not fit the
        model's context, and when the message is past the context by itself.

        Raises:
            NonFiniteLogits: the model's logits were NaN or infinite during this turn; the conversation is as it
                was before it (`kept`), or reset when that too gives such logits.
        """
        before = copy.deepcopy(self.transcript)
        try:
            yield from self._turn(user_text, should_stop, on_note)
        except NonFiniteLogits:
            self.kept = self._rebuild(before)
            raise

    def _turn(
        self, user_text: str, should_stop: Callable[[], bool] | None, on_note: Callable[[str], None] | None
    ) -> Iterator[str]:
        stats = TurnStats()
        new_ids = self._fitting_turn_ids(user_text, stats, on_note or (lambda _note: None))
        s = self.settings
        sampling = SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        stream = TextStream(self.tokenizer)
        reply: list[int] = []
        t0 = time.perf_counter()
        first_at = None
        for tokens in self.engine.generate_from(
            self.state,
            new_ids,
            max_new_tokens=s.max_new_tokens,
            sampling=sampling,
            stop_ids=self.stop_ids,
            seed=s.seed,
            should_stop=should_stop,
        ):
            if first_at is None:
                first_at = time.perf_counter()
            token = tokens[0]
            reply.append(token)
            if token in self.stop_ids:
                break
            piece = stream.push(token)
            if piece:
                yield piece
        tail = stream.flush()
        if tail:
            yield tail
        end = time.perf_counter()
        stats.prefill_tokens = len(new_ids)
        stats.prefill_seconds = (first_at or end) - t0
        stats.new_tokens = len(reply)
        stats.decode_seconds = end - (first_at or end)
        self._record_reply(reply)
        stats.context_tokens = self.context_tokens
        stats.cache_bytes = self.engine.cache_bytes(self.state)
        stats.context_full = self.engine.context is not None and self.context_tokens >= self.engine.context
        self.last = stats

    def _rebuild(self, before: _Transcript) -> bool:
        """A fresh cache holding the conversation `before` a failed turn (re-encoded, as when a template rewrites
        earlier text); False when its logits are not finite either: then the conversation is reset."""
        import torch

        self.state = self.engine.new_state(batch=1)
        self.transcript = before
        ids = self._encode(before.text, first=True) + before.pending
        if not ids:
            return True
        logits = self.engine.prefill(self.state, torch.tensor([ids], dtype=torch.long))  # [1, V]
        if bool(torch.isfinite(logits).all()):
            return True
        self.reset()
        return False

    def _fitting_turn_ids(
        self, user_text: str, stats: TurnStats, on_note: Callable[[str], None]
    ) -> list[int]:
        """The ids of this turn (`_new_turn_ids`), after a reset when the conversation and they reach the
        context; the live state grown when they alone need more room than it has."""
        had_history = self.state.length > 0 or bool(self.transcript.pending)
        ids = self._new_turn_ids(user_text, stats)
        context = self.engine.context
        if context is None:
            return ids
        if (had_history or stats.reprefilled) and self.state.length + len(ids) >= context:
            on_note(
                f"the context of {context} tokens is full ({self.state.length} used, this message needs "
                f"{len(ids)}); conversation reset"
            )
            self.reset()
            stats.reprefilled = False
            ids = self._new_turn_ids(user_text, stats)
        if len(ids) >= context:
            on_note(past_context_note("this message makes the conversation", len(ids), context))
        need = self.engine.capacity_for([self.state.length + len(ids)], self.settings.max_new_tokens)
        if self.state.length == 0 and not self.state.has_room(need):  # a fresh state, too small for it alone
            self.state = self.engine.new_state(batch=1, capacity=need)
        return ids

    def _new_turn_ids(self, user_text: str, stats: TurnStats) -> list[int]:
        """The ids to feed for this turn: pending tokens + the new part of the rendered conversation."""
        t = self.transcript
        t.messages.append({"role": "user", "content": user_text})
        if self.templated:
            full = self.tokenizer.apply_chat_template(t.messages, tokenize=False, add_generation_prompt=True)
        elif not t.text:  # plain continuation: the system prompt, if any, opens the text
            full = f"{self.settings.system}\n{user_text}" if self.settings.system else user_text
        else:
            sep = "" if t.text.endswith(("\n", " ")) else "\n"
            full = t.text + sep + user_text
        if full.startswith(t.text):
            delta = full[len(t.text) :]
            ids = t.pending + self._encode(delta, first=not t.text)
        else:  # the template rewrote earlier text: rebuild the cache from the whole conversation
            self.state = self.engine.new_state(batch=1)
            ids = self._encode(full, first=True)
            stats.reprefilled = True
        t.text, t.pending = full, []
        return ids

    def _record_reply(self, reply: list[int]) -> None:
        """The cache holds the reply but the token the engine left unfed (`state.unfed`); an unfed stop token is
        left to the template's turn end, any other is fed first next turn."""
        t = self.transcript
        content = [i for i in reply if i not in self.stop_ids]
        text = self.tokenizer.decode(content, skip_special_tokens=False)
        t.text += text
        unfed = self.state.unfed
        t.pending = [unfed] if unfed is not None and unfed not in self.stop_ids else []
        t.messages.append(
            {"role": "assistant", "content": self.tokenizer.decode(content, skip_special_tokens=True)}
        )

    def _encode(self, text: str, *, first: bool) -> list[int]:
        if not text:
            return []
        add_special = first and not self.templated  # a template writes its own bos
        return self.tokenizer(text, add_special_tokens=add_special)["input_ids"]


def _stop_ids(tokenizer: Any) -> set[int]:
    """eos plus the usual end-of-turn tokens the vocabulary has (Llama 3 `<|eot_id|>`, ChatML `<|im_end|>`)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    for name in ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"):
        if name in vocab:
            ids.add(vocab[name])
    return ids
