"""The exact shortcuts of `zebra data prep` (tiktoken for byte-level BPE, UTF-8 bytes for the byte tokenizer):
used only where they give the tokenizer's own ids, HF otherwise.

Tokenizers are trained here with the `tokenizers` library: GPT-2's form (ByteLevel with its regex) and Llama-3's
(Split with Llama-3's regex, then ByteLevel), each as `tokenizers` writes it (one merge per token) and in the ranked
form Llama-3's tokenizer.json has (every split of every token a merge, ignore_merges).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from zebra.data.fast_bpe import ADVERSARIAL, FastBPE, fast_bpe_spec
from zebra.data.manifest import read_manifest
from zebra.data.prep import plan_prep, run_prep
from zebra.data.text_sources import open_source
from zebra.data.tokenizers import load_tokenizer, train_bpe

from .helpers import expected_ids, read_all, write_source

FORMS = {  # name: train_bpe keyword arguments
    "gpt2": {"split": "gpt2"},
    "llama3": {"split": "llama3"},
    "gpt2-ranked": {"split": "gpt2", "ranked": True},
    "llama3-ranked": {"split": "llama3", "ranked": True, "bos": True},
}


@pytest.fixture(scope="module")
def corpus(texts) -> list[str]:
    """The test corpus plus the adversarial strings and a few documents in other scripts, as documents."""
    return (
        texts
        + [t for t in ADVERSARIAL if t.strip()]
        + ["Zebras \u0437\u0435\u0431\u0440\u044b \u6591\u9a6c!"]
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> dict[str, str]:
    """Each form trained on the corpus (vocab 700), saved in HF layout: form -> folder."""
    root = tmp_path_factory.mktemp("forms")
    for name, kwargs in FORMS.items():
        train_bpe(corpus, 700, **kwargs).save_pretrained(root / name)
    return {name: str(root / name) for name in FORMS}


def prep(corpus, tmp_path, tokenizer, workers=2, edit_plan=None):
    source = write_source("jsonl", tmp_path / "src", corpus)
    plan = plan_prep(
        open_source(str(source)), tmp_path / "out", tokenizer=tokenizer, workers=workers, shards=2
    )
    if edit_plan:
        edit_plan(plan)
    run_prep(plan)
    return plan, read_manifest(tmp_path / "out")


def encoders(manifest) -> dict[str, int]:
    """Documents per encoder name (without its version)."""
    total: dict[str, int] = {}
    for shard in manifest.shards:
        for name, count in shard.encoders.items():
            total[name.split()[0]] = total.get(name.split()[0], 0) + count
    return total


def test_tokenizers_trained_merges_are_rank_ordered_but_not_tiktoken_ranks(trained):
    """`tokenizers` lists merges in the order of the ids they make, one per token: tiktoken would also make
    the other joins, so even with ignore_merges on, the fast path must refuse these vocabularies."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    for form in ("gpt2", "llama3"):
        tok = load_tokenizer(trained[form])
        spec, reason = fast_bpe_spec(tok)
        assert spec is None and "ignore_merges is off" in reason
        config = json.loads(tok.backend_tokenizer.to_str())
        model = config["model"]
        made = [model["vocab"][a + b] for a, b in model["merges"]]
        assert made == sorted(made) and len(made) == len(set(made))
        model["ignore_merges"] = True
        patched = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(json.dumps(config)), eos_token="<|endoftext|>"
        )
        spec, reason = fast_bpe_spec(patched)
        assert spec is None and "are not among its merges" in reason


@pytest.mark.parametrize("form", ["gpt2-ranked", "llama3-ranked"])
def test_prep_with_tiktoken_writes_the_tokenizers_own_ids(form, trained, corpus, tmp_path):
    plan, manifest = prep(corpus, tmp_path, trained[form])
    assert plan.fast_bpe is not None and not plan.notes
    want = expected_ids(trained[form], corpus)
    assert read_all(tmp_path / "out") == want
    assert encoders(manifest) == {"tiktoken": len(corpus)}
    if form == "llama3-ranked":  # the bos comes from the post-processor, the EOD from prep
        tok = load_tokenizer(trained[form])
        assert {doc[0] for doc in want} == {tok.bos_token_id}


@pytest.mark.parametrize("form", ["gpt2", "llama3"])
def test_prep_without_tiktoken_ranks_uses_tokenizers(form, trained, corpus, tmp_path):
    plan, manifest = prep(corpus, tmp_path, trained[form])
    assert plan.fast_bpe is None and "ignore_merges is off" in plan.notes[0]
    assert read_all(tmp_path / "out") == expected_ids(trained[form], corpus)
    assert encoders(manifest) == {"tokenizers": len(corpus)}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("normalizer", "normalizer (NFKC)"),
        ("prefix_space", "adds a prefix space"),
        ("whitespace", "pre-tokenizer is Whitespace"),
        ("dropout", "sets dropout"),
        ("lstrip", "strip or single-word rules"),
        ("regex", "tiktoken cannot compile its split regex"),
    ],
)
def test_unsupported_tokenizer_forms_are_refused(change, reason, trained):
    from tokenizers import normalizers, pre_tokenizers

    tok = load_tokenizer(trained["llama3-ranked"])
    assert fast_bpe_spec(tok)[0] is not None
    backend = tok.backend_tokenizer
    if change == "normalizer":
        backend.normalizer = normalizers.NFKC()
    elif change == "prefix_space":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    elif change == "whitespace":
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
    elif change == "dropout":
        backend.model.dropout = 0.1
    elif change == "regex":  # Oniguruma's grapheme cluster escape; fancy-regex has none
        from tokenizers import Regex

        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(r"\X"), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        from tokenizers import AddedToken

        tok.add_tokens([AddedToken("zebra", lstrip=True)])
    spec, why = fast_bpe_spec(tok)
    assert spec is None and reason in why


def test_tokenizer_with_a_normalizer_falls_back_in_prep(trained, corpus, tmp_path):
    from tokenizers import normalizers

    tok = load_tokenizer(trained["llama3-ranked"])
    tok.backend_tokenizer.normalizer = normalizers.NFKC()  # folds e.g. the full-width digits of ADVERSARIAL
    tok.save_pretrained(tmp_path / "nfkc")
    plan, manifest = prep(corpus, tmp_path, str(tmp_path / "nfkc"))
    assert plan.fast_bpe is None and "normalizer" in plan.notes[0]
    assert read_all(tmp_path / "out") == expected_ids(str(tmp_path / "nfkc"), corpus)
    assert encoders(manifest) == {"tokenizers": len(corpus)}


def test_a_worker_whose_agreement_check_fails_uses_hf(trained, corpus, tmp_path):
    """A spec that drops Llama-3's bos gives other ids: the first documents show it, the worker falls back."""

    def drop_bos(plan):
        plan.fast_bpe = dataclasses.replace(plan.fast_bpe, prefix=[])

    plan, manifest = prep(corpus, tmp_path, trained["llama3-ranked"], workers=1, edit_plan=drop_bos)
    assert any("left the tiktoken encoder aside: ids differ" in n for n in plan.notes)
    assert read_all(tmp_path / "out") == expected_ids(trained["llama3-ranked"], corpus)
    assert encoders(manifest) == {"tokenizers": len(corpus)}


def test_a_tokenizer_class_that_changes_text_gets_its_own_output(trained, corpus, tmp_path):
    from transformers import PreTrainedTokenizerFast

    class Lowercasing(PreTrainedTokenizerFast):
        def _encode_plus(self, text, *args, **kwargs):
            text = [t.lower() for t in text] if isinstance(text, list) else text.lower()
            return super()._encode_plus(text, *args, **kwargs)

    folder = trained["gpt2-ranked"]
    tok = Lowercasing(tokenizer_file=f"{folder}/tokenizer.json", eos_token="<|endoftext|>")

    def swap(plan):
        assert plan.fast_bpe is not None
        plan.tokenizer = tok

    _, manifest = prep(corpus, tmp_path, folder, edit_plan=swap)
    want = [tok(t)["input_ids"] + [tok.eos_token_id] for t in corpus]
    assert want != expected_ids(folder, corpus)
    assert read_all(tmp_path / "out") == want
    assert encoders(manifest) == {"transformers": len(corpus)}


def test_characters_the_regex_engines_split_differently_go_to_hf(trained, corpus):
    """A pattern whose letter runs leave out 'é' splits 'café' otherwise: the per-character probe finds
    it, documents holding it are encoded by the tokenizer, all others by tiktoken, and every id is the same."""
    tok = load_tokenizer(trained["llama3-ranked"])
    spec, _ = fast_bpe_spec(tok)
    letters = "(?:(?!\u00e9)\\p{L})+"  # tiktoken would now drop 'é': no alternative matches it
    sabotaged = dataclasses.replace(spec, pattern=spec.pattern.replace(r"\p{L}+", letters))
    fast = FastBPE(sabotaged, tok)
    assert fast.check(corpus[:64]) == ""
    docs = ["un caf\u00e9 noir", "plain ascii text", "na\u00efve", "caf\u00e9 caf\u00e9s", "Z\u00fcrich"]
    ids, diverted = fast.encode(docs)
    assert diverted == [0, 3]
    assert ids == tok(docs)["input_ids"]
    real, none = FastBPE(spec, tok).encode(docs)
    assert real == ids and none == []
    raw = fast.encoding.encode_ordinary("un caf\u00e9 noir")  # what tiktoken alone would have written
    assert [tok.bos_token_id, *raw] != ids[0]


def test_agreement_check_reports_a_different_split(trained, corpus):
    tok = load_tokenizer(trained["gpt2-ranked"])
    spec, _ = fast_bpe_spec(tok)
    two_digits = dataclasses.replace(spec, pattern=spec.pattern.replace(r"\p{N}+", r"\p{N}{1,2}"))
    assert FastBPE(two_digits, tok).check(corpus[:8]) == "the regex engines split ASCII text differently"


def test_byte_tokenizer_writes_utf8_bytes_and_leaves_special_token_text_to_the_tokenizer(corpus, tmp_path):
    _, manifest = prep(corpus, tmp_path, "byte")
    assert read_all(tmp_path / "out") == expected_ids("byte", corpus)
    special = sum("<|endoftext|>" in t or "<|begin_of_text|>" in t or "<|pad|>" in t for t in corpus)
    assert special >= 2  # conftest's EXTRA_TEXTS and ADVERSARIAL hold special-token text
    assert encoders(manifest) == {"utf-8": len(corpus) - special, "transformers": special}
