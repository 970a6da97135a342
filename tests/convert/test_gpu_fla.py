"""On a GPU: FLA's GatedDeltaNetForCausalLM / KDAForCausalLM / GLAForCausalLM and ZebraForCausalLM give the same logits on the
same weights (FLA's Triton kernels on both sides), at the 1b-gdn-pure / 1b-kda-pure / 1b-gla-pure layer shapes.

Figures go to $ZEBRA_GPU_REPORT (when set) as JSON lines of section "convert_fla_parity".
"""

from __future__ import annotations

import pytest
import torch
from tests.conftest import gpu_report

pytestmark = pytest.mark.gpu

# fp32 compares the same math (FLA's chunked kernels on both sides); bf16 adds rounding in every matmul.
TOLERANCE = {torch.float32: (2e-3, 0.9999), torch.bfloat16: (5e-2, 0.999)}  # (max rel to max |logit|, cosine)


@pytest.mark.parametrize("recipe_name", ["1b-gdn-pure", "1b-kda-pure", "1b-gla-pure"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fla_and_zebra_logits_match_on_gpu(tmp_path, recipe_name, dtype):
    import fla  # noqa: F401
    from transformers import AutoModelForCausalLM

    from zebra.convert import convert, export_hf
    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    recipe = load_recipe(recipe_name, overrides=["model.num_layers=4"])  # 2 FLA layers at the 1B layer shapes
    torch.manual_seed(0)
    config = recipe.model.to_config(kernel_backend="fla")
    model = ZebraForCausalLM(config)
    src = export_hf(model.state_dict(), config, tmp_path / "zebra", tokenizer="none")
    fla_dir = convert(src, "fla", tmp_path / "fla").output

    ours = ZebraForCausalLM.from_pretrained(src, dtype=dtype).cuda().eval()
    theirs = AutoModelForCausalLM.from_pretrained(fla_dir, dtype=dtype).cuda().eval()
    ids = torch.randint(0, 32000, (2, 512), generator=torch.Generator().manual_seed(3)).cuda()
    with torch.no_grad():
        a = theirs(input_ids=ids).logits.float()
        b = ours(input_ids=ids).logits.float()
    max_abs = float((a - b).abs().max())
    rel = max_abs / float(a.abs().max())
    cosine = float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))
    gpu_report(
        "convert_fla_parity",
        {
            "recipe": recipe_name,
            "layers": "2 FLA layers (4 sublayers)",
            "dtype": str(dtype).removeprefix("torch."),
            "tokens": list(ids.shape),
            "max_abs": max_abs,
            "max_rel": rel,
            "cosine": cosine,
            "device": torch.cuda.get_device_name(),
        },
    )
    max_rel, min_cos = TOLERANCE[dtype]
    assert rel <= max_rel and cosine >= min_cos, (max_abs, rel, cosine)


def test_verify_runs_fla_forward_on_gpu(tmp_path):
    from zebra.convert import convert, export_hf, verify
    from zebra.models import ZebraForCausalLM
    from zebra.recipes import load_recipe

    config = load_recipe("1b-gdn-pure", overrides=["model.num_layers=4"]).model.to_config(
        kernel_backend="fla"
    )
    torch.manual_seed(0)
    src = export_hf(ZebraForCausalLM(config).state_dict(), config, tmp_path / "zebra", tokenizer="none")
    fla_dir = convert(src, "fla", tmp_path / "fla").output
    report = verify(fla_dir, against=src, device="cuda")
    assert report.mode.startswith("FLA's own forward")
    assert {p.reference for p in report.parities} >= {"FLA forward"}
    assert report.ok, report.to_dict()
