"""The chat session keeps the history in the cache: each turn feeds only its new tokens."""

from __future__ import annotations

import re

import pytest
import torch

from zebra.chat.session import ChatSession, ChatSettings
from zebra.generation import Engine, TextStream, stream_completion

TEMPLATE = (
    "{% for m in messages %}<|begin_of_text|>{{ m.role }}\n{{ m.content }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<|begin_of_text|>assistant\n{% endif %}"
)


class FeedLog:
    """Wraps an engine's `prefill` to record every token fed in one call (the test's view of the cache)."""

    def __init__(self, engine: Engine):
        self.calls: list[list[int]] = []
        inner = engine.prefill

        def prefill(state, ids):
            self.calls.append(ids[0].tolist())
            return inner(state, ids)

        engine.prefill = prefill


def greedy(model, ids: list[int], n: int, stop: set[int]) -> list[int]:
    out: list[int] = []
    seq = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            token = int(model(input_ids=seq, use_cache=False).logits[0, -1].argmax())
            out.append(token)
            if token in stop:
                break
            seq = torch.cat([seq, torch.tensor([[token]])], dim=1)
    return out


def run_turn(session: ChatSession, text: str) -> tuple[str, list[int]]:
    pieces = list(session.send(text))
    return "".join(pieces), pieces


def test_second_turn_feeds_only_new_tokens_and_continues_the_state(loaded):
    model, tokenizer = loaded
    engine = Engine(model)
    log = FeedLog(engine)
    session = ChatSession(engine, tokenizer, ChatSettings(temperature=0.0, max_new_tokens=12))
    stop = session.stop_ids
    assert not session.templated
    run_turn(session, "The zebra")
    reply1 = greedy(model, log.calls[0], 12, stop)
    assert session.transcript.messages[1]["content"] == _text(tokenizer, reply1, stop)

    run_turn(session, "It ran")
    pending = [] if reply1[-1] in stop else [reply1[-1]]  # the last reply token was never fed
    so_far = "The zebra" + tokenizer.decode([t for t in reply1 if t not in stop])
    sep = "" if so_far.endswith(("\n", " ")) else "\n"
    assert log.calls[1] == pending + tokenizer(sep + "It ran", add_special_tokens=False)["input_ids"]
    assert session.last.prefill_tokens == len(log.calls[1])
    # the reply continues the live state exactly as a full forward over the whole history would
    history = log.calls[0] + reply1[:-1] + log.calls[1]
    assert session.transcript.messages[-1]["content"] == _text(
        tokenizer, greedy(model, history, 12, stop), stop
    )


def _text(tokenizer, ids: list[int], stop: set[int]) -> str:
    return tokenizer.decode([t for t in ids if t not in stop], skip_special_tokens=True)


def test_reply_streams_before_generation_ends(loaded):
    model, tokenizer = loaded
    engine = Engine(model)
    steps = []
    inner = engine.step
    engine.step = lambda state, tokens: (steps.append(1), inner(state, tokens))[1]
    session = ChatSession(engine, tokenizer, ChatSettings(temperature=0.0, max_new_tokens=30))
    stream = session.send("Once upon a time")
    next(stream)
    assert len(steps) < 29  # the first piece arrived while most tokens were still to come
    list(stream)
    assert session.last.new_tokens >= 1


def templated_session(loaded, template: str, **settings):
    model, tokenizer = loaded
    tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = template
    engine = Engine(model)
    log = FeedLog(engine)
    session = ChatSession(engine, tokenizer, ChatSettings(temperature=0.0, max_new_tokens=8, **settings))
    return session, tokenizer, log


def render(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_chat_template_is_used_and_turns_are_incremental(loaded):
    session, tokenizer, log = templated_session(loaded, TEMPLATE, system="Be brief.")
    assert session.templated
    run_turn(session, "Hi")
    assert log.calls[0] == render(
        tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    run_turn(session, "More")
    assert not session.last.reprefilled
    full = render(tokenizer, session.transcript.messages[:-1])  # system, user, assistant, user
    assert len(log.calls[1]) < len(full) // 2  # only the new turn, not the transcript
    assert (
        full[-len(log.calls[1]) :][-6:] == log.calls[1][-6:]
    )  # ends with the generation prompt, as the render


def test_template_that_rewrites_history_reprefills_the_whole_conversation(loaded):
    # the message count at the very start changes every turn, so the old text is never a prefix of the new one
    session, tokenizer, log = templated_session(loaded, "{{ messages | length }}" + TEMPLATE)
    run_turn(session, "Hi")
    run_turn(session, "More")
    assert session.last.reprefilled
    assert log.calls[1] == render(tokenizer, session.transcript.messages[:-1])
    assert session.context_tokens == len(log.calls[1]) + session.last.new_tokens


def test_reset_and_system_start_a_fresh_cache(loaded):
    model, tokenizer = loaded
    session = ChatSession(Engine(model), tokenizer, ChatSettings(temperature=0.0, max_new_tokens=4))
    run_turn(session, "abc")
    assert session.context_tokens > 0
    session.reset()
    assert session.context_tokens == 0 and session.transcript.messages == []
    session.set_system("You are a zebra.")
    assert session.transcript.messages == [{"role": "system", "content": "You are a zebra."}]
    run_turn(session, "x")
    assert session.last.prefill_tokens == len(tokenizer("You are a zebra.\nx")["input_ids"])


def test_text_stream_holds_back_split_characters(loaded):
    _, tokenizer = loaded
    stream = TextStream(tokenizer)
    ids = tokenizer("zébra\n→ok")["input_ids"]
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == "zébra\n→ok"
    assert "\ufffd" not in "".join(pieces)


def test_stream_completion_yields_the_greedy_text_in_non_empty_pieces(loaded):
    model, tokenizer = loaded
    eos = {tokenizer.eos_token_id}
    ids = tokenizer("The zebra")["input_ids"]
    expected = tokenizer.decode(
        [t for t in greedy(model, ids, 10, eos) if t not in eos], skip_special_tokens=True
    )
    pieces = list(stream_completion(Engine(model), tokenizer, "The zebra", max_new_tokens=10))
    assert "".join(pieces) == expected and all(pieces)


def test_generate_stdout_is_only_the_greedy_text(loaded, trained_export):
    import subprocess
    import sys

    from typer.testing import CliRunner

    from zebra.cli.main import app

    model, tokenizer = loaded
    ids = tokenizer("The zebra")["input_ids"]
    eos = {tokenizer.eos_token_id}
    expected = tokenizer.decode(
        [t for t in greedy(model, ids, 10, eos) if t not in eos], skip_special_tokens=True
    )
    cmd = [
        sys.executable,
        "-m",
        "zebra.cli.main",
        "generate",
        str(trained_export),
        "--max-new",
        "10",
        "--device",
        "cpu",
    ]
    by_flag = subprocess.run(
        [*cmd, "--prompt", "The zebra"], capture_output=True, text=True, errors="replace"
    )
    assert by_flag.returncode == 0, by_flag.stderr
    assert by_flag.stdout == expected + "\n"
    # The prompt read from stdin: the same command in this process (the real process's stdout is checked above)
    by_stdin = CliRunner().invoke(app, [*cmd[3:], "--file", "-"], input="The zebra")
    assert by_stdin.exit_code == 0, by_stdin.output
    assert by_stdin.stdout == by_flag.stdout


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_a_conversation_is_bounded_by_the_context_on_either_cache(loaded, cache):
    """A reply stops where the conversation reaches the context (24 here: the engine's max_seq_len), and says so;
    the next message starts a new conversation and is answered there, even one past the context by itself. The
    static cache (GPU) and the dynamic one (CPU) behave alike: before, the static one raised CacheFullError in the
    middle of a reply and dropped the next message, and the dynamic one ran on past the context."""
    import io

    from zebra.chat.repl import Repl

    model, tokenizer = loaded
    session = ChatSession(
        Engine(model, cache=cache, max_seq_len=24), tokenizer, ChatSettings(temperature=0.0)
    )
    long_line = "this line alone is longer than the twenty-four token cache"
    lines = iter(["a short one", long_line, "/quit"])
    out = io.StringIO()
    Repl(session, read_line=lambda _prompt: next(lines), stream=out).run()
    said = [line for line in out.getvalue().splitlines()[1:] if line.startswith("[")]  # past the banner
    full = "[the context of 24 tokens is full; the next message starts a new conversation]"
    long_ids = len(tokenizer(long_line)["input_ids"])
    assert len(said) == 4 and said[0] == said[3] == full
    assert re.fullmatch(
        r"\[the context of 24 tokens is full \(2\d used, this message needs \d+\); conversation reset\]",
        said[1],
    )
    assert said[2] == (
        f"[this message makes the conversation {long_ids} tokens, past the model's context of 24; quality past "
        "it is not trained]"
    )
    assert 0 < session.last.new_tokens <= 24  # the long line was answered, for at most 24 tokens
    assert session.context_tokens == long_ids + session.last.new_tokens
    assert session.transcript.messages[0] == {"role": "user", "content": long_line}


def repl_lines(export, lines: list[str]) -> tuple[list[str], ChatSession]:
    """What a Repl over `export` says to `lines` (then /quit), one entry per line said; and its session."""
    import io

    from zebra.chat.repl import Repl
    from zebra.generation.loading import load_model

    model, tokenizer = load_model(export, device="cpu")
    session = ChatSession(Engine(model), tokenizer, ChatSettings(temperature=0.0))
    feed = iter([*lines, "/quit"])
    out = io.StringIO()
    Repl(session, read_line=lambda _prompt: next(feed), stream=out).run()
    return out.getvalue().splitlines()[1:], session  # past the banner


def test_temp_refuses_what_is_not_a_finite_number_at_least_zero(random_export):
    said, session = repl_lines(random_export, ["/temp nan", "/temp inf", "/temp -1", "/temp 0.5"])
    usage = "[usage: /temp X with X a finite number >= 0, e.g. /temp 0.7; 0 is greedy]"
    assert said == [usage, usage, usage, "[temperature 0.5]"]
    assert session.settings.temperature == 0.5


def test_max_refuses_more_tokens_than_a_reply_may_ask_for(random_export):
    """`/max 99999999999999999999` then a message ended the session with OverflowError in the engine."""
    said, session = repl_lines(random_export, ["/max 99999999999999999999", "/max 0", "/max 3", "The zebra"])
    usage = "[usage: /max N with 1 <= N <= 1,000,000, e.g. /max 200]"
    assert said[:3] == [usage, usage, "[max 3 new tokens]"]
    assert session.last.new_tokens <= 3 and session.context_tokens > 0


def test_an_export_written_with_a_gpu_backend_loads_on_the_cpu(random_export, tmp_path):
    """config.json's kernel_backend is the writer's: a folder that says `fla` (an older export, or one made by
    hand) loads with this machine's kernels and decodes as the same weights with the torch reference."""
    import json
    import shutil

    from zebra.generation.loading import load_model

    folder = shutil.copytree(random_export, tmp_path / "fla-backend")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "kernel_backend": "fla"}))
    model, tokenizer = load_model(folder, device="cpu")
    reference, _ = load_model(random_export, device="cpu")
    assert model.config.kernel_backend == "auto"
    ids = tokenizer("The zebra")["input_ids"]
    assert greedy(model, ids, 8, set()) == greedy(reference, ids, 8, set())


def test_a_turn_whose_logits_overflow_is_dropped_and_the_conversation_kept(loaded):
    """Logits that turn NaN in one turn (an overflow) raise NonFiniteLogits; the session is then the conversation
    before that turn, and the next turn continues it as if the failed one had never been sent."""
    from zebra.generation.finite import NonFiniteLogits

    model, tokenizer = loaded
    settings = ChatSettings(temperature=0.0, max_new_tokens=6)
    session = ChatSession(Engine(model), tokenizer, settings)
    run_turn(session, "The zebra")
    before = [dict(m) for m in session.transcript.messages]
    overflow = {"on": True}

    def poison(module, args, output):  # the turn's first forward only: the rebuild's is as it was
        if overflow.pop("on", False):
            output.logits.fill_(float("nan"))

    handle = model.register_forward_hook(poison)
    try:
        with pytest.raises(NonFiniteLogits, match="NaN or infinite"):
            run_turn(session, "It ran")
        assert session.transcript.messages == before and session.kept
        kept, _ = run_turn(session, "It ran")
    finally:
        handle.remove()
    fresh = ChatSession(Engine(model), tokenizer, ChatSettings(temperature=0.0, max_new_tokens=6))
    run_turn(fresh, "The zebra")
    assert kept == run_turn(fresh, "It ran")[0] and session.transcript.messages == fresh.transcript.messages
