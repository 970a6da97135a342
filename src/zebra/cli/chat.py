"""`zebra chat`: talk to a model in the terminal, replies streamed as they are generated."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from zebra.chat.discover import find_models
from zebra.cli._options import (
    CompileOpt,
    CudaGraphOpt,
    DecodeDTypeOpt,
    DeviceOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    YesOpt,
    examples,
)
from zebra.cli._prompt import ask_text, can_prompt, choose
from zebra.errors import ZebraError

EXAMPLES = examples(
    "zebra chat runs/tiny",
    "zebra chat export/ --temperature 0 --max-new 100 --system 'You are terse.'",
    "zebra chat            (on a terminal: pick a run or export folder)",
)

_OTHER = "another folder…"


def chat_command(
    model: Annotated[
        str | None, typer.Argument(help="Export, FLA or run directory (asked on a terminal when left out).")
    ] = None,
    temperature: TemperatureOpt = 0.7,
    top_k: TopKOpt = 0,
    top_p: TopPOpt = 0.95,
    max_new: Annotated[int, typer.Option("--max-new", min=1, help="Longest reply in tokens.")] = 256,
    system: Annotated[str | None, typer.Option("--system", help="System prompt.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed for sampling.")] = None,
    device: DeviceOpt = None,
    dtype: DecodeDTypeOpt = "auto",
    cuda_graph: CudaGraphOpt = True,
    compile_: CompileOpt = False,
    yes: YesOpt = False,
) -> None:
    """Chat with MODEL; the history lives in the model's recurrent state, not in a re-read transcript."""
    from zebra.chat.repl import Repl
    from zebra.chat.session import ChatSession, ChatSettings
    from zebra.generation.loading import load_engine

    if model is None:
        model, temperature, max_new = _pick(yes, temperature, max_new)
    engine, tokenizer = load_engine(
        model, device=device, dtype=dtype, cuda_graph=cuda_graph, compile=compile_
    )
    settings = ChatSettings(
        temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new, system=system, seed=seed
    )
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    Repl(ChatSession(engine, tokenizer, settings)).run()


def _pick(yes: bool, temperature: float, max_new: int) -> tuple[str, float, int]:
    """Ask for the model and the main settings on a terminal; without one, a one-line error."""
    if not can_prompt(yes):
        raise ZebraError("missing MODEL", fix="pass an export, FLA or run directory: zebra chat runs/NAME")
    cwd = Path.cwd()
    found = [str(p.relative_to(cwd)) for p in find_models(cwd)]
    model = choose(
        "Which model?", [*found, _OTHER], yes=yes, flag="MODEL", default=found[0] if found else None
    )
    if model == _OTHER:
        model = ask_text("Model folder:", yes=yes, flag="MODEL")
    temperature = _ask_number("Temperature (0 = greedy):", temperature, float, yes)
    max_new = int(_ask_number("Longest reply (tokens):", max_new, int, yes))
    return model, temperature, max_new


def _ask_number(message: str, default: float, kind: type, yes: bool) -> float:
    answer = ask_text(message, yes=yes, flag=message, default=f"{default:g}")
    try:
        value = kind(answer)
    except ValueError:
        raise ZebraError(f"{answer!r} is not a number", fix=message) from None
    if value < 0:
        raise ZebraError(f"{answer} is negative", fix=message)
    return value
