"""`[rollout]` in keelway.toml: the canary, cohorts, parallelism, bake and budgets of a
release's rollout (issue #19), and the cohort sizes they give for a number of instances."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keelway.builds.errors import ManifestError
from keelway.builds.manifest import (
    Amount,
    NoTraffic,
    RolloutSpec,
    cohort_sizes,
    load_manifest,
)


def _app(tmp_path: Path, toml: str | None) -> Path:
    (tmp_path / "Procfile").write_text("web: python3 -m http.server $PORT\n")
    if toml is not None:
        (tmp_path / "keelway.toml").write_text(toml)
    return tmp_path


def _rollout(tmp_path: Path, body: str) -> RolloutSpec:
    return load_manifest(_app(tmp_path, "[rollout]\n" + body)).rollout


def test_no_rollout_table_gives_the_defaults(tmp_path: Path) -> None:
    rollout = load_manifest(_app(tmp_path, None)).rollout
    assert rollout == RolloutSpec()
    assert rollout.canary == Amount(count=1)
    assert [str(c) for c in rollout.cohorts] == ["10%", "50%", "100%"]
    assert (rollout.parallel, rollout.bake_s) == (8, 0.0)
    assert str(rollout.max_5xx) == "1%"
    assert rollout.on_no_traffic is NoTraffic.PASS
    assert _rollout(tmp_path, "") == RolloutSpec()


def test_every_key_is_read(tmp_path: Path) -> None:
    rollout = _rollout(tmp_path, 'canary = 2\ncohorts = [5, "12.5%", "100%"]\nparallel = 3\n'
                                 'bake = "1m30s"\nmax_5xx = 4\non_no_traffic = "halt"\n')
    assert rollout.canary == Amount(count=2)
    assert rollout.cohorts == (Amount(count=5), Amount(percent=Fraction(25, 2)),
                               Amount(percent=Fraction(100)))
    assert (rollout.parallel, rollout.bake_s) == (3, 90.0)
    assert rollout.max_5xx == Amount(count=4)
    assert rollout.on_no_traffic is NoTraffic.HALT
    assert _rollout(tmp_path, 'canary = "5%"\nbake = 0\nmax_5xx = "0.5%"\n').canary == Amount(
        percent=Fraction(5))
    assert _rollout(tmp_path, 'on_no_traffic = "wait"\n').on_no_traffic is NoTraffic.WAIT


@pytest.mark.parametrize(("body", "message"), [
    ("canary = -1\n", r"\[rollout\] canary: -1 must be 0 or more"),
    ('canary = "ten"\n', r"\[rollout\] canary: 'ten' is neither a number of instances"),
    ('canary = "150%"\n', r"canary: '150%' is neither .* from \"0%\" to \"100%\""),
    ("canary = 1.5\n", r"rollout.canary"),
    ("cohorts = []\n", r"\[rollout\] cohorts: is empty"),
    ('cohorts = ["50%", "10%", "100%"]\n', r"cohorts: .* must grow from one cohort"),
    ('cohorts = [5, 5, "100%"]\n', r"cohorts: .* must grow"),
    ('cohorts = ["10%", "50%"]\n', r'cohorts: the last cohort must be "100%"'),
    ("cohorts = [1, 5, 20]\n", r'the last cohort must be "100%".*it is 20'),
    ('cohorts = [0, "100%"]\n', r"cohorts: .* has an empty cohort"),
    ('cohorts = ["0%", "100%"]\n', r"has an empty cohort"),
    ('cohorts = ["1x", "100%"]\n', r"cohorts\[0\]: '1x' is neither"),
    ("cohorts = [true]\n", r"rollout.cohorts"),
    ("parallel = 0\n", r"\[rollout\] parallel: 0 must be at least 1"),
    ('parallel = "8"\n', r"rollout.parallel"),
    ('bake = "soon"\n', r"\[rollout\] bake: 'soon' is not a duration"),
    ("bake = -1\n", r"\[rollout\] bake: -1(\.0)? must be a finite, non-negative duration"),
    ('max_5xx = "1"\n', r"\[rollout\] max_5xx: '1' is neither a number of responses"),
    ("max_5xx = -2\n", r"max_5xx: -2 must be 0 or more \(a number of responses\)"),
    ('on_no_traffic = "skip"\n',
     r'\[rollout\] on_no_traffic: \'skip\' is not one of "pass", "wait", "halt"'),
    ("canaries = 1\n", r"canaries"),
])
def test_a_bad_rollout_table_is_refused_naming_the_key(tmp_path: Path, body: str,
                                                        message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        _rollout(tmp_path, body)


def test_cohort_sizes_of_the_default_rollout() -> None:
    default = RolloutSpec()
    assert cohort_sizes(default, 0) == []
    assert cohort_sizes(default, 1) == [1]
    # 10% of 3 is the canary already: no cohort adds nothing.
    assert cohort_sizes(default, 3) == [1, 1, 1]
    assert cohort_sizes(default, 20) == [1, 1, 8, 10]
    assert cohort_sizes(default, 1000) == [1, 99, 400, 500]


def test_cohort_sizes_mixing_counts_and_percentages() -> None:
    rollout = RolloutSpec(canary=Amount(count=2),
                          cohorts=(Amount(count=5), Amount(percent=Fraction(10)),
                                   Amount(percent=Fraction(100))))
    assert cohort_sizes(rollout, 20) == [2, 3, 15]  # 10% of 20 is 2: below 5, left out
    assert cohort_sizes(rollout, 1000) == [2, 3, 95, 900]
    assert cohort_sizes(rollout, 3) == [2, 1]
    no_canary = RolloutSpec(canary=Amount(count=0))
    assert cohort_sizes(no_canary, 20) == [2, 8, 10]


def test_budgets_are_shares_unrounded_or_counts() -> None:
    one_percent = Amount(percent=Fraction(1))
    assert one_percent.allows(0, 0) and one_percent.allows(1, 100)
    assert not one_percent.allows(1, 99) and not one_percent.allows(1, 50)
    assert Amount(count=2).allows(2, 3) and not Amount(count=2).allows(3, 1000)


_amounts = st.one_of(
    st.builds(Amount, count=st.integers(0, 2000)),
    st.builds(Amount, percent=st.fractions(0, 100, max_denominator=1000)),
)


@given(st.builds(RolloutSpec, canary=_amounts, cohorts=st.lists(_amounts).map(tuple)),
       st.integers(0, 5000))
def test_cohort_sizes_cover_every_instance_once(rollout: RolloutSpec, instances: int) -> None:
    sizes = cohort_sizes(rollout, instances)
    assert sum(sizes) == instances
    assert all(size >= 1 for size in sizes)
    if sizes and rollout.canary.of(instances) > 0:
        assert sizes[0] == rollout.canary.of(instances) <= instances
    assert len(sizes) <= len(rollout.cohorts) + 2
