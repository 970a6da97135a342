"""`zebra generate`: one completion for scripts; stdout holds only the generated text."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from zebra.cli._options import (
    CompileOpt,
    CudaGraphOpt,
    DecodeDTypeOpt,
    DeviceOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    examples,
    max_new_option,
    tokenizer_option,
)
from zebra.cli._output import out
from zebra.core.errors import ZebraError
from zebra.folders.model_folder import model_path

EXAMPLES = examples(
    "zebra generate runs/tiny --prompt 'Once upon a time' --max-new 64 --temperature 0",
    "zebra generate export/ --file prompt.txt --seed 1 > completion.txt",
    "echo 'The zebra' | zebra generate export/ --file -",
    "zebra generate zebra-1b --tokenizer meta-llama/Llama-3.2-1B -p 'Hi'   # an export without tokenizer files",
)


def generate_command(
    model: Annotated[str, typer.Argument(help="Export, FLA or run directory.")],
    prompt: Annotated[str | None, typer.Option("--prompt", "-p", help="The prompt text.")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Read the prompt from a file (- for stdin).")
    ] = None,
    max_new: Annotated[int, max_new_option("New tokens at most.")] = 128,
    temperature: TemperatureOpt = 0.0,
    top_k: TopKOpt = 0,
    top_p: TopPOpt = 1.0,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed for sampling (reproducible output).")
    ] = None,
    tokenizer: Annotated[str | None, tokenizer_option("the model's")] = None,
    device: DeviceOpt = None,
    dtype: DecodeDTypeOpt = "auto",
    cuda_graph: CudaGraphOpt = True,
    compile_: CompileOpt = False,
) -> None:
    """Continue a prompt and print only the generated text (streamed), for use in scripts."""
    text = _prompt_text(prompt, file)  # a flag error or a missing MODEL before torch is imported
    model_path(model)
    from zebra.cli._engine import load_cli_engine
    from zebra.generation import SamplingParams, stream_completion

    engine, tok = load_cli_engine(
        model, device=device, dtype=dtype, tokenizer=tokenizer, cuda_graph=cuda_graph, compile=compile_
    )
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    pieces = stream_completion(
        engine, tok, text, max_new_tokens=max_new, sampling=sampling, seed=seed, on_note=out.note
    )
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()


def _prompt_text(prompt: str | None, file: Path | None) -> str:
    if (prompt is None) == (file is None):
        raise ZebraError("pass exactly one of --prompt and --file", fix="e.g. --prompt 'Once upon a time'")
    if prompt is not None:
        return prompt
    if str(file) == "-" and sys.stdin is None:
        raise ZebraError("--file -: stdin is closed", fix="pipe the prompt in, or pass --file FILE")
    try:
        data = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
    except OSError as e:
        raise ZebraError(f"--file {file}: {e.strerror}", fix="pass a readable text file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        out.note(f"--file {file}: not UTF-8 at byte {e.start}; bytes that are not were read as U+FFFD")
        return data.decode("utf-8", errors="replace")
