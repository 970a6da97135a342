"""Primus-Megatron checkpoints (torch and torch_dist) -> Zebra exports with the logits of the model they came from."""

from __future__ import annotations

import pytest
import torch
from convert_helpers import build_model, load_zebra, logits, tokens
from megatron_writer import megatron_tensors, write_torch, write_torch_dist

from zebra.convert import convert, open_checkpoint
from zebra.core.errors import ZebraError
from zebra.spec import arch

CASES = [  # (model kind, TE-fused norms, tied embeddings)
    pytest.param("gdn", True, True, id="gdn-te-tied"),
    pytest.param("kda", False, False, id="kda-local-untied"),
    pytest.param("mamba-mla", True, True, id="mamba-mla-te-tied"),
    pytest.param("mamba-mla", False, False, id="mamba-mla-local-untied"),
]


@pytest.mark.parametrize("writer", [write_torch, write_torch_dist], ids=["torch", "torch_dist"])
@pytest.mark.parametrize(("kind", "te", "tie"), CASES)
def test_megatron_checkpoint_converts_to_the_same_model(tmp_path, writer, kind, te, tie):
    _, model = build_model(kind, tie=tie)
    pattern = arch.resolve_pattern(model.config)
    root = writer(tmp_path / "primus", model, pattern, te=te)

    result = convert(root, "hf", tmp_path / "export", tokenizer="byte")

    assert result.source_format == f"megatron-{writer.__name__.removeprefix('write_')}"
    assert result.pattern == pattern
    converted = load_zebra(result.output)
    expected = {k for k in model.state_dict() if not (tie and k == "lm_head.weight")}
    assert set(converted.state_dict()) >= expected
    ids = tokens()
    torch.testing.assert_close(logits(converted, ids), logits(model, ids), rtol=0, atol=0)


@pytest.mark.parametrize("te", [True, False], ids=["te", "local"])
def test_mla_without_latent_norms_converts_to_the_same_model(tmp_path, te):
    """A Megatron MLA checkpoint built with IdentityOp latent norms (the published upcycled students) has no
    norm tensors: the export says `mla_latent_norm: false` and computes the same logits."""
    _, model = build_model("mamba-mla", extra=("model.mla.latent_norm=false",))
    assert not any("kv_norm" in k for k in model.state_dict())
    pattern = arch.resolve_pattern(model.config)
    root = write_torch(tmp_path / "primus", model, pattern, te=te)

    result = convert(root, "hf", tmp_path / "export", tokenizer="byte")

    converted = load_zebra(result.output)
    assert converted.config.mla_latent_norm is False
    assert set(converted.state_dict()) == set(model.state_dict())
    ids = tokens()
    torch.testing.assert_close(logits(converted, ids), logits(model, ids), rtol=0, atol=0)


def test_every_megatron_tensor_is_used_once(tmp_path):
    """No Megatron tensor is silently dropped except TE extra state and KDA's unused gate_norm."""
    _, model = build_model("kda", tie=True)
    root = write_torch(tmp_path / "p", model, "K-K-", te=True)
    ckpt = open_checkpoint(root)
    used = {p.source for p in ckpt.tensors.pieces.values()}
    dropped = set(megatron_tensors(model, "K-K-", te=True)) - used
    assert dropped == {"decoder.layers.0.mixer.gate_norm.weight", "decoder.layers.2.mixer.gate_norm.weight"}


def make_marker(path):
    """Would run while unpickling a `_Payload`; the test asserts it never does."""
    open(path, "w").close()


class _Payload:
    """Unpickling this calls `call(marker)`: a stand-in for arbitrary code inside a checkpoint."""

    def __init__(self, marker, call):
        self.marker, self.call = str(marker), call

    def __reduce__(self):
        return (self.call, (self.marker,))


def test_args_are_read_with_weights_only_and_inert_stand_ins(tmp_path):
    """Globals the allow-list does not know are replaced by inert stand-ins: nothing in the file runs."""
    from zebra.convert.tensor_sources import torch_load

    _, model = build_model("gdn")
    marker = tmp_path / "code-ran"
    root = write_torch(tmp_path / "p", model, "G-G-", te=True, primus_hook=_Payload(marker, make_marker))
    state = torch_load(root / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt")
    assert state["args"].hidden_size == 64
    assert "make_marker" in repr(state["args"].primus_hook)
    assert not marker.exists()
    assert open_checkpoint(root).config.hidden_size == 64


def test_a_checkpoint_calling_blocked_modules_is_refused_in_one_line(tmp_path):
    import os

    _, model = build_model("gdn")
    marker = tmp_path / "code-ran"
    root = write_torch(tmp_path / "p", model, "G-G-", te=True, primus_hook=_Payload(marker, os.mkdir))
    with pytest.raises(ZebraError, match=r"refusing to unpickle posix\.mkdir"):
        open_checkpoint(root)
    assert not marker.exists()


def test_layers_that_contradict_the_saved_pattern_are_refused(tmp_path):
    _, model = build_model("mamba-mla")
    pattern = arch.resolve_pattern(model.config)
    root = write_torch(tmp_path / "p", model, pattern, te=True, hybrid_attention_ratio=0.5)
    with pytest.raises(ZebraError, match=r"hybrid_attention_ratio 0\.5"):
        open_checkpoint(root)


def test_tensor_parallel_torch_format_is_refused_with_a_fix(tmp_path):
    _, model = build_model("gdn")
    root = write_torch(tmp_path / "p", model, "G-G-", te=True)
    (root / "iter_0000100" / "mp_rank_01").mkdir()
    with pytest.raises(ZebraError, match="tensor/pipeline-parallel") as e:
        open_checkpoint(root)
    assert "torch_dist" in e.value.fix


def test_double_latent_norm_folds_only_when_the_first_is_ones(tmp_path):
    """Primus' newest TE MLA spec keeps q_layernorm and linear_q_up_proj.layer_norm_weight (two norms)."""
    _, model = build_model("mamba-mla")
    pattern = arch.resolve_pattern(model.config)
    tensors = megatron_tensors(model, pattern, te=True)
    sa = "decoder.layers.0.self_attention."
    for trained in (False, True):
        root = tmp_path / f"p{trained}"
        extra = torch.ones(model.config.q_lora_rank) * (1.5 if trained else 1.0)
        _write_state(root, {**tensors, sa + "q_layernorm.weight": extra}, model, pattern)
        if trained:
            with pytest.raises(ZebraError, match="two trained RMSNorms"):
                open_checkpoint(root)
        else:
            ckpt = open_checkpoint(root)
            assert any("folded" in n for n in ckpt.notes)
            assert torch.equal(
                ckpt.tensors.get("model.layers.0.mixer.q_norm.weight"),
                tensors[sa + "linear_q_up_proj.layer_norm_weight"],
            )


def _write_state(root, tensors, model, pattern):
    from megatron_writer import megatron_args

    d = root / "iter_0000001" / "mp_rank_00"
    d.mkdir(parents=True)
    torch.save(
        {"model": tensors, "args": megatron_args(model, pattern), "iteration": 1}, d / "model_optim_rng.pt"
    )
    (root / "latest_checkpointed_iteration.txt").write_text("1")


def test_a_layer_without_pre_norm_is_refused(tmp_path):
    """Primus' mamba_hybrid_stack_spec_no_te builds Mamba layers with no norm at all: not a Zebra model."""
    _, model = build_model("mamba-mla")
    pattern = arch.resolve_pattern(model.config)
    tensors = megatron_tensors(model, pattern, te=True)
    del tensors["decoder.layers.2.mixer.in_proj.layer_norm_weight"]
    _write_state(tmp_path / "p", tensors, model, pattern)
    with pytest.raises(ZebraError, match=r"decoder\.layers\.2 has no pre-norm"):
        open_checkpoint(tmp_path / "p")


def test_a_root_without_tracker_file_uses_the_newest_iteration(tmp_path):
    _, old = build_model("gdn", seed=1)
    _, new = build_model("gdn", seed=2)
    root = write_torch(tmp_path / "p", old, "G-G-", te=True, iteration=50)
    write_torch(root, new, "G-G-", te=True, iteration=150)
    (root / "latest_checkpointed_iteration.txt").unlink()
    ckpt = open_checkpoint(root)
    assert torch.equal(ckpt.tensors.get("model.norm.weight"), new.state_dict()["model.norm.weight"])
