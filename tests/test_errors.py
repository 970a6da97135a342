"""The one-line text of a library's exception that a ZebraError quotes."""

from __future__ import annotations

from zebra.core.errors import error_summary, first_line


def test_first_line_skips_blank_lines_and_cuts_long_ones():
    assert first_line(ValueError("\n  header line  \ndetail\n")) == "header line"
    cut = first_line(OSError("x" * 500), limit=50)
    assert len(cut) == 50 and cut.endswith("...")


def test_an_exception_with_an_empty_message_is_named_by_its_type():
    """`str(e).splitlines()[0]` raised IndexError here: the error report itself crashed."""
    assert first_line(KeyError()) == "KeyError"
    assert first_line(RuntimeError("   \n")) == "RuntimeError"
    assert first_line("") == ""  # a tool's empty stderr stays empty


def test_error_summary_names_the_type_once():
    assert error_summary(ValueError("bad magic\nmore")) == "ValueError: bad magic"
    assert error_summary(EOFError()) == "EOFError"
