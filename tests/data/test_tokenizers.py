"""The built-in byte tokenizer, HF tokenizer loading, vocabulary hashes and token dtypes."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from zebra.core.errors import ZebraError
from zebra.data.tokenizers import byte_tokenizer, load_tokenizer, token_dtype, vocab_hash


def test_byte_ids_are_the_utf8_bytes_and_specials_are_fixed():
    tok = byte_tokenizer()
    text = "zebra ü 東 🦓"
    assert tok(text)["input_ids"] == list(text.encode("utf-8"))
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id, len(tok)) == (256, 257, 258, 259)
    assert tok.convert_ids_to_tokens([256, 257, 258]) == ["<|endoftext|>", "<|begin_of_text|>", "<|pad|>"]


def test_byte_decode_round_trips_arbitrary_utf8():
    tok = byte_tokenizer()
    rng = random.Random(0)
    samples = ["", " leading and trailing  ", "a  .  ,  !", "\x00\x01\x7f", "\u00e9\u0301 \U0001f600 \u200b"]
    for _ in range(200):  # random code points from every plane, surrogates excluded
        cps = [
            rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])
            for _ in range(20)
        ]
        samples.append("".join(map(chr, cps)))
    for text in samples:
        ids = tok(text)["input_ids"]
        assert tok.decode(ids) == text


def test_byte_tokenizer_saves_and_loads_without_zebra(tmp_path):
    byte_tokenizer().save_pretrained(tmp_path)
    code = (
        "import sys, json\n"
        "from transformers import AutoTokenizer\n"
        f"t = AutoTokenizer.from_pretrained({str(tmp_path)!r})\n"
        "text = 'héllo 🦓 <|endoftext|>'\n"
        "ids = t(text)['input_ids']\n"
        "assert 'zebra' not in sys.modules\n"
        "print(json.dumps([ids, t.decode(ids) == text, t.eos_token_id, len(t)]))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    ids, round_trip, eos, size = __import__("json").loads(res.stdout.strip().splitlines()[-1])
    assert ids == [*"héllo 🦓 ".encode(), 256] and round_trip and eos == 256 and size == 259


def test_an_export_folders_tokenizer_loads_without_asking_to_run_its_code(tmp_path):
    # a Zebra export: config.json maps its classes to remote code; transformers' AutoTokenizer read that config and
    # asked "Do you wish to run the custom code? [y/N]" on the terminal (zebra train --init EXPORT, on resume)
    from zebra.models.remote_code import write_remote_code

    byte_tokenizer().save_pretrained(tmp_path)
    config = {
        "model_type": "zebra",
        "architectures": ["ZebraForCausalLM"],
        "auto_map": write_remote_code(tmp_path),
    }
    (tmp_path / "config.json").write_text(__import__("json").dumps(config))
    code = f"from zebra.data import load_tokenizer; print(load_tokenizer({str(tmp_path)!r}).eos_token_id)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, input="", check=True)
    assert res.stdout.strip().splitlines()[-1] == "256"
    assert "custom code" not in res.stdout + res.stderr and "model of type" not in res.stdout + res.stderr


def test_hf_tokenizer_from_directory(bpe_dir):
    tok = load_tokenizer(str(bpe_dir))
    assert tok.eos_token_id is not None and len(tok) == 600
    assert tok.decode(tok("Once upon a time")["input_ids"]) == "Once upon a time"


def test_vocab_hash_tells_tokenizers_apart(bpe_dir):
    assert vocab_hash(byte_tokenizer()) == vocab_hash(load_tokenizer("byte"))
    assert vocab_hash(load_tokenizer(str(bpe_dir))) != vocab_hash(byte_tokenizer())


def test_export_vocabulary_reads_a_tokenizer_once_until_it_changes(tmp_path, bpe_dir, monkeypatch):
    import shutil

    from transformers import PreTrainedTokenizerFast

    from zebra.data.tokenizers import export_vocabulary, vocabulary

    byte_vocabulary, bpe_vocabulary = vocabulary(byte_tokenizer()), vocabulary(load_tokenizer(str(bpe_dir)))
    reads = []
    real = PreTrainedTokenizerFast.from_pretrained.__func__
    monkeypatch.setattr(
        PreTrainedTokenizerFast,
        "from_pretrained",
        classmethod(lambda cls, *a, **k: reads.append(a[0]) or real(cls, *a, **k)),
    )
    export = tmp_path / "export"
    byte_tokenizer().save_pretrained(export)
    assert export_vocabulary(export) == export_vocabulary(export) == byte_vocabulary
    assert len(reads) == 1  # --init with a teacher checks the export twice; it is parsed once
    shutil.copy(bpe_dir / "tokenizer.json", export / "tokenizer.json")  # replaced: read again
    assert export_vocabulary(export) == bpe_vocabulary and len(reads) == 2
    assert export_vocabulary(tmp_path) is None


@pytest.mark.parametrize(
    ("vocab", "requested", "expected"),
    [
        (259, "auto", np.uint16),
        (65536, "auto", np.uint16),
        (65537, "auto", np.int32),
        (128256, "auto", np.int32),
        (128256, "int32", np.int32),
        (300, "int32", np.int32),
    ],
)
def test_token_dtype(vocab, requested, expected):
    assert token_dtype(vocab, requested) == np.dtype(expected)


def test_vocab_exceeding_dtype_is_one_line_error():
    with pytest.raises(ZebraError, match=r"128256 ids exceeds --dtype uint16") as e:
        token_dtype(128256, "uint16")
    assert "int32" in e.value.fix


@pytest.mark.parametrize(
    ("name", "message"),
    [("/no/such/tokenizer/dir", "no tokenizer files"), ("some-org/some-tokenizer", "offline")],
)
def test_unloadable_tokenizer_is_one_line_error(name, message):
    with pytest.raises(ZebraError, match=message):
        load_tokenizer(name)
