"""How the CLI says values and counts (keelway/cli/output.py)."""

from __future__ import annotations

from keelway.cli.output import plural, shown_value


def test_a_value_with_a_line_break_or_control_character_is_quoted_on_one_line() -> None:
    assert shown_value("line one\nline two") == '"line one\\nline two"'
    assert shown_value("a\tb") == '"a\\tb"'
    assert shown_value("bell\x07") == '"bell\\u0007"'
    assert shown_value(" padded ") == '" padded "'
    assert shown_value('"quoted"') == '"\\"quoted\\""'


def test_a_plain_value_is_shown_as_it_is() -> None:
    assert shown_value("postgres://u@h/db?x=1 y") == "postgres://u@h/db?x=1 y"
    assert shown_value("héllo") == "héllo"
    assert shown_value("") == ""


def test_counts_agree_with_their_nouns() -> None:
    assert [plural(n, "process", "processes") for n in (0, 1, 2)] == [
        "0 processes", "1 process", "2 processes"]
