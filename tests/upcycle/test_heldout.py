"""The real gap: SmolLM2-135M-Instruct upcycled (all 30 layers) against a randomly initialised student, on
held-out Python documentation that nobody here wrote."""

from __future__ import annotations

import json

import pytest
import torch

from zebra.upcycle import StudentOptions, upcycle_teacher


def heldout_tokens(python_docs, tokenizer, sequences: int = 2, length: int = 256) -> torch.Tensor:
    ids: list[int] = []
    for line in (python_docs / "heldout.jsonl").read_text().splitlines():
        ids += tokenizer(json.loads(line)["text"])["input_ids"] + [tokenizer.eos_token_id]
    assert len(ids) >= sequences * length
    return torch.tensor(ids[: sequences * length]).view(sequences, length)


def heldout_loss(model, ids) -> float:
    with torch.no_grad():
        return model.eval()(input_ids=ids, labels=ids).loss.item()


@pytest.mark.slow
def test_the_upcycled_student_is_far_better_than_a_random_one(tmp_path, smollm2_teacher, python_docs):
    """Every layer MLA at the full matrix rank: the factorisation alone, before any distillation. (At the
    published compression, and with recurrent mixers, the untrained student is barely better than random:
    the numbers are in docs/upcycle.md.)"""
    from zebra.models import ZebraForCausalLM

    options = StudentOptions(mla=30, q_lora_rank=576, kv_lora_rank=384)
    report = upcycle_teacher(smollm2_teacher, tmp_path / "student", options)
    student = ZebraForCausalLM.from_pretrained(tmp_path / "student", kernel_backend="torch")
    torch.manual_seed(0)
    random = ZebraForCausalLM(student.config)
    ids = heldout_tokens(python_docs, smollm2_teacher.tokenizer)

    upcycled, baseline = heldout_loss(student, ids), heldout_loss(random, ids)

    assert report.pattern == "*-" * 30
    assert baseline - upcycled > 3.0, (upcycled, baseline)  # nats per token
