"""The model's context bounds generation where its layers have a position limit (MLA), and nowhere else.

Models here are the tiny recipes with `max_position_embeddings` set to 16 (the same weights as the recipe's).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from tests.generation.conftest import greedy_by_full_forwards, tiny_export, tiny_model

from zebra.chat.session import ChatSession, ChatSettings
from zebra.generation import Engine, generate_tokens, stream_completion
from zebra.generation.engine import position_limit

CONTEXT = 16
PROMPT = [5, 17, 99, 3, 250, 42, 7]


def columns_of(engine: Engine, prompt: list[int], max_new: int) -> list[list[int | None]]:
    """`engine.generate([prompt])`'s columns, but never more than 3 * CONTEXT of them (a bound on the test: an
    engine that does not stop at the context fails instead of generating a million tokens)."""
    columns: list[list[int | None]] = []
    for column in engine.generate(
        [prompt], max_new_tokens=max_new, should_stop=lambda: len(columns) > 3 * CONTEXT
    ):
        columns.append(column)
    return columns


@pytest.fixture(scope="module")
def hybrid16():
    """The tiny hybrid `*-M-G-K-` (one MLA sublayer) with a context of 16 tokens."""
    return tiny_model("tiny", context=CONTEXT)


@pytest.fixture(scope="module")
def gdn16():
    """The pure-GDN tiny model `G-G-` (no positions) whose config says 16 tokens."""
    return tiny_model("tiny-gdn", context=CONTEXT)


@pytest.fixture(scope="module")
def byte_tokenizer():
    from zebra.data.tokenizers import load_tokenizer

    return load_tokenizer("byte")


def test_position_limit_is_the_context_of_models_with_attention_layers_only(hybrid16, gdn16):
    from transformers import LlamaConfig, MambaConfig

    assert position_limit(hybrid16.config) == CONTEXT
    assert position_limit(gdn16.config) is None  # GDN, KDA, Mamba2: no positions
    fla = SimpleNamespace(model_type="gated_deltanet", max_position_embeddings=2048)
    assert position_limit(SimpleNamespace(**vars(fla), attn=None)) is None  # FLA's pure GDN
    assert position_limit(SimpleNamespace(**vars(fla), attn={"layers": [3], "num_heads": 4})) == 2048
    assert position_limit(LlamaConfig(max_position_embeddings=4096)) == 4096
    assert position_limit(MambaConfig()) is None


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_row_stops_when_it_reaches_the_context(hybrid16, cache):
    engine = Engine(hybrid16, cache=cache)
    assert engine.context == CONTEXT
    got = generate_tokens(engine, [PROMPT], max_new_tokens=40)[0]
    assert got == greedy_by_full_forwards(hybrid16, PROMPT, CONTEXT - len(PROMPT))  # 7 + 9 = 16
    if cache == "static":  # sized for the context, not for prompt + 40 (47, rounded up to 64)
        assert engine.runner._slots[1].cache.max_length == CONTEXT


def test_a_million_new_tokens_allocate_no_more_than_the_context(hybrid16):
    engine = Engine(hybrid16, cache="static")
    assert len(columns_of(engine, PROMPT, 1_000_000)) == CONTEXT - len(PROMPT)
    assert engine.runner._slots[1].cache.max_length == CONTEXT


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_rows_of_a_batch_each_stop_at_the_context(hybrid16, cache):
    """Each row's budget is what is left of the context after its own prompt, as in its batch-1 run."""
    prompts = [PROMPT, PROMPT[:3]]
    rows = generate_tokens(Engine(hybrid16, cache=cache), prompts, max_new_tokens=40)
    assert rows == [greedy_by_full_forwards(hybrid16, p, CONTEXT - len(p)) for p in prompts]
    assert [len(r) for r in rows] == [9, 13]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_prompt_past_the_context_is_continued_for_at_most_the_context(hybrid16, cache):
    engine = Engine(hybrid16, cache=cache)
    prompt = (PROMPT * 3)[:20]
    assert generate_tokens(engine, [prompt], max_new_tokens=5)[0] == greedy_by_full_forwards(
        hybrid16, prompt, 5
    )
    assert len(columns_of(engine, prompt, 1_000_000)) == CONTEXT
    if cache == "static":
        assert engine.runner._slots[1].cache.max_length == len(prompt) + CONTEXT


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_pure_recurrent_model_generates_past_its_configured_length(gdn16, cache):
    engine = Engine(gdn16, cache=cache)
    assert engine.context is None
    got = generate_tokens(engine, [PROMPT], max_new_tokens=30)[0]
    assert got == greedy_by_full_forwards(gdn16, PROMPT, 30)  # 37 tokens, past the 16 of its config


def test_a_pure_recurrent_static_cache_has_no_capacity_and_costs_the_same_for_any_length(gdn16):
    engine = Engine(gdn16, cache="static")
    small = engine.new_state(batch=1, capacity=8)
    size = engine.cache_bytes(small)
    huge = engine.new_state(batch=1, capacity=1_000_000)
    assert huge.capacity is None and engine.cache_bytes(huge) == size
    seen = []
    for column in engine.generate([PROMPT], max_new_tokens=1_000_000, should_stop=lambda: len(seen) >= 40):
        seen.append(column[0])
    assert len(seen) == 40 and engine.cache_bytes(engine.runner.new_state(1, 1)) == size


def test_a_chat_with_a_pure_recurrent_model_runs_past_its_configured_length(gdn16, byte_tokenizer):
    """On a GPU chat allocated 16 tokens for it and reset the conversation there; a GDN state has no such limit."""
    session = ChatSession(
        Engine(gdn16, cache="static"), byte_tokenizer, ChatSettings(temperature=0.0, max_new_tokens=8)
    )
    for text in ("The zebra", "It ran far", "And then"):
        notes: list[str] = []
        "".join(session.send(text, on_note=notes.append))
        assert notes == [] and not session.last.context_full
    assert session.context_tokens > 2 * CONTEXT
    assert [m["content"] for m in session.transcript.messages if m["role"] == "user"] == [
        "The zebra",
        "It ran far",
        "And then",
    ]


def completion_notes(model, tokenizer, prompt: str, max_new: int) -> tuple[str, list[str]]:
    notes: list[str] = []
    text = "".join(
        stream_completion(Engine(model), tokenizer, prompt, max_new_tokens=max_new, on_note=notes.append)
    )
    return text, notes


def test_max_new_past_the_context_is_told_once(hybrid16, byte_tokenizer):
    text, notes = completion_notes(hybrid16, byte_tokenizer, "The zebra", 1_000_000)
    assert notes == [
        "--max-new 1000000 reaches past the model's context of 16 tokens (the prompt takes 9); generation stops there"
    ]
    assert completion_notes(hybrid16, byte_tokenizer, "The zebra", 7) == (text, [])  # 9 + 7 = 16: within it


def test_a_prompt_past_the_context_is_told_once(hybrid16, byte_tokenizer):
    prompt = "The zebra ran far away."  # 23 bytes
    text, notes = completion_notes(hybrid16, byte_tokenizer, prompt, 4)
    assert notes == [
        "the prompt is 23 tokens, past the model's context of 16; quality past it is not trained"
    ]
    assert text
    _, notes = completion_notes(hybrid16, byte_tokenizer, prompt, 1_000_000)
    assert notes == [
        "the prompt is 23 tokens, past the model's context of 16; quality past it is not trained "
        "(--max-new 1000000 is cut to 16 new tokens)"
    ]


def test_a_pure_recurrent_model_is_told_nothing(gdn16, byte_tokenizer):
    assert completion_notes(gdn16, byte_tokenizer, "The zebra ran far away.", 1_000)[1] == []


def test_generate_notes_a_prompt_past_the_context_on_stderr_once(tmp_path_factory, tmp_path):
    export = shutil.copytree(tiny_export(tmp_path_factory.getbasetemp()), tmp_path / "ctx16")
    config = json.loads((export / "config.json").read_text())
    (export / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    prompt = "The zebra ran far away."
    cmd = [sys.executable, "-m", "zebra.cli.main", "generate", str(export), "--prompt", prompt]
    done = subprocess.run([*cmd, "--max-new", "4", "--device", "cpu"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: the prompt is 23 tokens, past the model's context of 16; quality past it is not trained"
    ]
    assert done.stdout.endswith("\n") and len(done.stdout) > 1
