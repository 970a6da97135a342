"""Teachers for the upcycle tests: tiny random Llama-family models, and any opened teacher (the real
SmolLM2-135M-Instruct: the `smollm2_gguf` fixture of tests/conftest.py), written as ordinary HF folders."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def write_hf_folder(folder: Path, teacher, *, num_layers: int | None = None) -> Path:
    """An HF folder (Llama for a Llama teacher) from an opened `zebra.upcycle` teacher, optionally only its first layers
    (a GGUF-loaded transformers model refuses `save_pretrained`, so the folder is written from the tensors)."""
    from safetensors.torch import save_file

    from zebra.upcycle.teachers.causal_lm import hf_config_from_shape

    s = teacher.shape
    layers = s.num_layers if num_layers is None else num_layers
    config = hf_config_from_shape(s, num_hidden_layers=layers, **s.special_ids)
    keep = [
        n
        for n in teacher.tensors.shapes()
        if not n.startswith("model.layers.") or int(n.split(".")[2]) < layers
    ]
    folder.mkdir(parents=True)
    save_file({n: teacher.tensors.get(n).contiguous() for n in keep}, folder / "model.safetensors")
    config.save_pretrained(folder)
    teacher.tokenizer.save_pretrained(folder)
    return folder


def tiny_llama(
    folder: Path, *, model_type: str = "llama", tie: bool = True, seed: int = 0, **overrides
) -> Path:
    """A random Llama-family model (hidden 64, 4 query heads, 2 KV heads, head dim 16, 2 layers, vocab 272)
    saved with the byte tokenizer; `model_type` "qwen2" adds q/k/v biases, "qwen3" per-head q/k norms."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from zebra.data.tokenizers import byte_tokenizer

    shape = dict(
        vocab_size=272, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, tie_word_embeddings=tie, rope_theta=10000.0, rms_norm_eps=1e-5,
        max_position_embeddings=512, bos_token_id=257, eos_token_id=256, pad_token_id=258,
    )  # fmt: skip
    config = AutoConfig.for_model(model_type, **{**shape, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))  # every norm different, so a swapped norm shows
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())
