"""The student's shape: MLA placement, default ranks, rank bounds and recipes, from a teacher's shape alone."""

from __future__ import annotations

import itertools
import math

import pytest

from zebra.core.errors import ZebraError
from zebra.upcycle.student import (
    StudentOptions,
    default_ranks,
    mla_placement,
    parse_mla_layers,
    plan_student,
)
from zebra.upcycle.teachers.teacher import TeacherShape


def llama(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256) -> TeacherShape:
    """Llama-3.2-1B's shape by default."""
    return TeacherShape(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, tie_word_embeddings=True, rope_theta=500000.0,
        rms_norm_eps=1e-5, max_position_embeddings=131072,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("layers", "count", "published"),
    [
        (16, 4, [0, 5, 10, 14]),
        (16, 8, [0, 2, 4, 6, 8, 10, 12, 14]),
        (28, 6, [0, 5, 10, 16, 21, 26]),
        (28, 14, list(range(0, 27, 2))),
        (32, 8, [0, 4, 8, 12, 16, 20, 25, 30]),
        (32, 16, list(range(0, 31, 2))),
    ],
)
def test_mla_count_reproduces_the_published_placements(layers, count, published):
    assert list(mla_placement(layers, count)) == published


@pytest.mark.parametrize(("layers", "count"), [(30, 8), (30, 7), (24, 5), (12, 3), (40, 9)])
def test_mla_count_keeps_layer_0_and_l_minus_2_with_even_gaps(layers, count):
    placed = mla_placement(layers, count)
    gaps = [b - a for a, b in itertools.pairwise(placed)]
    assert placed[0] == 0 and placed[-1] == layers - 2 and len(set(placed)) == count
    assert max(gaps) - min(gaps) <= 1


def test_mla_count_of_every_layer_and_of_none():
    assert mla_placement(30, 30) == tuple(range(30))
    assert mla_placement(30, 0) == ()
    with pytest.raises(ZebraError, match="--mla 31: must be between 0 and 30"):
        mla_placement(30, 31)


def test_default_ranks_scale_the_published_1b_choice_and_stay_below_the_matrix_rank():
    assert default_ranks(llama()) == (1344, 128, 32)  # the published 1B: r_q 1344, r_kv 128, d_rope 32
    smol = llama(layers=30, hidden=576, heads=9, kv_heads=3)
    q_rank, kv_rank, rope = default_ranks(smol)
    assert (q_rank % 8, kv_rank % 8, rope) == (0, 0, 32)
    assert q_rank <= 576 and kv_rank <= 2 * 3 * 64
    tiny = llama(layers=2, hidden=64, heads=4, kv_heads=1, head_dim=16)
    q_rank, kv_rank, _ = default_ranks(tiny)
    assert q_rank <= 64 and kv_rank <= 2 * 16  # capped at min(rows, columns)


def test_plan_takes_every_shape_from_the_teacher():
    plan = plan_student(llama(), StudentOptions(mixer="mamba", mla=4))
    c = plan.config
    assert c["layer_pattern"] == "*-M-M-M-M-*-M-M-M-M-*-M-M-M-*-M-"
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]) == (
        2048,
        8192,
        32,
        128256,
    )
    assert (c["rope_theta"], c["rms_norm_eps"], c["tie_word_embeddings"]) == (500000.0, 1e-5, True)
    assert (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]) == (
        32,
        32,
        32,
        64,
    )
    # the Megatron layout of the published Mamba2: one B/C group per query head, head dim = state = Dh
    assert (c["mamba_num_groups"], c["mamba_head_dim"], c["mamba_state_dim"], c["mamba_expand"]) == (
        32,
        64,
        64,
        1,
    )
    gdn = plan_student(llama(), StudentOptions(mixer="gdn", mla_layers=(0, 15))).config
    assert gdn["layer_pattern"].count("*") == 2 and gdn["layer_pattern"][30] == "*"
    assert (gdn["gdn_num_heads"], gdn["gdn_num_v_heads"], gdn["gdn_head_dim"]) == (32, 32, 64)


def test_ranks_above_the_matrix_rank_are_refused_in_one_error():
    with pytest.raises(ZebraError) as e:
        plan_student(
            llama(hidden=576, heads=9, kv_heads=3), StudentOptions(kv_lora_rank=400, q_lora_rank=600)
        )
    assert "--kv-lora-rank 400 is above the rank of [W_k; W_v] (384" in e.value.message
    assert "--q-lora-rank 600 is above the rank of W_q (576" in e.value.message
    with pytest.raises(ZebraError, match="--qk-rope-head-dim 7 must be even"):
        plan_student(llama(), StudentOptions(qk_rope_head_dim=7))


def test_mamba_needs_an_attention_width_that_is_a_multiple_of_the_width():
    qwen3_like = llama(hidden=1024, heads=16, kv_heads=8, head_dim=128)  # H * Dh = 2048 = 2 * D: expand 2
    assert plan_student(qwen3_like, StudentOptions(mixer="mamba")).config["mamba_expand"] == 2
    with pytest.raises(ZebraError, match="Mamba2 needs the attention width 12 x 64 = 768"):
        plan_student(llama(hidden=1024, heads=12, head_dim=64, kv_heads=4), StudentOptions(mixer="mamba"))


def test_bad_mla_layer_lists_are_refused():
    assert parse_mla_layers("14,0, 5,10") == (0, 5, 10, 14)
    with pytest.raises(ZebraError, match="--mla-layers 0,x: not a comma-separated list"):
        parse_mla_layers("0,x")
    with pytest.raises(ZebraError, match="repeats a layer"):
        parse_mla_layers("0,5,5")
    with pytest.raises(ZebraError, match=r"layer 16 is outside 0\.\.15"):
        plan_student(llama(), StudentOptions(mla_layers=(0, 16)))
    with pytest.raises(ZebraError, match="--mla and --mla-layers both given"):
        plan_student(llama(), StudentOptions(mla=2, mla_layers=(0, 1)))
    with pytest.raises(ZebraError, match="--mixer lstm: unknown") as e:
        plan_student(llama(), StudentOptions(mixer="lstm"))
    assert e.value.fix == "use one of mamba, gdn, kda, gla"


@pytest.mark.parametrize(
    ("flag", "char"), [("mamba", "M"), ("mamba2", "M"), ("gdn", "G"), ("kda", "K"), ("gla", "L")]
)
def test_the_mixer_flag_takes_the_registry_names_and_their_pattern_characters(flag, char):
    from zebra.mixers import MIXERS

    plan = plan_student(llama(layers=4), StudentOptions(mixer=flag, mla_layers=(0,)))
    assert plan.config["layer_pattern"] == f"*-{char}-{char}-{char}-"
    spec = MIXERS[char]
    assert plan.config["recurrent_type"] == spec.name
    mixer_keys = {k for k in plan.config if k.startswith(spec.config_prefix + "_")}
    assert mixer_keys and mixer_keys <= set(spec.config_kwargs())  # the registry's own keys, nothing else


def test_a_recipe_for_this_teacher_gives_its_shapes(tmp_path):
    # the built-in 1b-mamba-mla trains from scratch with 8 B/C groups; an upcycle needs one group per head
    with pytest.raises(ZebraError, match=r"mamba_num_groups 8 \(teacher: 32\)"):
        plan_student(llama(), StudentOptions(recipe="1b-mamba-mla"))
    recipe = tmp_path / "upcycled-1b.yaml"
    recipe.write_text("extends: 1b-mamba-mla\nmodel:\n  mamba: {num_groups: 32}\n  mla: {kv_lora_rank: 96}\n")
    plan = plan_student(llama(), StudentOptions(recipe=str(recipe)))
    assert plan.config["kv_lora_rank"] == 96 and plan.mixer == "mamba2"
    assert plan.mla_layers == (0, 4, 8, 12)  # the recipe's own ratio placement
    assert plan_student(llama(), StudentOptions(recipe=str(recipe), mla=4)).mla_layers == (0, 5, 10, 14)


def test_a_recipe_that_does_not_fit_lists_every_mismatch_at_once():
    with pytest.raises(ZebraError) as e:
        plan_student(llama(hidden=576, heads=9, kv_heads=3, layers=30, ffn=1536, vocab=49152),
                     StudentOptions(recipe="1b-gdn-pure", mixer="mamba"))  # fmt: skip
    message = e.value.message
    for mismatch in ("model.recurrent_type gdn (--mixer mamba)", "vocab_size 128256", "hidden_size 2048",
                     "intermediate_size 8192", "model.num_layers 32 = 16 layers (teacher: 30 layers)", "gdn_num_heads 8"):  # fmt: skip
        assert mismatch in message, message
    with pytest.raises(ZebraError, match="--kv-lora-rank and --recipe both given"):
        plan_student(llama(), StudentOptions(recipe="1b-mamba-mla", kv_lora_rank=64))


def test_a_recipe_whose_pattern_mixes_recurrent_kinds_is_a_mismatch():
    with pytest.raises(
        ZebraError, match=r"model\.pattern '\*-M-G-K-' \(expected mixer/MLP pairs with one recurrent kind\)"
    ):
        plan_student(llama(layers=4), StudentOptions(recipe="tiny"))


def test_upcycled_students_have_no_latent_norms_unless_asked_or_their_recipe_has_them(tmp_path):
    assert plan_student(llama(), StudentOptions()).config["mla_latent_norm"] is False
    assert plan_student(llama(), StudentOptions(latent_norm=True)).config["mla_latent_norm"] is True
    recipe = tmp_path / "upcycled-1b.yaml"
    recipe.write_text("extends: 1b-mamba-mla\nmodel:\n  mamba: {num_groups: 32}\n")
    assert plan_student(llama(), StudentOptions(recipe=str(recipe))).config["mla_latent_norm"] is True
    plan = plan_student(llama(), StudentOptions(recipe=str(recipe), latent_norm=False))
    assert plan.config["mla_latent_norm"] is False


def test_a_teacher_context_extension_becomes_yarn_over_the_rope_channels():
    """Llama 3.2's `llama3` scaling (factor 32 from 8192) gives the published students' YaRN; none gives plain."""
    import dataclasses

    from zebra.models import ZebraConfig

    assert plan_student(llama(), StudentOptions()).config["rope_scaling"]["factor"] == 1.0
    extended = dataclasses.replace(llama(), rope_scaling="llama3", rope_factor=32.0, rope_original_max=8192)
    config = ZebraConfig(**plan_student(extended, StudentOptions()).config)
    rope = config.rope_parameters
    assert (rope["factor"], rope["original_max_position_embeddings"]) == (32.0, 8192)
    assert rope["mscale"] == rope["mscale_all_dim"] == 1.0
    from zebra.models.layers.rotary import yarn_softmax_scale

    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    assert yarn_softmax_scale(rope, qk) == pytest.approx((0.1 * math.log(32) + 1) ** 2 / math.sqrt(qk))


def test_the_context_extension_is_read_from_an_hf_config():
    from zebra.upcycle.teachers.teacher import shape_from_hf_config

    cfg = dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0, max_position_embeddings=131072,
               rope_scaling={"rope_type": "llama3", "factor": 32.0, "original_max_position_embeddings": 8192,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0})  # fmt: skip
    shape = shape_from_hf_config(cfg, "llama-3.2-1b")
    assert (shape.rope_scaling, shape.rope_factor, shape.rope_original_max) == ("llama3", 32.0, 8192)
    plain = shape_from_hf_config({**cfg, "rope_scaling": None}, "llama")
    assert (plain.rope_factor, plain.rope_original_max) == (1.0, None)
