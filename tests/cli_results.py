"""Checks on a `zebra` command's click Result that several test folders share."""

from __future__ import annotations


def assert_one_line_error(result, *needles: str) -> str:
    """The command failed with exit code 1 and exactly one `error:` line, no traceback, every needle in stderr;
    returns the error line."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return errors[0]
