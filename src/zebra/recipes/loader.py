"""Load recipes: find by name or path, follow `extends:`, apply overrides, validate against the schema.

Overrides are typed: `{dotted key: value}` (`Overrides`). `zebra train`'s flags and `--init` give Python values;
`--set KEY=VALUE` text is read once at the command line's edge (`parse_assignments`) and coerced by the same
schema checks, so a wrong value reads the same from either.

Every problem becomes a `ZebraError` reading `file: key.path: problem (expected ...)`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from zebra.core.errors import ZebraError, yaml_problem
from zebra.data.paths import DataPath, parse_data_path
from zebra.recipes.schema import MAX_SEQUENCES, Recipe, field_choices
from zebra.spec import arch

Overrides = Mapping[str, Any]  # dotted recipe key -> value (a Python value, or `--set` text as `CliText`)

_PACKAGE_DIR = Path(__file__).resolve().parents[1] / "_recipes"  # installed wheel: zebra/_recipes
_SOURCE_DIR = Path(__file__).resolve().parents[3] / "recipes"  # source checkout / editable install


def builtin_dir() -> Path:
    """The folder holding the shipped recipe YAMLs."""
    return _PACKAGE_DIR if _PACKAGE_DIR.is_dir() else _SOURCE_DIR


def list_recipes() -> list[str]:
    """Names of the built-in recipes, sorted."""
    return sorted(p.stem for p in builtin_dir().glob("*.yaml"))


def find_recipe(name_or_path: str | Path, *, relative_to: Path | None = None) -> Path:
    """Resolve a recipe name or YAML path to a file, suggesting close names when there is none."""
    text = str(name_or_path)
    candidates = [Path(text)]
    if relative_to is not None:
        candidates.insert(0, relative_to / text)
    for p in candidates:
        if p.is_file():
            return p.resolve()
    builtin = builtin_dir() / f"{text}.yaml"
    if builtin.is_file():
        return builtin
    if text.endswith((".yaml", ".yml")) or "/" in text:
        raise ZebraError(f"{text}: recipe file not found", fix="check the path, or see `zebra recipes list`")
    close = difflib.get_close_matches(text, list_recipes(), n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(close)}?" if close else "see `zebra recipes list`"
    if relative_to is not None and (relative_to / f"{text}.yaml").is_file():
        hint = f"a name means a built-in recipe; for the file beside this one write ./{text}.yaml"
    raise ZebraError(f"unknown recipe {text!r}", fix=hint)


@functools.cache
def _unique_keys_loader() -> type:
    """yaml's SafeLoader, refusing a key given twice in one mapping (plain YAML keeps the last one silently)."""
    import yaml

    class UniqueKeysLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"{key!r} is given twice", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeysLoader


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ZebraError(f"{path}: cannot read the recipe ({e})") from None
    try:
        data = yaml.load(text, Loader=_unique_keys_loader())
    except yaml.YAMLError as e:
        line, what = yaml_problem(e)
        where = f" line {line}:" if line else ""
        raise ZebraError(f"{path}:{where} not valid YAML ({what})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ZebraError(
            f"{path}: a recipe must be a mapping of sections (expected keys like model:, train:)"
        )
    return data


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_raw(path: Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The YAML mapping of `path` merged over its `extends:` parents (child keys win, lists replace)."""
    if path in _chain:
        cycle = " -> ".join(p.name for p in (*_chain, path))
        raise ZebraError(f"{path}: extends: cycle {cycle}")
    data = _read_yaml(path)
    parent = data.pop("extends", None)
    data.setdefault("name", path.stem)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ZebraError(f"{path}: extends: must be a recipe name or path (expected a string)")
    try:
        parent_path = find_recipe(parent, relative_to=path.parent)
    except ZebraError as e:
        raise ZebraError(f"{path}: extends: {e.message}", fix=e.fix) from None
    base = load_raw(parent_path, (*_chain, path))
    base.pop("description", None)  # a description describes one file, not its children
    return _deep_merge(base, data)


def parse_assignments(assignments: Iterable[str]) -> dict[str, CliText]:
    """The command line's `--set a.b.c=value` strings as overrides: `{"a.b.c": CliText("value")}`, in order.

    This is where `--set` text is read; the schema coerces each value once (`load_recipe`).

    >>> parse_assignments(["train.lr=3e-4"])
    {'train.lr': '3e-4'}
    """
    sets: dict[str, CliText] = {}
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ZebraError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set train.lr=3e-4")
        _key_parts(key, assignment)
        sets = combine(sets, {key: CliText(value.strip())})
    return sets


def combine(*overrides: Overrides) -> dict[str, Any]:
    """Overrides given one after the other as one mapping: a key given again takes its last value and its last
    place (so `--set model.mla.kv_lora_rank=64` after `--init` wins, as does a later `--set` of a section)."""
    out: dict[str, Any] = {}
    for sets in overrides:
        for key, value in sets.items():
            out.pop(key, None)
            out[key] = value
    return out


def _key_parts(key: str, given: str) -> list[str]:
    parts = key.split(".")
    if not all(parts):
        raise ZebraError(f"--set {given!r}: empty part in key {key!r} (expected a dotted path like train.lr)")
    return parts


def apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted `key` of `raw` to `value` in place, marked as an override: errors about it name `--set`.
    The schema coerces it as it does a YAML value, or as `--set` text when it is a `CliText`."""
    node = raw
    parts = _key_parts(key, f"{key}={value}")
    for part in parts[:-1]:
        child = node.setdefault(part, _OverrideSection())
        if not isinstance(child, dict):
            raise ZebraError(f"--set {f'{key}={value}'!r}: {part} is not a section")
        node = child
    node[parts[-1]] = _Override(value)


class CliText(str):
    """A value as typed after `--set KEY=`: coerced to the field's type (`null`, `a,b`, `yes`; YAML values and
    typed overrides are not)."""


@dataclasses.dataclass(frozen=True)
class _Override:
    """A value an override put in the raw recipe (so errors about it name --set)."""

    value: Any


class _OverrideSection(dict):
    """A section that only the command line created (so errors in it name --set)."""


def _origin(value: Any, source: str) -> str:
    return "--set" if isinstance(value, _Override | _OverrideSection) else source


def _given(value: Any) -> Any:
    return value.value if isinstance(value, _Override) else value


def _section(value: Any) -> Any:
    """A section's raw value for `build`: null is empty; a mapping an override gave stays marked as one."""
    given = _given(value)
    if given is None:
        return {}
    if isinstance(value, _Override) and isinstance(given, dict):
        return _OverrideSection({k: _Override(v) for k, v in given.items()})
    return value


def _type_name(tp: Any) -> str:
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    origin = typing.get_origin(tp)
    if origin is list:
        return "a list of strings"
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_type_name(args[0])} or null"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, where: str, meta: dict[str, Any]) -> Any:
    """Value converted to `tp`, or raise ValueError('problem (expected ...)')."""
    from_cli = isinstance(value, CliText)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (from_cli and value.lower() in ("null", "none", "")):
            return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    expected = _type_name(tp)
    if origin is list:
        if from_cli:
            if value.startswith("[") != value.endswith("]"):
                raise ValueError(f"got {value!r} (unbalanced brackets; expected a,b or [a, b])")
            value = [] if value in ("", "[]") else [v.strip() for v in value.strip("[]").split(",")]
        if typing.get_args(tp) == (DataPath,):
            return _data_paths(value, expected)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"got {value!r} (expected {expected})")
        return list(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_cli and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            return value.lower() in ("true", "yes", "1", "on")
        raise ValueError(f"got {value!r} (expected {expected})")
    if tp is int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"got {value!r} (expected {expected})") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"got {value!r} (expected {expected})")
    elif tp is float:
        if isinstance(value, str):  # YAML 1.1 reads `2e-4` as a string: accept any float literal
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"got {value!r} (expected {expected})") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"got {value!r} (expected {expected})")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"got {value!r} (expected a finite number)")
    elif tp is str:
        if not isinstance(value, str):
            raise ValueError(f"got {value!r} (expected {expected}; quote it in YAML)")
        value = str(value)
    lo, hi, choices = meta.get("min"), meta.get("max"), field_choices(meta)
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"got {value!r} (expected one of {', '.join(map(str, choices))}{hint})")
    if lo is not None and value < lo:
        raise ValueError(f"{value} is below the minimum (expected >= {lo})")
    if hi is not None and value > hi:
        raise ValueError(f"{value} is above the maximum (expected <= {hi})")
    return value


def _data_paths(value: Any, expected: str) -> list[DataPath]:
    """`data.paths` as `DataPath`s: text (YAML, `--set`) parsed here, once; `DataPath`s (`--data`) kept."""
    if not isinstance(value, list) or not all(isinstance(v, str | DataPath) for v in value):
        raise ValueError(f"got {value!r} (expected {expected})")
    try:
        return [v if isinstance(v, DataPath) else parse_data_path(v) for v in value]
    except ZebraError as e:
        raise ValueError(e.message) from None


def build(cls: type, data: Any, path: str, source: str) -> Any:
    """Instantiate dataclass `cls` from mapping `data`, validating every key against the schema."""
    if not isinstance(data, dict):
        raise ZebraError(
            f"{_origin(data, source)}: {path or 'recipe'}: got {_given(data)!r} (expected a mapping)"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), list(fields), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(fields)}"
        where = f"{path}.{key}" if path else str(key)
        raise ZebraError(f"{_origin(data[key], source)}: {where}: unknown key ({hint})")
    kwargs = {}
    for name, value in data.items():
        where = f"{path}.{name}" if path else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build(tp, _section(value), where, source)
            continue
        try:
            kwargs[name] = _coerce(_given(value), tp, where, dict(fields[name].metadata))
        except ValueError as e:
            raise ZebraError(f"{_origin(value, source)}: {where}: {e}") from None
    return cls(**kwargs)


def _check(recipe: Recipe, source: str, overridden: set[str]) -> None:
    """Cross-field rules the per-field ranges cannot express. An error names `--set` when one of the keys it
    involves was set there (`overridden`: the dotted keys of the overrides), else the recipe file `source`."""

    def fail(where: str, problem: str, *also: str) -> None:
        keys = (where, *also)
        from_cli = any(
            o == k or k.startswith(f"{o}.") or o.startswith(f"{k}.") for o in overridden for k in keys
        )
        raise ZebraError(f"{'--set' if from_cli else source}: {where}: {problem}")

    m, t = recipe.model, recipe.train
    flat = arch.as_config(m.flat())
    shape = ("model.num_layers", "model.recurrent_type", "model.hybrid_attention_ratio", "model.pattern")
    try:
        pattern = arch.resolve_pattern(flat)
    except ValueError as e:
        fail("model.pattern" if m.pattern else "model.hybrid_attention_ratio", str(e), *shape)
    if m.pattern and len(m.pattern) != m.num_layers:
        fail(
            "model.pattern",
            f"{m.pattern!r} has {len(m.pattern)} sublayers but model.num_layers is {m.num_layers} "
            "(expected one character per sublayer)",
            "model.num_layers",
        )
    if not m.pattern and m.num_layers % 2:
        fail("model.num_layers", f"{m.num_layers} is odd (expected an even count: each mixer has its MLP)")
    for mixer in arch.used_mixers(pattern):
        for name, problem in mixer.check(flat):
            section = ".".join(filter(None, ("model", mixer.section)))
            fail(f"{section}.{name}", problem, section, "model.hidden_size", *shape)
    if t.min_lr > t.lr:
        fail("train.min_lr", f"{t.min_lr} exceeds train.lr {t.lr} (expected min_lr <= lr)", "train.lr")
    if t.max_steps * t.global_batch_size > MAX_SEQUENCES:
        fail(
            "train.max_steps",
            f"{t.max_steps:,} steps x {t.global_batch_size:,} sequences is above {MAX_SEQUENCES:,} sequences, the "
            "most a run's data index holds (expected fewer steps or a smaller train.global_batch_size)",
            "train.global_batch_size",
        )
    if t.micro_batch_size > t.global_batch_size:
        fail(
            "train.micro_batch_size",
            f"{t.micro_batch_size} exceeds global_batch_size {t.global_batch_size}",
            "train.global_batch_size",
        )
    split = recipe.data.split.split(",")
    try:
        parts = [float(s) for s in split]
        if len(parts) != 3 or min(parts) < 0 or sum(parts) <= 0:
            raise ValueError
    except ValueError:
        fail("data.split", f"{recipe.data.split!r} (expected three non-negative weights like '99,1,0')")


def load_recipe(name_or_path: str | Path, overrides: Overrides | Iterable[str] = ()) -> Recipe:
    """Load, merge (`extends:`), override and validate a recipe.

    Args:
        overrides: `{dotted key: value}`, applied in order after the YAML: Python values (`7`, `True`,
            `[DataPath, ...]`) or `--set` text (`CliText`), checked by the same schema with the same errors;
            or `--set` strings `a.b=c`, read by `parse_assignments`.

    >>> load_recipe("tiny", overrides={"train.lr": 3e-4}).train.lr
    0.0003
    >>> load_recipe("tiny", overrides=["train.lr=3e-4"]).train.lr
    0.0003
    """
    sets = dict(overrides) if isinstance(overrides, Mapping) else parse_assignments(overrides)
    path = find_recipe(name_or_path)
    raw = load_raw(path)
    for key, value in sets.items():
        apply_override(raw, key, value)
    recipe = build(Recipe, raw, "", str(path))
    recipe.source = str(path)
    recipe.overridden = list(sets)
    _check(recipe, str(path), set(sets))
    return recipe


def dump_recipe(recipe: Recipe) -> str:
    """The resolved recipe as YAML (sections in schema order)."""
    import yaml

    return yaml.safe_dump(recipe.to_dict(), sort_keys=False, default_flow_style=False, width=110)
