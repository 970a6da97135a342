"""The shared name-mapping core: declarative `{}`-templated key maps between foreign checkpoints and Zebra.

A key map is a plain dict `{foreign_template: target}` (torchtitan `StateDictAdapter` / litgpt `weight_map`
style). A foreign template may hold

    {i}   a layer number (digits)
    {*}   any dotted suffix, copied unchanged to the target

and the target is one of

    "model.layers.{i}.norm.weight"   a rename; the Zebra side may also say {2i} or {2i+1} (FLA's layer i is
                                     Zebra's sublayers 2i and 2i+1) and {*}
    Split(dim, (template, size), ...)  a fused tensor cut into parts along `dim`; sizes name entries of a
                                     `dims` dict computed from the model config
    Reshape(template, (size, ...))   the same values in another shape (Megatron's KDA `A_log [1, 1, H, 1]`)
    None                             the key is dropped (TE `_extra_state`, unused norms)

`plan_keys` turns a checkpoint's key list + shapes into `Piece`s without reading a single tensor, so shapes,
missing and unexpected keys are all checked before anything is written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zebra.core.errors import ZebraError
from zebra.mixers.spec import Reshape, Split  # a mixer's Megatron table holds them: declared with the specs

# Index tokens say how the number in a key relates to the rule's layer index i.
_INDEX_EXPR = {"{i}": lambda i: i, "{2i}": lambda i: 2 * i, "{2i+1}": lambda i: 2 * i + 1}
_INDEX_INVERSE = {"{i}": lambda n: n, "{2i}": lambda n: n // 2, "{2i+1}": lambda n: (n - 1) // 2}
_TOKEN = re.compile(r"\{i\}|\{2i\}|\{2i\+1\}|\{\*\}")


Target = str | Split | Reshape | None


@dataclass(frozen=True)
class Piece:
    """One output tensor of a conversion: `name` is made from source key `source` by `transform`."""

    name: str
    source: str
    shape: tuple[int, ...]
    dtype: Any  # torch.dtype
    transform: Callable[[Any], Any] | None = field(default=None, compare=False)


def _compile(template: str) -> tuple[re.Pattern, list[str]]:
    """Regex for a foreign template and the order of its placeholders."""
    out, names, pos = [], [], 0
    for m in _TOKEN.finditer(template):
        out.append(re.escape(template[pos : m.start()]))
        tok = m.group(0)
        out.append(r"(.+)" if tok == "{*}" else r"(\d+)")
        names.append(tok)
        pos = m.end()
    out.append(re.escape(template[pos:]))
    return re.compile("^" + "".join(out) + "$"), names


def _render(template: str, layer: int | None, suffix: str | None) -> str:
    def sub(m: re.Match) -> str:
        tok = m.group(0)
        if tok == "{*}":
            return suffix or ""
        return str(_INDEX_EXPR[tok](layer))

    return _TOKEN.sub(sub, template)


class KeyMap:
    """A compiled key map. `resolve(key)` gives `(target, layer, suffix)` or raises KeyError.

    Exact templates win over templated ones; among templated ones the first match in table order wins, so
    specific rules go before catch-alls such as `{*}._extra_state`. Index tokens work on both sides: a source
    template `model.layers.{2i+1}.norm.weight` matches odd sublayers only, which is what makes `inverse()` a
    plain swap of keys and values.
    """

    def __init__(self, table: Mapping[str, Target]):
        self.table = dict(table)
        self._exact = {k: v for k, v in self.table.items() if not _TOKEN.search(k)}
        self._patterns = [(*_compile(k), v) for k, v in self.table.items() if _TOKEN.search(k)]

    def resolve(self, key: str) -> tuple[Target, int | None, str | None]:
        if key in self._exact:
            return self._exact[key], None, None
        for regex, tokens, target in self._patterns:
            m = regex.match(key)
            if not m:
                continue
            layer = suffix = None
            for tok, val in zip(tokens, m.groups(), strict=True):
                if tok == "{*}":
                    suffix = val
                    continue
                n = int(val)
                if _INDEX_EXPR[tok](_INDEX_INVERSE[tok](n)) != n:  # {2i} saw an odd number, or the reverse
                    break
                layer = _INDEX_INVERSE[tok](n)
            else:
                return target, layer, suffix
        raise KeyError(key)

    def rename(self, key: str) -> str | None:
        """The target name of a rename (None when the key is dropped); KeyError when no rule matches."""
        target, layer, suffix = self.resolve(key)
        if target is None:
            return None
        if not isinstance(target, str):
            raise TypeError(f"{key}: not a rename")
        return _render(target, layer, suffix)

    def inverse(self) -> KeyMap:
        """The reverse map of a table of renames (dropped keys stay dropped one way only)."""
        table: dict[str, Target] = {}
        for src, dst in self.table.items():
            if dst is None:
                continue
            if not isinstance(dst, str):
                raise TypeError(f"{src}: only renames can be inverted")
            table[dst] = src
        return KeyMap(table)


def resolve_size(size: str | int, dims: Mapping[str, int], key: str) -> int:
    if isinstance(size, int):
        return size
    if size not in dims:
        raise ZebraError(
            f"{key}: the model config gives no size for {size!r}", fix="report this as a zebra bug"
        )
    return dims[size]


def plan_keys(
    keymap: KeyMap | Callable[[str], KeyMap | None],
    shapes: Mapping[str, tuple[tuple[int, ...], Any]],
    dims: Mapping[str, int],
    *,
    origin: str,
    fix: str,
) -> list[Piece]:
    """Expand every source key into its output pieces (shapes only; no tensor is read).

    Args:
        keymap: the map, or a function choosing the map per key (Megatron chooses by sublayer kind).
        shapes: source key -> (shape, dtype), in the order tensors should be written.
        dims: named sizes for `Split` / `Reshape`.
        origin: the file or directory, for error messages.
        fix: what to tell the user when a key has no rule (an unknown architecture).
    """
    pieces: list[Piece] = []
    for key, (shape, dtype) in shapes.items():
        km = keymap(key) if callable(keymap) and not isinstance(keymap, KeyMap) else keymap
        try:
            if km is None:
                raise KeyError(key)
            target, layer, suffix = km.resolve(key)
        except KeyError:
            raise ZebraError(f"{origin}: unexpected tensor {key} {list(shape)}", fix=fix) from None
        pieces.extend(_expand(key, target, layer, suffix, tuple(shape), dtype, dims, origin))
    return pieces


def _expand(key, target, layer, suffix, shape, dtype, dims, origin) -> Iterable[Piece]:
    if target is None:
        return []
    if isinstance(target, str):
        return [Piece(_render(target, layer, suffix), key, shape, dtype)]
    if isinstance(target, Reshape):
        new = tuple(resolve_size(s, dims, key) for s in target.shape)
        if _numel(new) != _numel(shape):
            raise ZebraError(
                f"{origin}: {key} has shape {list(shape)}, expected {_numel(new)} values to reshape to {list(new)}",
                fix="the checkpoint does not match its saved arguments; check it is complete and unmodified",
            )
        return [
            Piece(_render(target.target, layer, suffix), key, new, dtype, lambda t, new=new: t.reshape(new))
        ]
    sizes = [resolve_size(s, dims, key) for _, s in target.parts]
    if len(shape) <= target.dim or sum(sizes) != shape[target.dim]:
        names = " + ".join(f"{s}={n}" for (_, s), n in zip(target.parts, sizes, strict=True))
        raise ZebraError(
            f"{origin}: {key} has shape {list(shape)}, but the config splits dim {target.dim} as {names}",
            fix="the checkpoint does not match its saved arguments; check it is complete and unmodified",
        )
    out, start = [], 0
    for (tmpl, _), n in zip(target.parts, sizes, strict=True):
        part_shape = (*shape[: target.dim], n, *shape[target.dim + 1 :])
        fn = _narrow(target.dim, start, n)
        out.append(Piece(_render(tmpl, layer, suffix), key, part_shape, dtype, fn))
        start += n
    return out


def _narrow(dim: int, start: int, length: int) -> Callable[[Any], Any]:
    return lambda t: t.narrow(dim, start, length)


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
