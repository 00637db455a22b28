"""How the CLI asks for a page of instances and says what it left out
(keelway/cli/output.py): the flags' query, the line after a page, the counts, and the
plain table a long listing is printed as."""

from __future__ import annotations

import pytest

from keelway.cli.output import PLAIN_FROM_ROWS, page_line, page_query, state_counts, table


def test_the_human_view_pages_and_json_answers_every_instance_unless_a_page_is_asked() -> None:
    assert page_query(show_all=False, page=None, as_json=False) == "page=1"
    assert page_query(show_all=False, page=3, as_json=False) == "page=3"
    assert page_query(show_all=True, page=None, as_json=False) == ""
    assert page_query(show_all=False, page=None, as_json=True) == ""
    assert page_query(show_all=False, page=2, as_json=True) == "page=2"


def test_all_and_a_page_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        page_query(show_all=True, page=2, as_json=False)
    assert ended.value.code == 1
    assert "--all and --page" in capsys.readouterr().err


def test_the_line_after_a_page_says_what_is_left_and_how_to_see_it() -> None:
    first = {"number": 1, "size": 20, "pages": 500, "total": 10_000}
    assert page_line(first, "keelway status shop") == (
        "instances 1-20 of 10000 (page 1 of 500): `keelway status shop --page 2` for the "
        "next, `keelway status shop --all` for every one")
    last = {"number": 3, "size": 20, "pages": 3, "total": 46}
    assert page_line(last, "keelway status shop") == (
        "instances 41-46 of 46 (page 3 of 3): `keelway status shop --all` for every one")
    assert page_line({"number": 1, "size": 20, "pages": 1, "total": 5}, "x") is None
    assert page_line(None, "x") is None


def test_the_counts_put_the_most_common_state_first_and_say_what_needs_attention() -> None:
    summary = {"instances": 10_000, "states": {"running": 10, "parked": 9989, "crashed": 1},
               "releases": {"v1": 11}, "attention": 1}
    assert state_counts(summary) == ("10000 instances: 9989 parked, 10 running, 1 crashed; "
                                     "1 needs attention")
    assert state_counts({"instances": 0, "states": {}, "attention": 0}) == "0 instances"


def test_a_long_table_is_printed_as_plain_columns_every_cell_whole(
        capsys: pytest.CaptureFixture[str]) -> None:
    rows = [(f"t{n}.shop.test", "parked" if n else "running") for n in range(PLAIN_FROM_ROWS)]
    table(None, ["instance", "state"], rows)
    lines = capsys.readouterr().out.splitlines()
    widest = len(rows[-1][0])
    assert lines[:3] == ["instance".ljust(widest) + "  state",
                         "-" * widest + "  -------", "t0.shop.test".ljust(widest) + "  running"]
    assert len(lines) == PLAIN_FROM_ROWS + 2 and lines[-1] == f"{rows[-1][0]}  parked"
