"""Writes Primus/Megatron checkpoints from a Zebra model, for the converter tests.

The Zebra -> Megatron mapping here is written independently of zebra.convert (from Primus' module code:
GatedDeltaNet / KimiDeltaAttention fused `in_proj` and `conv1d`, megatron-core MambaMixer, MLASelfAttention,
MLP with `linear_fc1 = [gate; up]`), so the tests check the converter instead of restating its tables.

Two spec flavours: `te=True` (TELayerNormColumnParallelLinear: pre-norms fused into the next linear as
`layer_norm_weight`, `_extra_state` blobs) and `te=False` (separate `norm` / `pre_mlp_layernorm` /
`q_layernorm` modules).

`torch_dist` checkpoints are written with megatron-core's own `dist_checkpointing.save` (ShardedTensor,
the same `_split_tensor_factory` Primus' GDN/KDA modules and megatron's MambaMixer use, the SwiGLU factory of
megatron's MLP, ShardedObject for TE extra state), on CPU over a one-rank gloo group. Its only CUDA calls (a
stream sync and `current_device()` for a status tensor) are replaced for the duration of the save.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import torch

from megatron_save import save_torch_dist


def megatron_tensors(model, pattern: str, *, te: bool) -> dict[str, torch.Tensor]:
    """Megatron names -> tensors for a ZebraForCausalLM."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cfg = model.config
    out = {
        "embedding.word_embeddings.weight": sd["model.embeddings.weight"],
        "decoder.final_norm.weight": sd["model.norm.weight"],
    }
    if not cfg.tie_word_embeddings:
        out["output_layer.weight"] = sd["lm_head.weight"]
    for i, kind in enumerate(pattern):
        z, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        mix = z + "mixer."
        if kind in "GKM":
            out[m + ("mixer.in_proj.layer_norm_weight" if te else "norm.weight")] = sd[z + "norm.weight"]
        if kind == "G":
            out[m + "mixer.in_proj.weight"] = torch.cat(
                [
                    sd[mix + n + ".weight"]
                    for n in ("q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "a_proj")
                ]
            )
            out[m + "mixer.conv1d.weight"] = torch.cat([sd[mix + f"{c}_conv1d.weight"] for c in "qkv"])
            out[m + "mixer.A_log"] = sd[mix + "A_log"]
            out[m + "mixer.dt_bias"] = sd[mix + "dt_bias"]
            out[m + "mixer.out_norm.weight"] = sd[mix + "o_norm.weight"]
            out[m + "mixer.out_proj.weight"] = sd[mix + "o_proj.weight"]
        elif kind == "K":
            out[m + "mixer.in_proj.weight"] = torch.cat(
                [
                    sd[mix + n]
                    for n in (
                        "q_proj.weight",
                        "k_proj.weight",
                        "v_proj.weight",
                        "f_proj.0.weight",
                        "g_proj.0.weight",
                        "b_proj.weight",
                    )
                ]
            )
            out[m + "mixer.conv1d.weight"] = torch.cat([sd[mix + f"{c}_conv1d.weight"] for c in "qkv"])
            out[m + "mixer.f_b_proj.weight"] = sd[mix + "f_proj.1.weight"]
            out[m + "mixer.g_b_proj.weight"] = sd[mix + "g_proj.1.weight"]
            out[m + "mixer.g_b_proj.bias"] = sd[mix + "g_proj.1.bias"]
            out[m + "mixer.A_log"] = sd[mix + "A_log"].view(1, 1, -1, 1)
            out[m + "mixer.dt_bias"] = sd[mix + "dt_bias"]
            out[m + "mixer.out_norm.weight"] = sd[mix + "o_norm.weight"]
            out[m + "mixer.out_proj.weight"] = sd[mix + "o_proj.weight"]
            if te:
                out[m + "mixer.gate_norm.weight"] = torch.ones(cfg.hidden_size)
        elif kind == "M":
            for n in (
                "in_proj.weight",
                "conv1d.weight",
                "conv1d.bias",
                "A_log",
                "D",
                "dt_bias",
                "norm.weight",
            ):
                out[m + "mixer." + n] = sd[mix + n]
            out[m + "mixer.out_proj.weight"] = sd[mix + "out_proj.weight"]
        elif kind == "*":
            sa = m + "self_attention."
            out[m + "input_layernorm.weight"] = sd[z + "norm.weight"]
            out[sa + "linear_q_down_proj.weight"] = sd[mix + "q_down_proj.weight"]
            if mix + "q_norm.weight" in sd:  # no latent norms: q_layernorm / kv_layernorm = IdentityOp
                q_norm = "linear_q_up_proj.layer_norm_weight" if te else "q_layernorm.weight"
                out[sa + q_norm] = sd[mix + "q_norm.weight"]
            out[sa + "linear_q_up_proj.weight"] = sd[mix + "q_up_proj.weight"]
            out[sa + "linear_kv_down_proj.weight"] = sd[mix + "kv_down_proj.weight"]
            if mix + "kv_norm.weight" in sd:
                kv_norm = "linear_kv_up_proj.layer_norm_weight" if te else "kv_layernorm.weight"
                out[sa + kv_norm] = sd[mix + "kv_norm.weight"]
            out[sa + "linear_kv_up_proj.weight"] = sd[mix + "kv_up_proj.weight"]
            out[sa + "linear_proj.weight"] = sd[mix + "o_proj.weight"]
        else:
            norm = "mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"
            out[m + norm] = sd[z + "norm.weight"]
            out[m + "mlp.linear_fc1.weight"] = torch.cat(
                [sd[mix + "gate_proj.weight"], sd[mix + "up_proj.weight"]]
            )
            out[m + "mlp.linear_fc2.weight"] = sd[mix + "down_proj.weight"]
    return out


def megatron_args(model, pattern: str, **extra) -> argparse.Namespace:
    """The saved-arguments namespace Primus' zebra_llama configs produce (names as in Megatron's arguments)."""
    from megatron.core.transformer.enums import AttnBackend

    cfg = model.config
    args = argparse.Namespace(
        num_layers=len(pattern),
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.intermediate_size,
        is_hybrid_model=True,
        hybrid_attention_ratio=pattern.count("*") / (len(pattern) // 2),
        hybrid_override_pattern=None,
        spec=[
            "primus.backends.megatron.core.models.hybrid.hybrid_mamba_mla_layer_specs",
            "hybrid_stack_spec",
        ],
        mamba_state_dim=cfg.mamba_state_dim,
        mamba_head_dim=cfg.mamba_head_dim,
        mamba_num_groups=cfg.mamba_num_groups,
        linear_conv_kernel_dim=4,
        multi_latent_attention="*" in pattern,
        num_attention_heads=cfg.num_attention_heads,
        q_lora_rank=cfg.q_lora_rank,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_head_dim=cfg.qk_nope_head_dim,
        qk_pos_emb_head_dim=cfg.qk_rope_head_dim,
        v_head_dim=cfg.v_head_dim,
        rotary_base=int(cfg.rope_theta),
        rotary_scaling_factor=1.0,
        mscale=1.0,
        mscale_all_dim=1.0,
        untie_embeddings_and_output_weights=not cfg.tie_word_embeddings,
        normalization="RMSNorm",
        norm_epsilon=cfg.rms_norm_eps,
        swiglu=True,
        add_bias_linear=False,
        padded_vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        seq_length=256,
        tokenizer_type="HuggingFaceTokenizer",
        tokenizer_model="byte",
        params_dtype=torch.float32,
        attention_backend=AttnBackend.auto,  # an enum: exercises the safe-globals fallback
    )
    if "G" in pattern:
        args.linear_num_key_heads, args.linear_key_head_dim = cfg.gdn_num_heads, cfg.gdn_head_dim
        args.linear_num_value_heads, args.linear_value_head_dim = cfg.gdn_num_v_heads, cfg.gdn_head_v_dim
    if "K" in pattern:
        args.linear_num_key_heads = args.linear_num_value_heads = cfg.kda_num_heads
        args.linear_key_head_dim, args.linear_value_head_dim = cfg.kda_head_dim, cfg.kda_head_v_dim
    vars(args).update(extra)
    return args


def _extra_state_keys(tensors: dict[str, torch.Tensor], te: bool) -> list[str]:
    if not te:
        return []
    return [k.rsplit(".", 1)[0] + "._extra_state" for k in tensors if k.endswith(".layer_norm_weight")]


def write_torch(root: Path, model, pattern: str, *, te: bool, iteration: int = 100, **extra) -> Path:
    """`root/iter_XXXXXXX/mp_rank_00/model_optim_rng.pt` + `latest_checkpointed_iteration.txt`; returns root."""
    tensors = megatron_tensors(model, pattern, te=te)
    state: dict[str, object] = dict(tensors)
    for key in _extra_state_keys(tensors, te):
        state[key] = io.BytesIO(b"te-fp8-meta")  # TE's extra state is a pickled BytesIO in torch checkpoints
    directory = root / f"iter_{iteration:07d}" / "mp_rank_00"
    directory.mkdir(parents=True)
    torch.save(
        {
            "args": megatron_args(model, pattern, **extra),
            "checkpoint_version": 3.0,
            "iteration": iteration,
            "model": state,
            "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}},
            "rng_state": [{"random_rng_state": (3, (1, 2), None)}],
        },
        directory / "model_optim_rng.pt",
    )
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return root


# Primus' in_proj / conv1d part names (gated_delta_net.py, kimi_delta_attention.py) and megatron's MambaMixer's.
_SPLITS = {
    ("G", "mixer.in_proj.weight"): ["query", "key", "value", "z", "beta", "alpha"],
    ("K", "mixer.in_proj.weight"): ["query", "key", "value", "f_a", "g_a", "beta"],
    ("G", "mixer.conv1d.weight"): ["query", "key", "value"],
    ("K", "mixer.conv1d.weight"): ["query", "key", "value"],
    ("M", "mixer.in_proj.weight"): ["z", "x", "B", "C", "dt"],
    ("M", "mixer.conv1d.weight"): ["x", "B", "C"],
    ("M", "mixer.conv1d.bias"): ["x", "B", "C"],
}


def _split_sizes(cfg, kind: str, name: str) -> list[int]:
    if kind == "G":
        key, val, hv = (
            cfg.gdn_num_heads * cfg.gdn_head_dim,
            cfg.gdn_num_v_heads * cfg.gdn_head_v_dim,
            cfg.gdn_num_v_heads,
        )
        return [key, key, val, val, hv, hv] if "in_proj" in name else [key, key, val]
    if kind == "K":
        key, val = cfg.kda_num_heads * cfg.kda_head_dim, cfg.kda_num_heads * cfg.kda_head_v_dim
        return (
            [key, key, val, cfg.kda_head_v_dim, cfg.kda_head_v_dim, cfg.kda_num_heads]
            if "in_proj" in name
            else [key, key, val]
        )
    d_inner = cfg.mamba_expand * cfg.hidden_size
    gn = cfg.mamba_num_groups * cfg.mamba_state_dim
    heads = d_inner // cfg.mamba_head_dim
    return [d_inner, d_inner, gn, gn, heads] if "in_proj" in name else [d_inner, gn, gn]


def write_torch_dist(root: Path, model, pattern: str, *, te: bool, iteration: int = 100, **extra) -> Path:
    """A torch_dist checkpoint saved by megatron-core's `dist_checkpointing.save`; returns root."""
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor
    from megatron.core.ssm.mamba_mixer import _split_tensor_factory
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

    tensors = megatron_tensors(model, pattern, te=te)
    sharded: dict[str, object] = {}
    for key, t in tensors.items():
        sh = ShardedTensor.from_rank_offsets(key, t.contiguous(), replica_id=0)
        parts = key.split(".", 3)
        if key.startswith("decoder.layers.") and len(parts) == 4:
            kind, sub = pattern[int(parts[2])], parts[3]
            if (kind, sub) in _SPLITS:
                sh = _split_tensor_factory(sh, _split_sizes(model.config, kind, sub), _SPLITS[kind, sub], 0)
            elif sub == "mlp.linear_fc1.weight":
                sh = apply_swiglu_sharded_factory(sh, ())
        sharded[key] = sh
    for key in _extra_state_keys(tensors, te):
        sharded[key] = ShardedObject(key, io.BytesIO(b"te-fp8-meta"), (1,), (0,), replica_id=0)
    first = next(iter(tensors))
    sharded["optimizer"] = ShardedTensor.from_rank_offsets(
        f"optimizer.state.exp_avg.{first}", torch.zeros_like(tensors[first]), replica_id=0
    )
    state = {
        "model": sharded,
        "args": megatron_args(model, pattern, **extra),
        "checkpoint_version": 3.0,
        "iteration": iteration,
    }
    return save_torch_dist(root, state, iteration)
