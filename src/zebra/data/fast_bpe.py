"""tiktoken as the encoder of byte-level BPE tokenizers (GPT-2 / Llama-3 style), wherever it gives the same ids.

A byte-level BPE tokenizer splits text with a regex, maps each piece to bytes and merges adjacent pairs, best
rank first. `tokenizers` (HF) and tiktoken both implement this; tiktoken does it several times faster per core.
They agree id for id when:

1. **The tokenizer has that shape** (`fast_bpe_spec`, once, from `tokenizer.json`): no normalizer; a ByteLevel
   pre-tokenizer (GPT-2's regex) or Split(regex) + ByteLevel without a prefix space; a BPE model without dropout,
   unknown token, affixes or byte fallback; a bijective byte alphabet covering all 256 bytes; added tokens
   without strip/single-word rules, none a prefix of another (both then match them leftmost first); a
   post-processor that only adds fixed special tokens around the text.
2. **Its merges are tiktoken's ranks**: tiktoken merges any adjacent pair whose bytes form a vocabulary entry,
   lowest id first, and takes a piece that is a vocabulary entry whole. HF does the same exactly when every way
   of cutting every token into two tokens is a merge (completeness), merges are listed in order of the id of the
   token they make (so ids are ranks), and `ignore_merges` is on. Llama-3's tokenizer.json (converted from
   tiktoken) has this form; a vocabulary trained by `tokenizers` (one merge per token) does not, and falls back.
   One order is not pinned down by these checks: two overlapping merges that make the *same* token
   (`ab|a` and `a|ba` in `aba`), which tiktoken breaks by position and HF by merge order; the agreement check
   below is what covers it.
3. **The two regex engines split alike** (onig in HF, fancy-regex in tiktoken, with their own Unicode tables):
   every character a document contains is first probed in contexts that expose its regex classes (letter,
   number, space, case folding), comparing the exact piece boundaries (`FastBPE._probe`); a document with a
   character the engines split differently is encoded by HF instead.
4. **The first documents agree** (`FastBPE.check`, in each worker): adversarial strings and the first documents, encoded
   both ways, id for id, against `tokenizer(text)["input_ids"]`.

Any failure means HF encodes (the caller's fallback); nothing here ever changes an id.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from zebra.core.errors import first_line
from zebra.data.tokenizers import GPT2_PATTERN, byte_level_chars

# Contexts that expose a character's regex classes: letter or number run, space (with the look-ahead),
# punctuation run, line breaks, apostrophe contractions (case folding), repetition.
_PROBE_CONTEXTS = (
    "a{c}", "{c}a", "1{c}", "{c}1", "123{c}", " {c}", "{c} ", "{c} x", "x {c}", "{c}.", ".{c}", "'{c}", "'{c}e",
    "'l{c}", "{c}\n", "\n{c}", "\r{c}\n", "  {c}", "{c}{c}", "a{c}b", ".{c}.", "1{c}2", " {c}{c} ",
)  # fmt: skip

# Strings where tokenizers and tiktoken would part first if they were to: unicode spaces and runs of them, digit
# runs and non-ASCII digits, contractions in every case, emoji sequences, combining marks, mixed scripts,
# controls, line-break combinations, special-token look-alikes, long runs.
ADVERSARIAL = (
    "".join(map(chr, range(128))),
    "a\u00a0b\u2009c\u3000d\u2028e\u2029f\x0bg\x0ch\x85i\u200bj\u200dk\ufeffl\u180em\u1680n\u202fo\u205fp",
    "trailing   \n\n   leading\t\t\ttabs  \r\n\r\n  x \n",
    "   \n  \n \n\n\n\n   end   ",
    " " * 40 + "x" + "\n" * 9 + "\t" * 5,
    "1 12 123 1234 12345 123456789 1,234,567.891 3.14159e-10 0x1F 007",
    "\u0663\u0664\u0665 \u0967\u0968 \u2460\u2461 \u00b2\u00b3 \u2155 \uff11\uff12 \U0001d7ce \u216b",
    "I'm you're we've they'll he'd it's DON'T WE'VE I'M She'S y'all'd o'clock '' 's 'S 'sT",
    "\u2019s it\u2019s \u017f 'K '\u212a '\u017f '\u0130 \u00df \ufb05 '\u00df",
    "\U0001f993\U0001f993 \U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 \U0001f1e9\U0001f1ea "
    "\U0001f44d\U0001f3fd \u2764\ufe0f #\ufe0f\u20e3 \U0001f600!",
    "e\u0301 A\u030a \u0915\u094d\u0937 \u1100\u1161\u11a8 a\u0308\u0304 \u0644\u0627",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440, \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd "
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u6771\u4eac\u30bf\u30ef\u30fc \ud55c\uad6d\uc5b4 \u0e44\u0e17\u0e22 "
    "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8 \u0395\u03bb\u03bb\u03ac\u03b4\u03b1",
    "mixedSCRIPT\u0417\u0435\u0431\u0440\u0430zebra\u6591\u9a6c123\u0661\u0662abc",
    "\x00\x01\x1b[31mred\x1b[0m\x7f\x08",
    "a\r\nb\rc\n\rd\r\r\n\n\re",
    "<|endoftext|> <|begin_of_text|><|pad|> <|endof <|endoftext|<|end_of_text|>",
    "a" * 300 + " " + "!" * 120 + " " + "ab" * 150 + " " + "\u00e9" * 80,
    "x=1+2;y=[3,4]; if(a&&b||!c){return -1;} // \u2014 \u2013 \u2026 \u00ab\u00bb \u201c\u201d",
    "http://example.com/a_b-c?d=e&f=g#h user@mail.org $1,000.00 50% ~/path/to/file.py",
    "\U0002a6a5\U00030001\U0001e900\U00011700\U00016a40 \U0001faf8 \ue000\U000f0000 \ufffd \U0010fffd",
    "\u1c89\U00010d40\U00016d40\U00031350\U0001e5d0 \u0378\U000e0001\U000e0041",  # Unicode 15-16, unassigned, tags
)


_BYTES = {bytes([b]): b for b in range(256)}


@dataclass
class FastBPESpec:
    """What a worker needs to build the tiktoken encoder: `ranks` (token bytes -> id), `specials` (added
    token text -> id), the split `pattern`, and the ids the post-processor puts around every text."""

    name: str
    pattern: str
    ranks: dict[bytes, int]
    specials: dict[str, int]
    prefix: list[int]
    suffix: list[int]


def fast_bpe_spec(tokenizer: Any) -> tuple[FastBPESpec | None, str]:
    """The tiktoken encoder for `tokenizer`, or why there is none (checks 1 and 2 of the module docstring).

    Args:
        tokenizer: a `transformers.PreTrainedTokenizerFast`.

    Returns:
        `(spec, "")` when the tokenizer has the supported form, else `(None, reason)`.
    """
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed"
    config = json.loads(tokenizer.backend_tokenizer.to_str())
    pattern, reason = _pattern(config)
    if pattern is None:
        return None, reason
    try:  # Oniguruma syntax that fancy-regex lacks
        tiktoken.Encoding("zebra-regex", pat_str=pattern, mergeable_ranks=_BYTES, special_tokens={})
    except ValueError as e:
        return None, f"tiktoken cannot compile its split regex ({first_line(e)})"
    model = config.get("model") or {}
    reason = _model_reason(model) or _added_reason(config.get("added_tokens") or [])
    reason = reason or _post_processor_reason(config.get("post_processor"))
    if reason:
        return None, reason
    ranks, reason = _ranks(model["vocab"], model.get("merges") or [])
    if ranks is None:
        return None, reason
    specials = {t["content"]: t["id"] for t in config.get("added_tokens") or []}
    around, reason = _around(tokenizer, ranks)
    if around is None:
        return None, reason
    name = f"zebra-{len(ranks)}"
    return FastBPESpec(name, pattern, ranks, specials, *around), ""


def _pattern(config: dict) -> tuple[str | None, str]:
    if config.get("normalizer") is not None:
        return None, f"it has a normalizer ({config['normalizer'].get('type')})"
    pre = config.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        split, byte_level = {"pattern": {"Regex": GPT2_PATTERN}, "behavior": "Isolated"}, steps[0]
    elif kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        split, byte_level = steps
    else:
        return None, f"its pre-tokenizer is {' + '.join(map(str, kinds)) or 'missing'}, not ByteLevel"
    if byte_level.get("add_prefix_space"):
        return None, "its ByteLevel pre-tokenizer adds a prefix space"
    if "Regex" not in split.get("pattern", {}) or split.get("behavior") != "Isolated" or split.get("invert"):
        return None, "its Split pre-tokenizer is not an isolating regex split"
    return split["pattern"]["Regex"], ""


def _model_reason(model: dict) -> str:
    if model.get("type") != "BPE":
        return f"its model is {model.get('type')}, not BPE"
    for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            return f"its BPE model sets {key}"
    if model.get("byte_fallback"):
        return "its BPE model uses byte fallback"
    if not model.get("ignore_merges"):
        return "its BPE model re-merges pieces that are whole vocabulary entries (ignore_merges is off)"
    return ""


def _added_reason(added: list[dict]) -> str:
    contents = sorted(t["content"] for t in added)
    for t in added:
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word") or not t["content"]:
            return f"added token {t['content']!r} has strip or single-word rules"
    for a, b in pairwise(contents):
        if b.startswith(a):
            return f"added token {a!r} is a prefix of {b!r}"
    return ""


def _post_processor_reason(post: dict | None) -> str:
    steps = post.get("processors", []) if post and post.get("type") == "Sequence" else [post] if post else []
    for step in steps:
        if step.get("type") not in ("ByteLevel", "TemplateProcessing"):
            return f"its post-processor is {step.get('type')}"
    return ""


def _ranks(vocab: dict[str, int], merges: list) -> tuple[dict[bytes, int] | None, str]:
    """Token bytes -> id, when the merges are exactly tiktoken's ranks (check 2); else why not."""
    table = byte_level_chars()
    to_byte = {c: b for b, c in table.items()}
    if not all(table[b] in vocab for b in range(256)):
        return None, "its vocabulary lacks some of the 256 byte tokens"
    ranks: dict[bytes, int] = {}
    for token, i in vocab.items():
        try:
            ranks[bytes(to_byte[c] for c in token)] = i
        except KeyError:
            return None, f"vocabulary entry {token!r} is not in the ByteLevel alphabet"
    if len(ranks) != len(vocab) or len(set(ranks.values())) != len(ranks):
        return None, "its vocabulary maps bytes to ids ambiguously"
    pairs = {tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges}
    last = -1
    for m in merges:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        made = vocab.get(a + b)
        if made is None:
            return None, f"merge {a!r} + {b!r} makes no vocabulary entry"
        if made < last:
            return None, "its merges are not listed in the order of the ids they make (ids are not ranks)"
        last = made
    missing = sum(
        1
        for token in vocab
        for k in range(1, len(token))
        if token[:k] in vocab and token[k:] in vocab and (token[:k], token[k:]) not in pairs
    )
    if missing:
        return None, (
            f"{missing} ways of joining two tokens into a third are not among its merges "
            "(tiktoken would make them; a vocabulary trained by `tokenizers` lists one merge per token)"
        )
    return ranks, ""


def _around(tokenizer: Any, ranks: dict[bytes, int]) -> tuple[tuple[list[int], list[int]] | None, str]:
    """The special ids the tokenizer puts before and after every text (e.g. Llama-3's BOS)."""
    core = ranks[b"a"]
    ids = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    if ids.count(core) != 1:
        return None, "its post-processor does not keep the text's own ids intact"
    i = ids.index(core)
    return (ids[:i], ids[i + 1 :]), ""


def first_difference(encoder: Any, tokenizer: Any, documents: list[str]) -> str:
    """Where `encoder.encode` and `tokenizer(text)["input_ids"]` part on the adversarial strings and `documents`:
    "" when they agree on every one."""
    texts = list(ADVERSARIAL) + list(documents)
    ours, _ = encoder.encode(texts)
    theirs = tokenizer(texts, add_special_tokens=True)["input_ids"]
    for text, a, b in zip(texts, ours, theirs, strict=True):
        if list(a) != list(b):
            return f"ids differ on {text[:40]!r}"
    return ""


def _outside(chars: Any) -> re.Pattern:
    """A regex matching any character not in `chars` (ASCII always counts as in), written with ranges."""
    points = sorted({ord(c) for c in chars} | set(range(128)))
    runs, start = [], points[0]
    for prev, point in pairwise([*points, -1]):
        if point != prev + 1:
            runs.append((start, prev))
            start = point
    return re.compile("[^" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in runs) + "]")


class FastBPE:
    """The tiktoken encoder of one worker, with the per-character guard (check 3) and the agreement check (4).

    Args:
        spec: from `fast_bpe_spec`.
        tokenizer: the same HF tokenizer, for the checks and for the documents the guard sends back to it.
    """

    def __init__(self, spec: FastBPESpec, tokenizer: Any) -> None:
        import tiktoken

        self.spec, self.tokenizer = spec, tokenizer
        self.encoding = tiktoken.Encoding(
            spec.name, pat_str=spec.pattern, mergeable_ranks=spec.ranks, special_tokens=spec.specials
        )
        self._allowed = frozenset(spec.specials)
        self._to_byte = {c: b for b, c in byte_level_chars().items()}
        self._agrees: dict[
            str, bool
        ] = {}  # characters probed so far: do both engines split around them alike
        self._unprobed = _outside(())  # a character not (yet) known to split alike

    def check(self, documents: list[str]) -> str:
        """Compare with `tokenizer(text)["input_ids"]` on the adversarial strings and `documents`; the ASCII
        characters must also split alike. Returns "" when all agree, else what differed."""
        ascii_chars = [chr(i) for i in range(128)]
        self._probe(ascii_chars)
        if not all(self._agrees[c] for c in ascii_chars):
            return "the regex engines split ASCII text differently"
        return first_difference(self, self.tokenizer, documents)

    def encode(self, texts: list[str]) -> tuple[list[list[int]], list[int]]:
        """Ids of each text, as `tokenizer(text)["input_ids"]` gives them, and the indices of the texts that
        the tokenizer itself encoded (they hold a character the two regex engines split differently)."""
        flagged = [i for i, t in enumerate(texts) if self._unprobed.search(t)]
        hf: list[int] = []
        if flagged:
            new = set().union(*(texts[i] for i in flagged)).difference(self._agrees)
            if new:
                self._probe(sorted(new))
                self._unprobed = _outside(c for c, ok in self._agrees.items() if ok)
            hf = [i for i in flagged if self._unprobed.search(texts[i])]
        enc, allowed, prefix, suffix = self.encoding, self._allowed, self.spec.prefix, self.spec.suffix
        if hf:  # the reference encodes these; tiktoken the rest
            theirs = self.tokenizer([texts[i] for i in hf], add_special_tokens=True)["input_ids"]
            done = dict(zip(hf, theirs, strict=True))
            ids = [
                done[i]
                if i in done
                else prefix + enc.encode(t, allowed_special=allowed, disallowed_special=()) + suffix
                for i, t in enumerate(texts)
            ]
            return ids, hf
        ids = [enc.encode(t, allowed_special=allowed, disallowed_special=()) for t in texts]
        if prefix or suffix:
            ids = [prefix + x + suffix for x in ids]
        return ids, hf

    def _probe(self, chars: list[str]) -> None:
        """Record, for each character, whether tokenizers' and tiktoken's regex cut the same pieces around it.

        The probe encoder knows every byte, every piece the HF pre-tokenizer cut and every join of two
        neighbouring pieces. tiktoken then returns exactly the HF pieces if and only if it cut the same ones:
        a piece it cut differently is never one of them, and two HF pieces left in one tiktoken piece would
        have been merged into their join.
        """
        import tiktoken

        pre = self.tokenizer.backend_tokenizer.pre_tokenizer
        cases = []  # (character, text, HF pieces as bytes)
        for c in chars:
            for context in _PROBE_CONTEXTS:
                text = context.replace("{c}", c)
                pieces = [bytes(self._to_byte[ch] for ch in p) for p, _ in pre.pre_tokenize_str(text)]
                cases.append((c, text, pieces))
        ranks = dict(_BYTES)
        for _, _, pieces in cases:
            for p in pieces + [a + b for a, b in pairwise(pieces)]:
                ranks.setdefault(p, len(ranks))
        probe = tiktoken.Encoding(
            "zebra-probe", pat_str=self.spec.pattern, mergeable_ranks=ranks, special_tokens={}
        )
        for c in chars:
            self._agrees[c] = True
        for c, text, pieces in cases:
            if probe.encode_ordinary(text) != [ranks[p] for p in pieces]:
                self._agrees[c] = False
