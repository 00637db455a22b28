"""One rule per name: every layer accepts exactly the set keelway/names.py accepts.

Each property draws strings near the edges of a rule (labels of 63 and 64 characters,
hosts around 253, a trailing newline, a port, a capital letter, a NUL) and asks every
layer that takes the name: the API's body check, the deployer, the router's route
table (constructed, pushed and loaded), the publisher, the home's paths, builds and the
manifest. They must all say what the rule says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keelway import names
from keelway.api.bodies import ConfigBody, DeployBody
from keelway.api.daemon import wire
from keelway.builds.errors import BuildError, ManifestError, SourceError
from keelway.builds.manifest import parse_procfile
from keelway.builds.stage import stage
from keelway.deploy.deployer import Deployer
from keelway.deploy.errors import UserError
from keelway.deploy.publisher import Publisher, table_of
from keelway.home import Home
from keelway.router import route_table as rt
from keelway.runtime.environment import process_env
from keelway.runtime.supervisor import Supervisor
from keelway.store import SqliteStore
from keelway.store.lifecycle import RouteState
from keelway.store.records import Generation, Route
from keelway.testing.clock import FakeClock

EDGES = ["", "\n", ".", "..", ":80", " ", "A", "_", "-", "\x00", "é", "/", "\r\n"]
_label = st.text(alphabet="abz09-", min_size=0, max_size=65)
_dns_like = st.lists(_label, min_size=1, max_size=5).map(".".join)
_long = st.lists(st.text(alphabet="ab", min_size=61, max_size=64), min_size=3,
                 max_size=5).map(".".join)
_decorated = st.tuples(st.sampled_from(EDGES), _dns_like, st.sampled_from(EDGES)).map(
    "".join)
HOSTS = st.one_of(_dns_like, _long, _decorated, st.text(max_size=12))
LABELS = st.one_of(_label, st.tuples(st.sampled_from(EDGES), _label,
                                     st.sampled_from(EDGES)).map("".join),
                   st.text(max_size=8))
CONFIG_NAMES = st.one_of(
    st.text(alphabet="AZaz09_", max_size=12),
    st.tuples(st.sampled_from([*EDGES, "KEELWAY_", "PORT", "DATABASE_URL"]),
              st.text(alphabet="AZ_9", max_size=6), st.sampled_from(EDGES)).map("".join),
    st.text(alphabet="A", min_size=250, max_size=260),
    st.text(max_size=8),
)
PROPERTY = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def _accepts(check: object, *args: object) -> bool:
    try:
        check(*args)  # type: ignore[operator]
    except (names.InvalidName, UserError, ValueError, msgspec.ValidationError):
        return False
    return True


def _deployer(tmp_path: Path) -> Deployer:
    store = SqliteStore(tmp_path / "keelway.db", FakeClock())
    home = Home(tmp_path / "home")
    clock = FakeClock()

    async def on_exit(_gen: Generation, _code: int | None) -> None:
        return None

    return wire(store, home, Supervisor(store, home, clock, on_exit),
                Publisher(store, home.router_socket), clock, "test").deployer


def test_every_layer_accepts_exactly_the_hosts_the_host_rule_accepts(tmp_path: Path) -> None:
    deployer = _deployer(tmp_path)
    home = Home(tmp_path / "home")

    @PROPERTY
    @given(HOSTS)
    def check(host: str) -> None:
        ok = names.HOST.accepts(host)
        body = json.dumps({"app": "hello", "source": "/x", "hosts": [host]}).encode()
        assert _accepts(lambda: msgspec.json.decode(body, type=DeployBody).check()) == ok
        assert _accepts(deployer.validate_hosts, "hello", [host]) == ok
        gated = rt.RouteEntry(rt.Handling.GATED)
        assert _accepts(rt.RouteTable, 1, {host: gated}) == ok
        wire = json.dumps({"version": 1, "routes": {host: {"state": "gated"}}}).encode()
        assert _accepts(rt.decode_table, wire) == ok
        table, refused = rt.accept(rt.decode_offer(wire))
        assert (host in table.routes, host not in refused) == (ok, ok)
        row = Route(host, host, RouteState.SERVING, 4000, 1, 1)
        table, refused = table_of([row], 1)
        assert (host in table.routes, host not in refused) == (ok, ok)
        if ok:
            # One path component under the home; and every spelling of it in a Host
            # header is looked up as it.
            for path in (home.data_dir(host), home.current_link(host), home.log_dir(host)):
                assert path.name == host and path.parent.parent in (home.root,
                                                                    home.root / "logs")
            assert home.env_file(host).name == f"{host}.env"
            raw = host.encode()
            for spelling in (raw, raw.upper(), raw + b":8080", raw + b".", raw + b".:80"):
                assert rt.host_key(spelling) == raw

    check()


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=24))
def test_a_host_header_maps_onto_a_route_key_only_as_a_valid_host(raw: bytes) -> None:
    key = rt.host_key(raw)
    try:
        text = key.decode("ascii")
    except UnicodeDecodeError:
        return  # never a key: the rule is ASCII only
    if names.HOST.accepts(text):
        # What the header names, lowercased, without a port or trailing dots.
        assert raw.lower().split(b":")[0].rstrip(b".") == key


def test_every_layer_accepts_exactly_the_app_names_the_app_rule_accepts(
    tmp_path: Path,
) -> None:
    deployer = _deployer(tmp_path)
    builds = tmp_path / "builds"

    @PROPERTY
    @given(LABELS)
    def check(app: str) -> None:
        ok = names.APP.accepts(app)
        body = json.dumps({"app": app, "source": "/x"}).encode()
        assert _accepts(lambda: msgspec.json.decode(body, type=DeployBody).check()) == ok
        with pytest.raises(BuildError) as info:
            stage(tmp_path / "no-such-source", builds_dir=builds, app=app)
        assert isinstance(info.value, SourceError)
        assert ("app name" not in str(info.value)) == ok
        if ok:
            # The host a deploy without --host serves passes the host rule.
            assert names.HOST.accepts(f"{app}.localhost")
            assert _accepts(deployer.validate_hosts, app, [f"{app}.localhost"])

    check()


@PROPERTY
@given(LABELS)
def test_the_procfile_accepts_exactly_the_process_names_the_service_rule_accepts(
    name: str,
) -> None:
    try:
        parsed = parse_procfile(f"{name}: run it\n")
    except ManifestError:
        parsed = {}
    assert (parsed == {name: "run it"}) == names.SERVICE.accepts(name)


@PROPERTY
@given(CONFIG_NAMES)
def test_the_api_accepts_exactly_the_config_names_the_rule_accepts(name: str) -> None:
    ok = names.CONFIG_NAME.accepts(name)
    settable = ok and not names.reserved_config_name(name)
    assert _accepts(ConfigBody(set={name: "v"}).changes) == settable
    assert _accepts(ConfigBody(unset=[name]).changes) == ok
    assert _accepts(names.check_config, {name: "v"}) == ok


def test_every_name_keelway_sets_over_the_apps_config_is_reserved(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    home.ensure()

    def env(config: dict[str, str]) -> dict[str, str]:
        return process_env(home=home, app="hello", instance="one.test", service="web",
                           release=1, generation=1, port=4000, config=config,
                           build_path=tmp_path)

    every = env({})
    overridden = {k for k, v in env({k: "from config" for k in every}).items()
                  if v != "from config"}
    assert overridden and all(names.reserved_config_name(k) for k in overridden)


_near_the_limit = st.tuples(st.integers(-3, 3), st.sampled_from(["x", "é", "€"])).map(
    lambda t: t[1] * ((names.MAX_CONFIG_VALUE_BYTES + t[0]) // len(t[1].encode()) + 1))
VALUES = st.one_of(st.text(max_size=40), st.text(alphabet="\x00ab\n", max_size=6),
                   _near_the_limit)


@PROPERTY
@given(VALUES)
def test_the_api_accepts_exactly_the_config_values_the_rule_accepts(value: str) -> None:
    ok = ("\x00" not in value and len(value.encode("utf-8", "surrogatepass"))
          <= names.MAX_CONFIG_VALUE_BYTES and not any(0xD800 <= ord(c) <= 0xDFFF
                                                       for c in value))
    assert _accepts(names.check_config_value, "K", value) == ok
    assert _accepts(ConfigBody(set={"K": value}).changes) == ok


def test_a_nul_in_a_config_value_is_refused_naming_the_var_and_never_the_value() -> None:
    with pytest.raises(names.InvalidName) as info:
        ConfigBody(set={"SECRET": "hunter2\x00tail"}).changes()
    assert "SECRET" in info.value.message and "NUL" in info.value.message
    assert "hunter2" not in info.value.message + info.value.hint


def test_the_largest_config_the_rules_accept_reaches_a_process_unchanged(
    tmp_path: Path,
) -> None:
    """The limits are there so that exec never fails: the biggest value and the biggest
    config they allow, with newlines and non-ASCII text in them, arrive byte for byte."""
    big = "é\n" + "x" * (names.MAX_CONFIG_VALUE_BYTES - 3)
    assert len(big.encode()) == names.MAX_CONFIG_VALUE_BYTES
    config = {f"V{i}": big for i in range(names.MAX_CONFIG_BYTES // (len(big.encode()) + 5))}
    names.check_config(config)
    with pytest.raises(names.InvalidName, match="over the limit"):
        names.check_config({**config, "ONE_MORE": big})
    env = {**config, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    out = subprocess.run(
        [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
        env=env, capture_output=True, check=True, text=True, cwd=tmp_path).stdout
    seen = json.loads(out)
    assert all(seen[k] == v for k, v in config.items())


SNAP = "20261201T120102123456Z-9f3a"


@pytest.mark.parametrize(("source", "parsed"), [
    (SNAP, (None, SNAP)),
    (f"one.test/{SNAP}", ("one.test", SNAP)),
    (f"./{SNAP}", None),
    (f"/srv/{SNAP}", None),
    (f"a/b/{SNAP}", None),
    ("seed.sqlite3", None),
    ("/tmp/seed.sqlite3", None),
])
def test_a_seed_source_is_a_snapshot_only_when_written_as_one(
        source: str, parsed: tuple[str | None, str] | None) -> None:
    assert names.seed_snapshot(source) == parsed


def test_a_seed_snapshot_under_a_bad_host_is_refused() -> None:
    with pytest.raises(names.InvalidName):
        names.seed_snapshot(f"Bad_Host/{SNAP}")
