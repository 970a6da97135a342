"""Key and shape audits: a checkpoint's tensors against the parameters of the class that will load them.

The expected names and shapes come from instantiating the real class (ZebraForCausalLM, or FLA's
GatedDeltaNetForCausalLM / KDAForCausalLM) on the `meta` device, which allocates nothing. Tied output heads
are expected to be absent (saved once, as transformers expects).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from zebra.core.errors import ZebraError
from zebra.models import ZebraForCausalLM


@dataclass
class Audit:
    """Result of comparing a checkpoint's tensors with a model's: every list holds names."""

    target: str
    subject: str = ""  # the checkpoint audited
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, list[int], list[int]]] = field(default_factory=list)  # name, got, expected
    checked: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "subject": self.subject,
            "ok": self.ok,
            "checked": self.checked,
            "missing": self.missing,
            "unexpected": self.unexpected,
            "mismatched": [{"name": n, "got": g, "expected": e} for n, g, e in self.mismatched],
        }

    def raise_if_failed(self, origin: str) -> None:
        """A one-line ZebraError naming the first few problems."""
        if self.ok:
            return
        problems = [f"missing {n}" for n in self.missing[:3]]
        problems += [f"unexpected {n}" for n in self.unexpected[:3]]
        problems += [f"{n} is {g}, {self.target} expects {e}" for n, g, e in self.mismatched[:3]]
        total = len(self.missing) + len(self.unexpected) + len(self.mismatched)
        more = f" (+{total - len(problems)} more)" if total > len(problems) else ""
        raise ZebraError(
            f"{origin}: does not fit {self.target}: {'; '.join(problems)}{more}",
            fix="the checkpoint and its config disagree; check both come from the same model",
        )


def meta_model(cls: Any, config: Any) -> Any:
    """`cls(config)` on the meta device (no memory, no init)."""
    with torch.device("meta"):
        return cls(config)


def expected_shapes(model: Any) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """(name -> shape of every state-dict tensor, names of tied copies that need not be saved)."""
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied: set[str] = set()
    if getattr(model.config, "tie_word_embeddings", False):
        tied_keys = getattr(model, "_tied_weights_keys", None) or {}
        tied.update(tied_keys)  # a dict {tied name: source name} in transformers 5, a list before
    return shapes, tied


def audit(
    shapes: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    *,
    tied: set[str] = frozenset(),  # type: ignore[assignment]
    target: str,
) -> Audit:
    """Compare checkpoint `shapes` with `expected`; tied names may be present or absent."""
    result = Audit(target=target, checked=len(shapes))
    for name, shape in expected.items():
        if name not in shapes:
            if name not in tied:
                result.missing.append(name)
        elif tuple(shapes[name]) != tuple(shape):
            result.mismatched.append((name, list(shapes[name]), list(shape)))
    result.unexpected = [n for n in shapes if n not in expected]
    return result


def zebra_audit(shapes: dict[str, tuple[int, ...]], config: Any, subject: str = "") -> Audit:
    """Audit against `ZebraForCausalLM(config)`."""
    expected, tied = expected_shapes(meta_model(ZebraForCausalLM, config))
    result = audit(shapes, expected, tied=tied, target="ZebraForCausalLM")
    result.subject = subject
    return result
