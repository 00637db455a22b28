"""`status` and `instances list` at density, through the real CLI and daemon: each app's
instances counted by state and those that need attention first, then a page of rows
with a line saying how to see the rest (`--page K`, `--all`); `--json` still answers
every instance with every field; bad pages are refused with nothing changed; and the
foreground `up` names a few hosts and counts the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.cli.client import ApiError, Client
from keelway.home import Home
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway

pytestmark = pytest.mark.slow

HOST = "one.test"
PARKED = [f"p{n:02d}.test" for n in range(44)]
FENCED = "zz.test"  # sorts last: its row is on the last page, its attention on the first
EVERY = sorted([HOST, *PARKED, FENCED])
# What each instance of `status --json` carried before it paged: its readers rely on them.
FIELDS = {"state", "label", "desired", "release", "serving", "pending_release",
          "next_retry_at", "failed_operation", "host", "url", "crashed", "aliases",
          "down_reason", "failed_closed", "route", "fence", "seed", "processes", "drill",
          "last_operation", "certificates", "certificate_failures"}


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich tables as wide as a line needs, so that a test reads whole cells."""
    monkeypatch.setenv("COLUMNS", "220")


@pytest.fixture
def fleet(kw: Keelway, tmp_path: Path) -> Keelway:
    """46 instances of hello: one running, 45 parked, the last of them fenced."""
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a")), "--host", HOST)
    kw.ok("instances", "add", "hello", *PARKED, FENCED, "--parked")
    kw.ok("fence", FENCED, "--reason", "maintenance")
    return kw


def _rows(out: str) -> list[str]:
    """The hosts of a human table's rows, in order, each once."""
    hosts: list[str] = []
    for line in out.splitlines():
        if "│" in line:
            host = line.split("│")[0].strip()
            if host and host not in hosts:
                hosts.append(host)
    return hosts


def test_status_counts_every_instance_then_shows_a_page_and_what_needs_attention(
        fleet: Keelway) -> None:
    human = fleet.ok("status", "hello").out
    assert "hello (v1): 46 instances: 45 parked, 1 running; 1 needs attention" in human
    # Named up front though its row is on page 3.
    assert f"{FENCED} is fenced at generation 1 (maintenance)" in human
    assert _rows(human) == EVERY[:20]
    assert ("instances 1-20 of 46 (page 1 of 3): `keelway status hello --page 2` for the "
            "next, `keelway status hello --all` for every one") in human

    last = fleet.ok("status", "hello", "--page", "3").out
    assert _rows(last) == EVERY[40:]
    assert "instances 41-46 of 46 (page 3 of 3): `keelway status hello --all`" in last
    every = fleet.ok("status", "hello", "--all").out
    assert _rows(every) == EVERY and "page" not in every
    # Without APP, each app is paged the same way.
    assert _rows(fleet.ok("status").out) == EVERY[:20]


def test_status_json_answers_every_instance_whole_unless_a_page_is_asked(
        fleet: Keelway) -> None:
    (app,) = fleet.ok("status", "--json").json()["apps"]
    assert [i["host"] for i in app["instances"]] == EVERY
    assert all(set(i) >= FIELDS for i in app["instances"])
    assert app["summary"] == {"instances": 46, "states": {"running": 1, "parked": 45},
                              "releases": {"v1": 1}, "attention": 1}
    fenced = next(i for i in app["instances"] if i["host"] == FENCED)
    assert fenced["attention"] == ["fenced"] and fenced["fence"]["held"]
    assert app == fleet.ok("status", "hello", "--json", "--all").json()["apps"][0] | {
        "instances": app["instances"]}

    (paged,) = fleet.ok("status", "hello", "--json", "--page", "2").json()["apps"]
    assert [i["host"] for i in paged["instances"]] == EVERY[20:40]
    assert all(set(i) >= FIELDS for i in paged["instances"])
    assert paged["page"] == {"number": 2, "size": 20, "pages": 3, "total": 46}
    assert [i["host"] for i in paged["attention"]] == [FENCED]
    assert paged["summary"] == app["summary"]


def test_instances_list_pages_the_same_way_and_its_json_is_complete(fleet: Keelway) -> None:
    human = fleet.ok("instances", "list", "hello").out
    assert "hello: 46 instances: 45 parked, 1 running; 1 needs attention" in human
    assert f"{FENCED} needs attention: fenced" in human
    assert _rows(human) == EVERY[:20]
    assert "`keelway instances list hello --page 2` for the next" in human
    assert _rows(fleet.ok("instances", "list", "hello", "--page", "2").out) == EVERY[20:40]
    assert _rows(fleet.ok("instances", "list", "hello", "--all").out) == EVERY

    listed = fleet.ok("instances", "list", "hello", "--json").json()
    assert [i["host"] for i in listed["instances"]] == EVERY
    assert {i["host"]: i["state"] for i in listed["instances"]}[HOST] == "running"
    assert listed["summary"]["states"] == {"running": 1, "parked": 45}
    paged = fleet.ok("instances", "list", "hello", "--json", "--page", "3").json()
    assert [i["host"] for i in paged["instances"]] == EVERY[40:]
    assert paged["attention"] == [{"host": FENCED, "attention": ["fenced"]}]


def test_a_page_past_the_end_or_a_bad_page_is_refused_with_what_to_ask_instead(
        fleet: Keelway) -> None:
    past = fleet.run("status", "hello", "--page", "4")
    assert past.code == 1 and "there is no page 4: hello has 3" in past.err
    past = fleet.run("instances", "list", "hello", "--page", "9")
    assert past.code == 1 and "there is no page 9: hello has 3" in past.err
    both = fleet.run("status", "hello", "--all", "--page", "2", "--json")
    assert both.code == 1 and both.json()["error"]["code"] == "bad-request"
    assert fleet.run("status", "hello", "--page", "0").code == 2  # click's usage error
    api = Client(Home(fleet.home).api_socket)
    for query in ("page=0", "page=x", "page=1&per_page=0", "per_page=-3"):
        with pytest.raises(ApiError) as refused:
            api.request("GET", f"/v1/status?app=hello&{query}")
        assert refused.value.code == "bad-request", query
        with pytest.raises(ApiError):
            api.request("GET", f"/v1/apps/hello/instances?{query}")


def test_up_names_a_few_hosts_and_counts_the_rest(fleet: Keelway) -> None:
    log = Home(fleet.home).daemon_log
    fleet.kill_daemon()
    start = log.stat().st_size
    fleet.up()
    said = log.read_text()[start:]
    assert said.count("serving hello: http://") == 10
    assert "… and 36 more instances of 1 app (`keelway status`)" in said
