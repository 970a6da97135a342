"""`zebra upcycle --calibrate`: gates from the teacher's attention, the per-layer fit, the report, and what it is
worth on the real SmolLM2 teacher."""

from __future__ import annotations

import json
import math

import pytest
import torch

from zebra.core.errors import ZebraError
from zebra.mixers import recurrent_spec, resolve
from zebra.upcycle import StudentOptions
from zebra.upcycle.attention_records import attention_statistics, record_attention
from zebra.upcycle.calibrate import CalibrateOptions
from zebra.upcycle.fit import FitOptions, relative_error
from zebra.upcycle.gates import beta_from_entropy, fit_value_scale
from zebra.upcycle.run import upcycle

from .teachers import tiny_llama

TINY_FIT = CalibrateOptions(  # teacher-forced: each layer's fit can be checked on the teacher's own records
    "@sample", samples=4, seq_len=32, device="cpu", fit=FitOptions(steps=24, eval_every=8), sequential=False
)


def test_attention_statistics_of_known_maps():
    T = 6
    own = torch.eye(T)[None, None]  # every row attends to itself: distance 0, entropy 0
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # row i: 1/(i+1) on 0..i
    distance, entropy = attention_statistics(torch.cat([own, uniform[None, None]], dim=1))  # [1, 2, T, T]
    assert distance[0] == 0 and entropy[0] == 0
    assert distance[1].item() == pytest.approx(sum(i / 2 for i in range(T)))  # E[i - j] = i / 2
    assert entropy[1].item() == pytest.approx(sum(math.log(i + 1) for i in range(T)), rel=1e-5)


@pytest.mark.parametrize("kind", ["mamba2", "gdn", "kda"])
def test_gates_give_each_head_the_half_life_of_its_attention_distance(tmp_path, kind):
    """After the mixer's gate init (its upcycle adapter's `gates`), each head's decay per token is g = ln 2 / distance: the state halves in `distance`
    tokens; for the delta rules, beta at the mean input is 0.3 + 0.4 c (c = 1 for the sharpest head)."""
    from zebra.models.modeling_zebra import ZebraSublayer
    from zebra.upcycle.student import mixer_shapes
    from zebra.upcycle.teachers.teacher import TeacherShape
    from zebra_kernels import gdn_gate, kda_gate

    shape = TeacherShape(272, 64, 96, 2, 4, 2, 16, True, 1e4, 1e-5, 512)
    char = {"mamba2": "M", "gdn": "G", "kda": "K"}[kind]
    from zebra.models import ZebraConfig

    config = ZebraConfig(vocab_size=272, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         layer_pattern=char + "-", kernel_backend="torch", **mixer_shapes(shape, kind, []))  # fmt: skip
    mixer = ZebraSublayer(config, 0).mixer
    distance, entropy = torch.tensor([0.2, 3.0, 10.0, 1000.0]), torch.tensor([0.5, 1.0, 2.0, 3.0])
    mean_input = torch.randn(64)
    resolve(recurrent_spec(kind).upcycle.gates)(mixer, distance, entropy, mean_input)

    x = mean_input.view(1, 1, 64)
    if kind == "mamba2":
        dt = mixer.in_proj(x)[..., -4:]  # the dt rows, zeroed
        log_decay = -torch.exp(mixer.A_log) * torch.nn.functional.softplus(dt + mixer.dt_bias)  # [1, 1, H]
    elif kind == "gdn":
        log_decay = gdn_gate(mixer.a_proj(x), mixer.A_log, mixer.dt_bias)
    else:
        raw = mixer.f_proj(x).unflatten(-1, (4, 16))
        log_decay = kda_gate(raw, mixer.A_log, mixer.dt_bias)[..., 0]  # every channel of a head alike
    half_life = math.log(2) / -log_decay.flatten()
    expected = torch.tensor([0.5, 3.0, 10.0, math.log(2) / 1e-3])  # floor 0.5, clamp at g = 1e-3
    torch.testing.assert_close(half_life.detach().float(), expected, rtol=1e-4, atol=1e-4)
    if kind != "mamba2":
        beta = torch.sigmoid(mixer.b_proj(x)).flatten().detach()
        torch.testing.assert_close(beta, beta_from_entropy(entropy), rtol=1e-4, atol=1e-5)
        assert beta[0] == pytest.approx(0.7, abs=1e-4) and beta[-1] == pytest.approx(0.3, abs=1e-4)


@pytest.mark.parametrize("kind", ["mamba2", "gdn", "kda"])
def test_gates_set_a_mixer_on_another_device_than_the_teacher_records(kind):
    """On a GPU the mixer and the layer's mean input are on the GPU while the teacher heads' statistics stay on
    the CPU (`record_attention` keeps its records there); the gate init must not mix the two (it did for GDN and
    KDA: the first GPU calibration of a GDN student stopped there). The meta device stands in for the GPU."""
    from zebra.models import ZebraConfig
    from zebra.models.modeling_zebra import ZebraSublayer
    from zebra.upcycle.student import mixer_shapes
    from zebra.upcycle.teachers.teacher import TeacherShape

    shape = TeacherShape(272, 64, 96, 2, 4, 2, 16, True, 1e4, 1e-5, 512)
    char = {"mamba2": "M", "gdn": "G", "kda": "K"}[kind]
    config = ZebraConfig(vocab_size=272, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         layer_pattern=char + "-", kernel_backend="torch", **mixer_shapes(shape, kind, []))  # fmt: skip
    mixer = ZebraSublayer(config, 0).mixer.to("meta")
    distance, entropy = torch.tensor([0.2, 3.0, 10.0, 1000.0]), torch.tensor([0.5, 1.0, 2.0, 3.0])
    mean_input = torch.randn(64, device="meta")
    gates = resolve(recurrent_spec(kind).upcycle.gates)(mixer, distance, entropy, mean_input)
    assert len(gates["decay"]) == 4
    assert all(p.device.type == "meta" for p in mixer.parameters())


@pytest.mark.parametrize("kind", ["mamba2", "gdn", "kda", "gla"])
def test_pass_through_makes_the_short_convs_the_identity_and_the_output_gate_steady(kind):
    """After `pass_through`, every short conv gives SiLU of the current token's input (no random mix of the
    last W tokens) and the output gate's pre-activation is 3 on every channel at the layer's mean input."""
    from zebra.models import ZebraConfig
    from zebra.models.modeling_zebra import ZebraSublayer
    from zebra.upcycle.gates import STEADY_GATE, pass_through
    from zebra.upcycle.student import mixer_shapes
    from zebra.upcycle.teachers.teacher import TeacherShape
    from zebra_kernels import causal_conv1d

    shape = TeacherShape(272, 64, 96, 2, 4, 2, 16, True, 1e4, 1e-5, 512)
    char = {"mamba2": "M", "gdn": "G", "kda": "K", "gla": "L"}[kind]
    config = ZebraConfig(vocab_size=272, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         layer_pattern=char + "-", kernel_backend="torch", **mixer_shapes(shape, kind, []))  # fmt: skip
    mixer = ZebraSublayer(config, 0).mixer
    mean_input = torch.randn(64)
    done = pass_through(mixer, mean_input)
    convs = [getattr(mixer, n) for n in ("conv1d", "q_conv1d", "k_conv1d", "v_conv1d") if hasattr(mixer, n)]
    assert convs and len(done) == len(convs) + 1, done
    with torch.no_grad():
        for conv in convs:
            x = torch.randn(2, 7, conv.weight.shape[0])
            y, _ = causal_conv1d(x, conv.weight.squeeze(1), conv.bias, backend="torch")
            torch.testing.assert_close(y, torch.nn.functional.silu(x))
        if kind == "mamba2":
            gate = mixer.in_proj(mean_input)[: mixer.d_inner]
        else:
            gate = mixer.g_proj(mean_input)
    torch.testing.assert_close(gate, torch.full_like(gate, STEADY_GATE), rtol=1e-4, atol=1e-4)


def test_value_scale_is_the_least_squares_scale_per_head():
    """A target made by scaling each head's columns of the output projection by known factors is recovered."""
    mixer = torch.nn.Module()
    mixer.o_proj = torch.nn.Linear(3 * 4, 8, bias=False)
    heads = torch.randn(50, 3, 4)  # [N, H, Dv]
    known = torch.tensor([0.5, 2.0, -1.0])
    target = mixer.o_proj((heads * known[None, :, None]).flatten(1)).detach()
    scale = fit_value_scale(mixer, heads, target)
    assert scale == pytest.approx(known.tolist(), abs=1e-3)
    torch.testing.assert_close(mixer.o_proj(heads.flatten(1)), target, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mixer", ["mamba", "gdn", "kda", "gla"])
def test_calibration_lowers_every_layers_error_and_the_export_holds_the_fitted_mixers(tmp_path, mixer):
    from zebra.models import ZebraForCausalLM
    from zebra.upcycle import open_teacher
    from zebra.upcycle.calibration import calibration_tokens

    teacher_dir = tiny_llama(tmp_path / "llama")
    out = tmp_path / "student"
    report = upcycle(teacher_dir, out, StudentOptions(mixer=mixer, mla_layers=(1,)), calibrate=TINY_FIT)

    written = json.loads((out / "upcycle.json").read_text())
    assert written["calibration"] == report.calibration
    fits = report.calibration["layers"]
    assert [(f["layer"], f["mixer"]) for f in fits] == [
        (0, {"mamba": "mamba2"}.get(mixer, mixer)),
        (1, "mla"),
    ]
    for f in fits:
        assert f["error_fit"] < f["error_upcycled"], f
        assert f["error_fit"] <= f["error_init"] + 1e-9, f
    has_gate_init = recurrent_spec({"mamba": "mamba2"}.get(mixer, mixer)).upcycle.gates is not None
    assert bool(fits[0]["gates"].get("decay")) == has_gate_init  # GLA's gates keep their initialisation
    assert len(fits[1]["gates"]["value_scale"]) == 4
    hows = {t.name: t.how for t in report.tensors}
    assert (
        hows[
            "model.layers.0.mixer.o_proj.weight"
            if mixer != "mamba"
            else "model.layers.0.mixer.out_proj.weight"
        ]
        == "fitted"
    )
    assert hows["model.layers.2.mixer.kv_down_proj.weight"] == "fitted"
    assert (
        hows["model.layers.1.mixer.up_proj.weight"] == "copied"
        and hows["model.layers.0.norm.weight"] == "copied"
    )

    # the export's mixers reproduce the reported errors on the teacher's own records
    teacher = open_teacher(teacher_dir)
    tokens = calibration_tokens("@sample", teacher.tokenizer, 272, TINY_FIT.samples, TINY_FIT.seq_len)
    records = record_attention(teacher, tokens, [0, 1], device="cpu")
    student = ZebraForCausalLM.from_pretrained(out, kernel_backend="torch").float()
    for f in fits:
        layer = student.model.layers[2 * f["layer"]].mixer
        error = relative_error(layer, records[f["layer"]].inputs, records[f["layer"]].outputs)
        assert error == pytest.approx(f["error_fit"], rel=1e-3)
    teacher.tensors.close()


def test_calibrate_through_the_cli(tmp_path):
    from typer.testing import CliRunner

    from zebra.cli.main import app

    teacher_dir = tiny_llama(tmp_path / "llama")
    args = ["upcycle", str(teacher_dir), "-o", str(tmp_path / "s"), "--mixer", "gdn", "--mla-layers", "1",
            "--calibrate", "@sample", "--calibrate-samples", "2", "--calibrate-seq-len", "32",
            "--calibrate-steps", "3"]  # fmt: skip
    table = CliRunner().invoke(app, args, env={"COLUMNS": "220"})
    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.split())
    for needle in ("calibration: ||y - y_teacher|| / ||y_teacher|| on 64 tokens", "fitted", "best step"):
        assert needle in text, table.stdout
    flags = ["--calibrate-batch", "1", "--calibrate-lr", "3e-3", "--calibrate-schedule", "cosine",
             "--calibrate-sequential", "--calibrate-output-lstsq", "--calibrate-keep-init"]  # fmt: skip
    as_json = CliRunner().invoke(app, [*args, *flags, "--force", "--json"])
    assert as_json.exit_code == 0, as_json.output
    record = json.loads(as_json.stdout)["calibration"]
    assert [f["mixer"] for f in record["layers"]] == ["gdn", "mla"]
    assert {k: record[k] for k in ("batch", "lr", "schedule", "sequential", "output_lstsq", "pass_through")} == {
        "batch": 1, "lr": 3e-3, "schedule": "cosine", "sequential": True, "output_lstsq": True,
        "pass_through": False}  # fmt: skip


def test_both_commands_calibrate_teacher_forced_unless_told_and_either_flag_chooses():
    """Teacher-forced fits compose (zebra distill) and start the directly calibrated hybrid lower too (docs/upcycle.md
    "Two students, composed"); --calibrate-sequential fits on the student's own stream, with its correction."""
    from zebra.upcycle.calibrate import calibrate_options

    assert calibrate_options("d").sequential is False
    for chosen in (False, True):
        assert calibrate_options("d", teacher_forced=chosen).sequential is not chosen
    assert calibrate_options("d", teacher_forced=False, correct_residual=0.5).correct_residual == 0.5
    with pytest.raises(
        ZebraError, match=r"--calibrate-correct-residual with --calibrate-teacher-forced \(the def"
    ):
        calibrate_options("d", correct_residual=0.5)


@pytest.mark.parametrize(
    ("device", "gpu", "size"),
    [
        ("cpu", False, (16, 128, 50, 2)),  # minutes on a CPU
        ("auto", False, (16, 128, 50, 2)),
        ("cuda", True, (128, 512, 600, 8)),  # the measured 1.49x, about 100 s a student on one H100
        ("auto", True, (128, 512, 600, 8)),
    ],
)
def test_the_default_size_of_a_calibration_is_larger_on_a_gpu(monkeypatch, device, gpu, size):
    """Both commands (`calibrate_options` for the flags, `PipelineOptions.calibration` from Python) size a
    calibration by its device when not told, keep what they are told, and never default the batch above the
    samples."""
    from zebra.train.pipeline import PipelineOptions
    from zebra.upcycle.calibrate import calibrate_options

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)  # this machine has no GPU: say it has one
    o = calibrate_options("d", device)
    assert (o.samples, o.seq_len, o.fit.steps, o.fit.batch) == size
    told = calibrate_options("d", device, samples=4, steps=7)
    assert (told.samples, told.seq_len, told.fit.steps, told.fit.batch) == (4, size[1], 7, min(size[3], 4))
    pipeline = PipelineOptions(teacher="t", data="d", tokens=1000, output="o", device=device)
    p = pipeline.calibration()
    assert (p.samples, p.seq_len, p.fit.steps, p.fit.batch) == size
    p = PipelineOptions(
        teacher="t", data="d", tokens=1000, output="o", device=device, calibrate_batch=1
    ).calibration()
    assert (p.samples, p.fit.batch) == (size[0], 1)


@pytest.mark.parametrize(
    "flags, culprit",
    [
        (["--calibrate-lr", "0"], "--calibrate-lr 0.0: out of range"),
        (["--calibrate-lr", "nan"], "--calibrate-lr nan: out of range"),
        (["--calibrate-schedule", "step"], "--calibrate-schedule step: out of range"),
        (
            ["--calibrate-batch", "3"],
            "--calibrate-batch 3: out of range hint: pass between 1 and --calibrate-samples (2)",
        ),
        (
            ["--calibrate-sequential", "--calibrate-correct-residual", "2"],
            "--calibrate-correct-residual 2.0: out of range",
        ),
        (["--calibrate-steps", "-1"], "--calibrate-steps -1: out of range"),
        (
            ["--calibrate-teacher-forced", "--calibrate-correct-residual", "0.5"],
            "--calibrate-correct-residual with --calibrate-teacher-forced",
        ),
        (
            ["--calibrate-correct-residual", "0.5"],
            "--calibrate-correct-residual with --calibrate-teacher-forced (the default)",
        ),
        (["--no-calibrate-data", "--calibrate-steps", "5"], "--calibrate-steps without --calibrate DATA"),
        (
            ["--no-calibrate-data", "--calibrate-pass-through"],
            "--calibrate-pass-through without --calibrate DATA",
        ),
        (
            ["--no-calibrate-data", "--calibrate-sequential"],
            "--calibrate-sequential without --calibrate DATA",
        ),
    ],
)
def test_bad_calibration_flags_are_refused_in_one_line_before_any_work(tmp_path, flags, culprit):
    """`zebra upcycle`: each bad --calibrate-* value (or one without --calibrate) is one line naming the flag, and
    nothing is written; the teacher is not even read (a folder that does not exist would be refused after)."""
    from typer.testing import CliRunner

    from zebra.cli.main import app

    data = [] if flags[0] == "--no-calibrate-data" else ["--calibrate", "@sample", "--calibrate-samples", "2"]
    flags = [f for f in flags if f != "--no-calibrate-data"]
    out = tmp_path / "s"
    result = CliRunner().invoke(app, ["upcycle", str(tmp_path / "no-teacher"), "-o", str(out), *data, *flags])
    assert result.exit_code == 1, result.output
    assert culprit in " ".join(result.output.split()) and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) <= 2 and not out.exists()


@pytest.mark.slow
def test_a_calibrated_smollm2_student_is_far_closer_to_its_teacher(
    smollm2_dir, python_docs_tokens, python_docs
):
    """The real teacher (30 layers), every layer MLA at the default ranks (the KV latent keeps rank 40 of 384):
    calibrating the MLA layers on 256 tokens of Python documentation, 15 steps each, lowers the held-out loss by
    more than a nat. The students are built in memory from the tensor sources the export would write."""
    from zebra.models import ZebraConfig
    from zebra.upcycle import open_teacher
    from zebra.upcycle.calibrate import CalibratedSource, calibrate_student
    from zebra.upcycle.source import UpcycledSource
    from zebra.upcycle.student import plan_student

    from .test_heldout import heldout_loss, heldout_tokens

    teacher = open_teacher(smollm2_dir)
    config = ZebraConfig(**plan_student(teacher.shape, StudentOptions(mla_layers="all")).config)
    source = UpcycledSource(teacher, config, torch.float32)
    fit = CalibrateOptions(str(python_docs_tokens), samples=4, seq_len=64, device="cpu",
                           fit=FitOptions(steps=15, eval_every=15))  # fmt: skip
    calibrated = calibrate_student(teacher, config, source, fit)
    ids = heldout_tokens(python_docs, teacher.tokenizer, sequences=2, length=128)

    plain = heldout_loss(_model(config, source), ids)
    after = heldout_loss(_model(config, CalibratedSource(source, calibrated)), ids)
    teacher.tensors.close()

    assert all(f.error_fit < f.error_upcycled for f in calibrated.layers)
    assert plain - after > 1.0, (plain, after)


def _model(config, source):
    """A ZebraForCausalLM holding the tensors of `source` (torch kernels)."""
    from zebra.models import ZebraForCausalLM

    config.kernel_backend = "torch"
    with torch.device("meta"):
        model = ZebraForCausalLM(config)
    model.load_state_dict({n: source.get(n) for n in source.shapes()}, strict=False, assign=True)
    model.tie_weights()
    return model.eval()


def _calibrated(teacher, mixer: str, **options):
    """`calibrate_student` of a hybrid (layer 1 MLA) of `teacher` with TINY_FIT changed by `options`."""
    import dataclasses

    from zebra.models import ZebraConfig
    from zebra.upcycle.calibrate import calibrate_student
    from zebra.upcycle.source import UpcycledSource
    from zebra.upcycle.student import plan_student

    config = ZebraConfig(**plan_student(teacher.shape, StudentOptions(mixer=mixer, mla_layers=(1,))).config,
                         kernel_backend="torch")  # fmt: skip
    fit = dataclasses.replace(TINY_FIT.fit, **options.pop("fit", {}))
    return calibrate_student(teacher, config, UpcycledSource(teacher, config, torch.float32),
                             dataclasses.replace(TINY_FIT, fit=fit, **options))  # fmt: skip


@pytest.mark.parametrize("correct_residual", [0.0, 1.0])
def test_sequential_fit_starts_where_the_teacher_forced_one_does_and_follows_the_students_stream(
    tmp_path, correct_residual
):
    """Layer 0 gets the same input (the embeddings) and target either way, so its fit is the teacher-forced one;
    layer 1 gets the student's own stream, which differs from the teacher's once layer 0 is not exact."""
    from zebra.upcycle import open_teacher

    teacher = open_teacher(tiny_llama(tmp_path / "llama", num_hidden_layers=3))
    forced = _calibrated(teacher, "gdn")
    sequential = _calibrated(teacher, "gdn", sequential=True, correct_residual=correct_residual)
    assert sequential.record()["sequential"] and sequential.record()["correct_residual"] == correct_residual
    assert [f.mixer for f in sequential.layers] == ["gdn", "mla", "gdn"]
    first, first_forced = sequential.layers[0], forced.layers[0]
    assert first.error_fit == pytest.approx(first_forced.error_fit, rel=1e-4)
    for name, tensor in forced.tensors.items():
        if name.startswith("model.layers.0."):
            torch.testing.assert_close(sequential.tensors[name], tensor, rtol=1e-4, atol=1e-5)
    assert sequential.layers[1].error_upcycled != pytest.approx(forced.layers[1].error_upcycled, rel=1e-4)
    assert set(sequential.tensors) == set(forced.tensors)
    for f in sequential.layers:
        assert f.error_fit <= f.error_init + 1e-9 and f.error_fit < f.error_upcycled, f
    teacher.tensors.close()


def test_the_least_squares_output_projection_starts_the_fit_closer_than_the_head_scales(tmp_path):
    """Least squares over the whole output projection includes every per-head scaling, so on the calibration
    tokens it starts at most as far from the teacher's output as the value scale alone."""
    from zebra.upcycle import open_teacher

    teacher = open_teacher(tiny_llama(tmp_path / "llama"))
    scaled = _calibrated(teacher, "mamba", fit={"steps": 0})
    solved = _calibrated(teacher, "mamba", fit={"steps": 0, "output_lstsq": True})
    for a, b in zip(scaled.layers, solved.layers, strict=True):
        assert b.error_init <= a.error_init + 1e-6 and b.error_init < a.error_upcycled, (a, b)
    assert solved.record()["output_lstsq"]
    teacher.tensors.close()


def test_layers_fitted_side_by_side_in_worker_processes_are_those_fitted_here(tmp_path):
    """--calibrate-workers: each layer is fitted from the same start, on the same records and seed, in whichever
    process; the export and the report say the same but for the process count."""
    import dataclasses

    from safetensors.torch import load_file

    teacher_dir = tiny_llama(tmp_path / "llama")
    reports, tensors = {}, {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        steps: list[float] = []
        reports[workers] = upcycle(teacher_dir, out, StudentOptions(mixer="gdn", mla_layers=(1,)),
                                   calibrate=dataclasses.replace(TINY_FIT, workers=workers),
                                   on_calibrate=lambda done, total, note, steps=steps: steps.append(done))  # fmt: skip
        assert steps[-1] == 2 * TINY_FIT.fit.steps  # every step of both layers was reported
        tensors[workers] = {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}
    one, two = (reports[w].calibration for w in (1, 2))
    assert (one["workers"], two["workers"]) == (1, 2)
    for a, b in zip(one["layers"], two["layers"], strict=True):
        assert (a["layer"], a["mixer"], a["best_step"]) == (b["layer"], b["mixer"], b["best_step"])
        assert a["error_fit"] == pytest.approx(b["error_fit"], rel=1e-4)
    assert tensors[1].keys() == tensors[2].keys()
    for name, t in tensors[1].items():
        torch.testing.assert_close(tensors[2][name], t, rtol=1e-4, atol=1e-5, msg=name)


def test_a_worker_that_fails_stops_the_calibration_with_its_error(tmp_path):
    from zebra.models import ZebraConfig
    from zebra.upcycle import open_teacher
    from zebra.upcycle.calibration import calibration_tokens
    from zebra.upcycle.fit_workers import fit_layers
    from zebra.upcycle.student import plan_student

    teacher = open_teacher(tiny_llama(tmp_path / "llama"))
    tokens = calibration_tokens("@sample", teacher.tokenizer, 272, 2, 32)
    records = record_attention(teacher, tokens, [0, 1], device="cpu")
    config = ZebraConfig(**plan_student(teacher.shape, StudentOptions(mixer="gdn", mla_layers=(1,))).config)
    states = {0: {"not_a_tensor_of_gdn": torch.zeros(1)}, 2: {"nor_of_mla": torch.zeros(1)}}
    with pytest.raises(
        RuntimeError, match=r"calibration worker \d failed:(.|\n)*(not_a_tensor_of_gdn|nor_of_mla)"
    ):
        fit_layers(config, [0, 2], states, records, TINY_FIT.fit, "cpu", 2, lambda n, step, error: None)
    teacher.tensors.close()


class _ExitsWhenLoaded:
    """Unpickled in a worker, ends it at once with exit code 3, before it can say anything."""

    def __reduce__(self):
        import os

        return (os._exit, (3,))


def test_a_worker_that_dies_without_a_word_stops_the_calibration():
    from zebra.upcycle.fit_workers import fit_layers

    with pytest.raises(
        RuntimeError, match=r"calibration worker \d stopped \(exit code 3\) before its layers"
    ):
        fit_layers(_ExitsWhenLoaded(), [0, 2], {0: {}, 2: {}}, {0: None, 1: None}, TINY_FIT.fit, "cpu", 2,
                   lambda n, step, error: None)  # fmt: skip


@pytest.mark.parametrize(
    ("device", "gpus", "workers", "devices"),
    [
        ("cpu", 0, 1, ["cpu", "cpu"]),  # the CPU: one process (it already uses every core)
        ("auto", 0, 1, ["auto", "auto"]),  # left for the worker to resolve, as here
        ("cuda", 1, 1, ["cuda:0", "cuda:0"]),  # one GPU: one process (several would take turns on it)
        ("cuda", 4, 4, ["cuda:0", "cuda:1"]),  # one process per GPU, each on its own
        ("auto", 2, 2, ["cuda:0", "cuda:1"]),
        ("cuda:1", 4, 1, ["cuda:1", "cuda:1"]),  # one named GPU: that one only
    ],
)
def test_the_default_worker_count_is_one_per_gpu_each_on_its_own(monkeypatch, device, gpus, workers, devices):
    from zebra.upcycle.fit_workers import resolve_workers, worker_device

    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: gpus > 0
    )  # this machine has no GPU: say it has some
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert resolve_workers(0, device, layers=30) == workers
    assert resolve_workers(0, device, layers=1) == 1  # never more processes than layers
    assert resolve_workers(3, device, layers=30) == 3  # a count asked for is kept
    assert [worker_device(device, k) for k in (0, 1)] == devices
