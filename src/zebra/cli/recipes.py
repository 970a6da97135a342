"""`zebra recipes`: list, show and copy the trainable configurations."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from zebra.cli._options import ForceOpt, JsonOpt, SetOpt, YesOpt, examples
from zebra.cli._output import out
from zebra.cli._prompt import choose
from zebra.core.atomic import make_folder
from zebra.core.errors import ZebraError

app = typer.Typer(help="List, show and copy training recipes.", no_args_is_help=True)


def complete_recipe(incomplete: str) -> list[str]:
    """Shell completion: built-in recipe names starting with what was typed."""
    from zebra.recipes import list_recipes

    return [name for name in list_recipes() if name.startswith(incomplete)]


RecipeArg = Annotated[
    str | None,
    typer.Argument(
        help="Recipe name (see `zebra recipes list`) or YAML path.",
        show_default=False,
        autocompletion=complete_recipe,
    ),
]


def _pick(name: str | None, yes: bool) -> str:
    from zebra.recipes import list_recipes

    return name or choose("Which recipe?", list_recipes(), yes=yes, flag="RECIPE")


def _human(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


def _mixers(pattern: str) -> str:
    """The mixer kinds of a pattern (MLPs left out): "GDN" for one kind, else counts, "12 Mamba2+4 MLA"."""
    from zebra.mixers import MLP
    from zebra.spec.arch import used_mixers

    kinds = [spec for spec in used_mixers(pattern) if spec.char != MLP]
    if len(kinds) == 1:
        return kinds[0].label
    return "+".join(f"{pattern.count(spec.char)} {spec.label}" for spec in kinds) or "none"


@app.command("list", epilog=examples("zebra recipes list", "zebra recipes list --json"))
def list_(json_: JsonOpt = False) -> None:
    """Every built-in recipe with its size, mixers, sequence length and tokenizer."""
    from zebra.recipes import list_recipes, load_recipe
    from zebra.spec import arch

    rows = []
    for name in list_recipes():
        r = load_recipe(name)
        cfg = arch.as_config(r.model.flat())
        pattern = arch.resolve_pattern(cfg)
        rows.append(
            {
                "name": name,
                "model": r.description.split(",")[0],
                "mixer": _mixers(pattern),
                "params": arch.param_count(cfg).total,
                "seq_len": r.data.seq_len,
                "tokenizer": r.data.tokenizer,
            }
        )
    if json_:
        out.json(rows)
        return
    out.table(
        ["name", "model", "mixers", "params", "seq len", "tokenizer"],
        [
            [r["name"], r["model"], r["mixer"], _human(r["params"]), r["seq_len"], r["tokenizer"]]
            for r in rows
        ],
        justify={"params": "right", "seq len": "right"},
        wrap=("model", "mixers"),
        optional=("model", "tokenizer"),  # `zebra recipes show NAME` has both
    )


@app.command(
    epilog=examples(
        "zebra recipes show 1b-gdn-pure",
        "zebra recipes show tiny --set train.lr=1e-3",
        "zebra recipes show 1b-mamba-mla --params --seq-len 8192",
    )
)
def show(
    name: RecipeArg = None,
    set_: SetOpt = None,
    params: Annotated[
        bool,
        typer.Option(
            "--params",
            help="Show parameter counts, the layer pattern and the decode-cache size instead of the YAML.",
        ),
    ] = False,
    seq_len: Annotated[
        int | None, typer.Option(help="Sequence length for the cache figures (default: the recipe's).")
    ] = None,
    json_: JsonOpt = False,
    yes: YesOpt = False,
) -> None:
    """The resolved recipe (inheritance and overrides applied) as YAML, or its size with --params."""
    from zebra.recipes import dump_recipe, load_recipe

    recipe = load_recipe(_pick(name, yes), overrides=set_ or [])
    if params:
        _show_params(recipe, seq_len or recipe.data.seq_len, json_)
    elif json_:
        out.json(recipe.to_dict())
    else:
        out.raw(dump_recipe(recipe))


def _show_params(recipe, seq_len: int, json_: bool) -> None:
    from zebra.spec import arch

    cfg = arch.as_config(recipe.model.flat())
    pattern = arch.resolve_pattern(cfg)
    pc = arch.param_count(cfg)
    cache = arch.decode_cache(cfg, seq_len)
    t = recipe.model.teacher
    frac = arch.teacher_kv_fraction(cfg, t.num_layers, t.num_kv_heads, t.head_dim)
    info = {
        "recipe": recipe.name,
        "pattern": pattern,
        "params_total": pc.total,
        "params_non_embedding": pc.non_embedding,
        "params_by_kind": pc.by_kind,
        "cache_bytes_per_token": cache.per_token,
        "cache_state_bytes_per_sequence": cache.fixed_per_sequence,
        "cache_bytes_per_sequence": cache.per_sequence,
        "seq_len": seq_len,
        "teacher": t.name,
        "kv_cache_fraction_of_teacher": frac,
    }
    if json_:
        out.json(info)
        return
    rows = [
        ["parameters", f"{pc.total:,} ({_human(pc.total)})"],
        ["without embeddings", f"{pc.non_embedding:,} ({_human(pc.non_embedding)})"],
        *[[f"  {kind}", f"{n:,}"] for kind, n in pc.by_kind.items()],
        ["layer pattern", pattern],
        ["cache per token (bf16 MLA latents)", f"{cache.per_token:,} B"],
        ["recurrent + conv state per sequence (fp32)", f"{cache.fixed_per_sequence / 2**20:.2f} MiB"],
        [f"cache per sequence at {seq_len} tokens", f"{cache.per_sequence / 2**20:.2f} MiB"],
        [f"KV cache vs {t.name or 'teacher'} per token", f"{frac:.2%}"],
    ]
    out.table(["", recipe.name], rows)


@app.command(
    epilog=examples("zebra recipes cp 1b-gdn-pure my-gdn.yaml", "zebra recipes cp tiny recipes/ --force")
)
def cp(
    name: Annotated[str, typer.Argument(help="Built-in recipe to copy.", autocompletion=complete_recipe)],
    dest: Annotated[str, typer.Argument(help="Destination file, or folder (existing, or ending in '/').")],
    force: ForceOpt = False,
) -> None:
    """Copy a built-in recipe to start a custom one (it keeps its `extends:`, so edit only what differs)."""
    from zebra.recipes import find_recipe, load_recipe

    src = find_recipe(name)
    load_recipe(src)  # refuse to copy a broken recipe
    is_folder = Path(dest).is_dir() or dest.endswith(("/", "\\"))
    target = Path(dest) / src.name if is_folder else Path(dest)
    if target.exists() and not force:
        raise ZebraError(f"{target}: already exists", fix="pass --force to overwrite")
    make_folder(target.parent, fix="move that file away, or choose another DEST")
    tmp = target.with_name(target.name + ".tmp")  # `extends: NAME` still finds the built-in parent
    tmp.write_text(src.read_text())
    shutil.copymode(src, tmp)
    tmp.replace(target)
    out.result(f"copied {src.name} to {target}; edit it, then check it with `zebra recipes show {target}`")
