"""The README.md model card of an export: architecture, layer pattern, parameters, training recipe, how to load."""

from __future__ import annotations

from typing import Any

_KIND_NAMES = {
    "M": "Mamba2",
    "G": "Gated DeltaNet",
    "K": "Kimi Delta Attention",
    "*": "MLA",
    "-": "SwiGLU MLP",
}


def _human(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


def model_card(config: Any, *, recipe: Any = None, source: str | None = None, tokenizer: Any = None) -> str:
    """Markdown text for README.md."""
    import yaml

    from zebra import arch

    pattern = arch.resolve_pattern(config)
    params = arch.param_count(config)
    counts = ", ".join(f"{pattern.count(c)} {_KIND_NAMES[c]}" for c in "MGK*-" if c in pattern)
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
        f"| layer pattern | `{pattern}` |",
        f"| sublayers | {len(pattern)} ({counts}) |",
        f"| hidden / ffn | {config.hidden_size} / {config.intermediate_size} |",
        f"| vocabulary | {config.vocab_size} |",
        f"| parameters | {params.total:,} ({_human(params.total)}; {_human(params.non_embedding)} non-embedding) |",
        f"| tied embeddings | {bool(config.tie_word_embeddings)} |",
        f"| RMSNorm eps | {config.rms_norm_eps} |",
    ]
    if "G" in pattern:
        lines.append(
            f"| Gated DeltaNet | {config.gdn_num_heads} key heads x {config.gdn_head_dim}, "
            f"{config.gdn_num_v_heads} value heads x {config.gdn_head_v_dim}, conv {config.gdn_conv_size} |"
        )
    if "K" in pattern:
        lines.append(
            f"| Kimi Delta Attention | {config.kda_num_heads} heads, key {config.kda_head_dim}, "
            f"value {config.kda_head_v_dim}, conv {config.kda_conv_size} |"
        )
    if "M" in pattern:
        lines.append(
            f"| Mamba2 | state {config.mamba_state_dim}, head {config.mamba_head_dim}, "
            f"groups {config.mamba_num_groups}, expand {config.mamba_expand} |"
        )
    if "*" in pattern:
        lines.append(
            f"| MLA | {config.num_attention_heads} heads, q rank {config.q_lora_rank}, kv rank "
            f"{config.kv_lora_rank}, nope/rope/v {config.qk_nope_head_dim}/{config.qk_rope_head_dim}/"
            f"{config.v_head_dim}, RoPE theta {config.rope_theta} |"
        )
    if tokenizer is not None:
        lines.append(f"| tokenizer | {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__} |")
    if source:
        lines += ["", "## Provenance", "", f"Converted by `zebra convert` from `{source}`."]
    if recipe is not None and hasattr(recipe, "to_dict"):
        data = recipe.to_dict()
        lines += [
            "",
            "## Training recipe",
            "",
            "```yaml",
            yaml.safe_dump({k: data[k] for k in ("data", "train") if k in data}, sort_keys=False).rstrip(),
            "```",
        ]
    lines += [
        "",
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
    return "\n".join(lines)
