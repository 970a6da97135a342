"""`zebra generate`: one completion for scripts; stdout holds only the generated text."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from zebra.cli._options import examples
from zebra.cli.chat import CompileOpt, CudaGraphOpt, DeviceOpt, DTypeOpt, _inference_dtype
from zebra.errors import ZebraError

EXAMPLES = examples(
    "zebra generate runs/tiny --prompt 'Once upon a time' --max-new 64 --temperature 0",
    "zebra generate export/ --file prompt.txt --seed 1 > completion.txt",
    "echo 'The zebra' | zebra generate export/ --file -",
)


def generate_command(
    model: Annotated[str, typer.Argument(help="Export, FLA or run directory.")],
    prompt: Annotated[str | None, typer.Option("--prompt", "-p", help="The prompt text.")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Read the prompt from a file (- for stdin).")
    ] = None,
    max_new: Annotated[int, typer.Option("--max-new", min=1, help="New tokens at most.")] = 128,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0 = greedy.")] = 0.0,
    top_k: Annotated[
        int, typer.Option("--top-k", min=0, help="Sample from the k most likely (0 = all).")
    ] = 0,
    top_p: Annotated[float, typer.Option("--top-p", min=0.0, max=1.0, help="Nucleus sampling mass.")] = 1.0,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed for sampling (reproducible output).")
    ] = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = "auto",
    cuda_graph: CudaGraphOpt = True,
    compile_: CompileOpt = False,
) -> None:
    """Continue a prompt and print only the generated text (streamed), for use in scripts."""
    from zebra.chat.text_stream import TextStream
    from zebra.generation import Engine, SamplingParams
    from zebra.generation.loading import load_model

    text = _prompt_text(prompt, file)
    lm, tokenizer = load_model(model, device=device, dtype=_inference_dtype(dtype, device))
    engine = Engine(lm, cuda_graph=cuda_graph, compile=compile_)
    ids = tokenizer(text)["input_ids"]
    if not ids:
        raise ZebraError("the prompt is empty after tokenization", fix="pass a non-empty --prompt or --file")
    stream = TextStream(tokenizer)
    stop = {tokenizer.eos_token_id} - {None}
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    for tokens in engine.generate([ids], max_new_tokens=max_new, sampling=sampling, stop_ids=stop, seed=seed):
        token = tokens[0]
        if token is None or token in stop:
            continue
        sys.stdout.write(stream.push(token))
        sys.stdout.flush()
    sys.stdout.write(stream.flush() + "\n")
    sys.stdout.flush()


def _prompt_text(prompt: str | None, file: Path | None) -> str:
    if (prompt is None) == (file is None):
        raise ZebraError("pass exactly one of --prompt and --file", fix="e.g. --prompt 'Once upon a time'")
    if prompt is not None:
        return prompt
    if str(file) == "-":
        return sys.stdin.read()
    try:
        return file.read_text()
    except OSError as e:
        raise ZebraError(f"--file {file}: {e.strerror}", fix="pass a readable text file") from None
