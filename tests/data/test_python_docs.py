"""The Python-documentation corpus: page text, the deterministic split, and the real pages (python3.11-doc)."""

from __future__ import annotations

import json

import pytest

from zebra.core.errors import ZebraError
from zebra.data.python_docs import html_to_text, is_heldout, write_python_docs_corpus

PAGE = """<html><head><script>var x = 1;</script><style>p {}</style></head><body>
<div class="sphinxsidebar"><p>Table of contents</p></div>
<div class="body" role="main">
  <h1>Built-in Types<a class="headerlink" href="#x" title="Permalink">¶</a></h1>
  <p>The   principal built-in
     types are numerics, sequences &amp; mappings.</p>
  <div class="highlight"><pre>&gt;&gt;&gt; 1 +   1
2</pre></div>
  <ul><li>one</li><li>two</li></ul>
</div>
<div class="footer">© Copyright</div></body></html>"""


def test_a_page_becomes_its_main_text_with_code_kept_verbatim():
    text = html_to_text(PAGE)
    assert text.splitlines()[0] == "Built-in Types"
    assert "The principal built-in types are numerics, sequences & mappings." in text
    assert ">>> 1 +   1\n2" in text  # whitespace inside <pre> is kept
    assert "one" in text and "two" in text
    for outside in ("Table of contents", "Copyright", "var x", "¶"):
        assert outside not in text


def test_the_split_is_by_page_and_stable():
    pages = [f"library/module{i}.html" for i in range(2000)]
    held = [p for p in pages if is_heldout(p, 0.1)]
    assert 150 < len(held) < 250
    assert held == [p for p in pages if is_heldout(p, 0.1)]
    assert set(held) <= {p for p in pages if is_heldout(p, 0.2)}  # a larger fraction only adds pages


def test_the_real_documentation_splits_into_disjoint_train_and_heldout(tmp_path, python_docs_html):
    counts = write_python_docs_corpus(tmp_path, heldout_fraction=0.25, max_docs=24, root=python_docs_html)
    rows = {
        split: [json.loads(line) for line in (tmp_path / f"{split}.jsonl").read_text().splitlines()]
        for split in ("train", "heldout")
    }
    assert counts["train_docs"] == len(rows["train"]) and counts["heldout_docs"] == len(rows["heldout"])
    assert len(rows["train"]) + len(rows["heldout"]) == 24 and rows["heldout"]
    assert not {r["id"] for r in rows["train"]} & {r["id"] for r in rows["heldout"]}
    assert all(is_heldout(r["id"], 0.25) for r in rows["heldout"])
    assert all(len(r["text"]) >= 200 and "<div" not in r["text"] for split in rows.values() for r in split)


def test_a_missing_documentation_folder_is_one_error(tmp_path):
    with pytest.raises(ZebraError, match=r"the Python 3\.11 documentation is not installed"):
        write_python_docs_corpus(tmp_path / "out", root=tmp_path / "nowhere")
