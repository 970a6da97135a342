"""The README.md model card of an export: architecture, layer pattern, parameters, training recipe, how to load."""

from __future__ import annotations

from typing import Any

HOW_TO_LOAD = [
    "## How to load",
    "",
    "```python",
    "from transformers import AutoModelForCausalLM, AutoTokenizer",
    "",
    'model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)',
    'tokenizer = AutoTokenizer.from_pretrained("PATH")',
    'ids = tokenizer("The zebra", return_tensors="pt").input_ids',
    "print(tokenizer.decode(model.generate(ids, max_new_tokens=20)[0]))",
    "```",
    "",
    "The modeling code ships in this folder (`trust_remote_code`); the pure-PyTorch kernels run anywhere, "
    "the FLA Triton kernels are used on GPUs when `flash-linear-attention` is installed. With zebra "
    "installed: `zebra chat PATH`, `zebra eval PATH`, `zebra verify PATH`.",
    "",
]


def _human(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


def model_card(config: Any, *, recipe: Any = None, source: str | None = None, tokenizer: Any = None) -> str:
    """Markdown text for README.md."""
    name = getattr(recipe, "name", None) or "zebra model"
    lines = [
        "---",
        "library_name: transformers",
        "tags: [zebra, hybrid, linear-attention]",
        "---",
        f"# {name}",
        "",
        getattr(recipe, "description", "") or "A Zebra hybrid recurrent-attention language model.",
        "",
        "## Architecture",
        "",
        "| | |",
        "|---|---|",
        *_architecture_rows(config),
    ]
    if tokenizer is not None:
        lines.append(f"| tokenizer | {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} |")
    if source:
        lines += ["", "## Provenance", "", f"Converted by `zebra convert` from `{source}`."]
    if recipe is not None and hasattr(recipe, "to_dict"):
        lines += ["", *_recipe_section(recipe.to_dict())]
    return "\n".join([*lines, "", *HOW_TO_LOAD])


def _architecture_rows(config: Any) -> list[str]:
    """The architecture table: pattern, sizes, parameters, then one row per mixer kind with its shape."""
    from zebra.spec import arch

    pattern = arch.resolve_pattern(config)
    params = arch.param_count(config)
    mixers = arch.used_mixers(pattern)
    counts = ", ".join(f"{pattern.count(spec.char)} {spec.title}" for spec in mixers)
    rows = [
        f"| layer pattern | `{pattern}` |",
        f"| sublayers | {len(pattern)} ({counts}) |",
        f"| hidden / ffn | {config.hidden_size} / {config.intermediate_size} |",
        f"| vocabulary | {config.vocab_size} |",
        f"| parameters | {params.total:,} ({_human(params.total)}; {_human(params.non_embedding)} non-embedding) |",
        f"| tied embeddings | {bool(config.tie_word_embeddings)} |",
        f"| RMSNorm eps | {config.rms_norm_eps} |",
    ]
    return rows + [f"| {spec.title} | {spec.summary(config)} |" for spec in mixers if spec.summary(config)]


def _recipe_section(data: dict[str, Any]) -> list[str]:
    """The recipe's data and train sections as YAML."""
    import yaml

    recipe = yaml.safe_dump({k: data[k] for k in ("data", "train") if k in data}, sort_keys=False)
    return ["## Training recipe", "", "```yaml", recipe.rstrip(), "```"]
