"""`zebra chat`: talk to a model in the terminal, replies streamed as they are generated."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

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
    max_new_option,
    tokenizer_option,
)
from zebra.cli._output import out
from zebra.cli._prompt import choose_found

EXAMPLES = examples(
    "zebra chat runs/tiny",
    "zebra chat export/ --temperature 0 --max-new 100 --system 'You are terse.'",
    "zebra chat            (the only run or model folder here; on a terminal, a pick among several)",
    "zebra chat zebra-1b --tokenizer meta-llama/Llama-3.2-1B   # an export without tokenizer files",
)


def chat_command(
    model: Annotated[
        str | None,
        typer.Argument(
            help="Export, FLA or run directory (default: the one here; asked on a terminal when there are several)."
        ),
    ] = None,
    temperature: TemperatureOpt = 0.7,
    top_k: TopKOpt = 0,
    top_p: TopPOpt = 0.95,
    max_new: Annotated[int, max_new_option("Longest reply in tokens (/max N in the chat).")] = 256,
    system: Annotated[str | None, typer.Option("--system", help="System prompt.")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed for sampling.")] = None,
    tokenizer: Annotated[str | None, tokenizer_option("the model's")] = None,
    device: DeviceOpt = None,
    dtype: DecodeDTypeOpt = "auto",
    cuda_graph: CudaGraphOpt = True,
    compile_: CompileOpt = False,
    yes: YesOpt = False,
) -> None:
    """Chat with MODEL; the history lives in the model's recurrent state, not in a re-read transcript."""
    from zebra.folders.discover import find_models
    from zebra.folders.model_folder import model_path

    if model is None:  # asked, or refused (or a missing MODEL told), before torch is imported
        cwd = Path.cwd()
        found = [str(p.relative_to(cwd)) for p in find_models(cwd)]
        model = choose_found(
            "Which model?",
            found,
            yes=yes,
            flag="MODEL",
            fix="pass an export, FLA or run directory: zebra chat runs/NAME (none found here or in runs/)",
        )
        out.text(f"model: {escape(model)}")
    model_path(model)
    from zebra.chat.repl import Repl
    from zebra.chat.session import ChatSession, ChatSettings
    from zebra.cli._engine import load_cli_engine

    engine, tok = load_cli_engine(
        model, device=device, dtype=dtype, tokenizer=tokenizer, cuda_graph=cuda_graph, compile=compile_
    )
    settings = ChatSettings(
        temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new, system=system, seed=seed
    )
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    with contextlib.suppress(
        AttributeError, ValueError
    ):  # bytes that are not UTF-8 read as U+FFFD (Repl says so)
        sys.stdin.reconfigure(errors="replace")  # type: ignore[union-attr]
    Repl(ChatSession(engine, tok, settings)).run()
