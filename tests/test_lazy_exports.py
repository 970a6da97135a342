"""zebra.core.lazy: a package's public names load their modules on first use only."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("package", "name", "module"),
    [
        ("zebra.eval", "heldout_ce", "zebra.eval.ce"),
        ("zebra.eval", "run_eval", "zebra.eval.harness"),
        ("zebra.convert", "verify", "zebra.convert.verifier"),
        ("zebra.upcycle", "StudentOptions", "zebra.upcycle.student"),
        ("zebra.data", "read_manifest", "zebra.data.manifest"),
    ],
)
def test_a_name_loads_its_module_on_first_use_only(package, name, module):
    code = (
        f"import sys, {package} as p\n"
        f"before = {module!r} in sys.modules\n"
        f"thing = p.{name}\n"
        f"print(before, {module!r} in sys.modules, thing.__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True", module]


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    import zebra.eval

    with pytest.raises(AttributeError, match=r"module 'zebra\.eval' has no attribute 'no_such_name'"):
        zebra.eval.no_such_name  # noqa: B018
