"""The whole Zebra-Llama pipeline through the CLI on a tiny teacher: upcycle an all-MLA and an all-recurrent
student, ILD each, compose with SMART placement, then KD the hybrid."""

from __future__ import annotations

import json

import pytest
from tests.upcycle.teachers import tiny_llama

from .helpers import sets


@pytest.mark.slow
def test_upcycle_ild_smart_compose_kd(cli, tmp_path, sample_prefix):
    teacher = tiny_llama(tmp_path / "teacher", num_hidden_layers=6, seed=4)
    for name, flag in (("mla", ["--mla-layers", "all"]), ("rec", ["--mla", "0"])):
        result = cli("upcycle", str(teacher), "-o", str(tmp_path / name), "--mixer", "gdn", *flag)
        assert result.exit_code == 0, result.output
        result = cli("train", "tiny", "--data", sample_prefix, "--init", str(tmp_path / name), "--teacher",
                     str(teacher), "--max-steps", "3", "--output", str(tmp_path / "runs"), "--run", f"ild-{name}",
                     *sets("distill.stage=ild", "train.export=true", "train.lr=2e-3"))  # fmt: skip
        assert result.exit_code == 0, result.output
    mla, rec = (tmp_path / "runs" / f"ild-{n}" / "export" for n in ("mla", "rec"))
    hybrid = tmp_path / "hybrid"
    result = cli("upcycle", "--compose", str(mla), str(rec), "--mla", "3", "--placement", "smart", "--calibration",
                 sample_prefix, "--calibration-samples", "4", "--seq-len", "32", "-o", str(hybrid))  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((hybrid / "upcycle.json").read_text())
    assert report["placement"] == "smart" and len(report["smart"]["scores"]) == 6
    assert report["teacher"] == str(teacher.resolve())
    assert report["layer_sources"] == [str(mla if i in report["mla_layers"] else rec) for i in range(6)]
    result = cli("train", "tiny", "--data", sample_prefix, "--init", str(hybrid), "--teacher", str(teacher),
                 "--max-steps", "3", "--output", str(tmp_path / "runs"), "--run", "kd",
                 *sets("train.export=true", "train.log_interval=1"))  # fmt: skip
    assert result.exit_code == 0, result.output
    records = [
        json.loads(line) for line in (tmp_path / "runs" / "kd" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records if "kl" in r] == [1, 2, 3]
    assert (
        json.loads((tmp_path / "runs" / "kd" / "export" / "config.json").read_text())["layer_pattern"]
        == (report["pattern"])
    )
