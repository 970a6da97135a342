"""Writes dense Megatron GPT checkpoints (megatron-core key names) from an HF Llama-family folder.

The HF -> Megatron mapping is written here independently of zebra.upcycle, from megatron-core 0.16's modules:
`SelfAttention.linear_qkv` holds, per query group g, [the query heads of g | k_g | v_g] (get_query_key_value_tensors),
`MLP.linear_fc1` is [gate; up] with SwiGLU, GPTModel's final norm is `decoder.final_layernorm`. Two layer specs:
TE (`linear_qkv.layer_norm_weight`, `linear_fc1.layer_norm_weight`, `_extra_state` blobs) and local
(`input_layernorm`, `pre_mlp_layernorm`). `torch_dist` is saved with megatron-core's `dist_checkpointing.save` on
CPU over a one-rank gloo group, `linear_fc1` through megatron's SwiGLU sharded factory.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from megatron_save import save_torch_dist


def megatron_tensors(folder: Path, *, te: bool, interleaved: bool = False) -> dict[str, torch.Tensor]:
    """Megatron names -> tensors for the HF model in `folder` (rows of q/k heads pair-interleaved if asked)."""
    cfg = json.loads((folder / "config.json").read_text())
    sd = load_file(folder / "model.safetensors")
    heads, groups, dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    out = {"embedding.word_embeddings.weight": sd["model.embed_tokens.weight"]}
    for i in range(cfg["num_hidden_layers"]):
        hf, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        for suffix in ("weight", "bias"):
            if hf + f"self_attn.q_proj.{suffix}" not in sd:
                continue
            q, k, v = (sd[hf + f"self_attn.{p}_proj.{suffix}"] for p in "qkv")
            if interleaved:
                q, k = _to_interleaved(q, dh), _to_interleaved(k, dh)
            q = q.reshape(groups, heads // groups * dh, *q.shape[1:])
            k, v = k.reshape(groups, dh, *k.shape[1:]), v.reshape(groups, dh, *v.shape[1:])
            out[m + f"self_attention.linear_qkv.{suffix}"] = torch.cat([q, k, v], dim=1).reshape(
                -1, *q.shape[2:]
            )
        out[m + ("self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight")] = sd[
            hf + "input_layernorm.weight"
        ]
        for p, name in (("q", "q_layernorm"), ("k", "k_layernorm")):
            if hf + f"self_attn.{p}_norm.weight" in sd:
                norm = sd[hf + f"self_attn.{p}_norm.weight"]
                out[m + f"self_attention.{name}.weight"] = _to_interleaved(norm, dh) if interleaved else norm
        out[m + "self_attention.linear_proj.weight"] = sd[hf + "self_attn.o_proj.weight"]
        out[m + ("mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight")] = sd[
            hf + "post_attention_layernorm.weight"
        ]
        out[m + "mlp.linear_fc1.weight"] = torch.cat(
            [sd[hf + "mlp.gate_proj.weight"], sd[hf + "mlp.up_proj.weight"]]
        )
        out[m + "mlp.linear_fc2.weight"] = sd[hf + "mlp.down_proj.weight"]
    out["decoder.final_layernorm.weight"] = sd["model.norm.weight"]
    if not cfg.get("tie_word_embeddings", False):
        out["output_layer.weight"] = sd["lm_head.weight"]
    return out


def _to_interleaved(rows: torch.Tensor, dh: int) -> torch.Tensor:
    """Per head: rotate-half row j, j + dh/2 -> rows 2j, 2j + 1."""
    heads = rows.reshape(-1, 2, dh // 2, *rows.shape[1:])  # [heads, 2, Dh/2, ...]
    return heads.transpose(1, 2).reshape(rows.shape)


def megatron_args(folder: Path, **extra) -> argparse.Namespace:
    """Saved arguments of a Megatron Llama run (names as in megatron/training/arguments.py)."""
    cfg = json.loads((folder / "config.json").read_text())
    args = argparse.Namespace(
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        ffn_hidden_size=cfg["intermediate_size"],
        num_attention_heads=cfg["num_attention_heads"],
        group_query_attention=True,
        num_query_groups=cfg["num_key_value_heads"],
        kv_channels=cfg["head_dim"],
        normalization="RMSNorm",
        norm_epsilon=cfg["rms_norm_eps"],
        swiglu=True,
        position_embedding_type="rope",
        rotary_base=int(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]),
        rotary_percent=1.0,
        rotary_interleaved=False,
        add_bias_linear=False,
        add_qkv_bias=cfg["model_type"] == "qwen2",
        qk_layernorm=cfg["model_type"] == "qwen3",
        untie_embeddings_and_output_weights=not cfg.get("tie_word_embeddings", False),
        padded_vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg["max_position_embeddings"],
        seq_length=256,
        tokenizer_type="HuggingFaceTokenizer",
        tokenizer_model=str(folder),
        num_experts=None,
    )
    vars(args).update(extra)
    return args


def write_torch(
    root: Path, folder: Path, *, te: bool, interleaved: bool = False, iteration: int = 10, **extra
) -> Path:
    """`root/iter_XXXXXXX/mp_rank_00/model_optim_rng.pt` + the tracker file; returns root."""
    state: dict[str, object] = dict(megatron_tensors(folder, te=te, interleaved=interleaved))
    if te:
        for key in [k for k in state if k.endswith(".layer_norm_weight")]:
            state[key.rsplit(".", 1)[0] + "._extra_state"] = io.BytesIO(b"te-fp8-meta")
    directory = root / f"iter_{iteration:07d}" / "mp_rank_00"
    directory.mkdir(parents=True)
    args = megatron_args(folder, rotary_interleaved=interleaved, **extra)
    torch.save(
        {"args": args, "iteration": iteration, "model": state, "checkpoint_version": 3.0},
        directory / "model_optim_rng.pt",
    )
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return root


def write_torch_dist(root: Path, folder: Path, *, te: bool, iteration: int = 10, **extra) -> Path:
    """A torch_dist checkpoint saved by megatron-core's `dist_checkpointing.save`; returns root."""
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

    tensors = megatron_tensors(folder, te=te)
    sharded: dict[str, object] = {}
    for key, t in tensors.items():
        sh = ShardedTensor.from_rank_offsets(key, t.contiguous(), replica_id=0)
        sharded[key] = apply_swiglu_sharded_factory(sh, ()) if key.endswith("mlp.linear_fc1.weight") else sh
    if te:
        for key in [k for k in tensors if k.endswith(".layer_norm_weight")]:
            extra_key = key.rsplit(".", 1)[0] + "._extra_state"
            sharded[extra_key] = ShardedObject(
                extra_key, io.BytesIO(b"te-fp8-meta"), (1,), (0,), replica_id=0
            )
    state = {"model": sharded, "args": megatron_args(folder, **extra), "iteration": iteration}
    return save_torch_dist(root, state, iteration)
