"""`--dry-run` through the real CLI: each operation prints the plan the runner would
run, as lines or as --json, and nothing is journaled, stopped or started (a run's
arguments never leave the CLI: only its program's name is planned)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from keelway.journal import StepKind
from tests.e2e.harness import EXAMPLE, Keelway

pytestmark = pytest.mark.slow

HOST = "one.test"


def _ops(kw: Keelway) -> list[dict[str, object]]:
    return kw.ok("ops", "hello", "--json").json()["operations"]  # type: ignore[no-any-return]


def test_every_dry_run_prints_the_runners_plan_and_changes_nothing(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    kw.ok("config", "hello", "set", "A=1")
    before, pids = _ops(kw), kw.app_pids()

    park = kw.ok("park", HOST, "--dry-run").out.splitlines()
    assert park[0] == f"park {HOST}:"
    assert park[1].startswith(f"  1. park: {HOST} PARKED and its route parked")
    assert any(": stop web generation" in line for line in park)
    stop = kw.ok("stop", "hello", "--dry-run", "--json").json()
    assert stop["plans"][0]["steps"][0]["step"] == "out-of-service"
    assert "nothing to do (running already)" in kw.ok("wake", HOST, "--dry-run").out
    assert kw.ok("start", "hello", "--dry-run").out.startswith(f"start {HOST}:")
    restart = kw.ok("restart", "hello", "--dry-run").out
    assert "attempt v2" in restart and "on failure: respawn what it replaced" in restart
    rollback = kw.ok("rollback", "hello", "--dry-run", "--json").json()
    assert rollback["dry_run"] is True
    assert rollback["plans"][0]["op"] == "rollback"
    assert "attempt v3" in kw.ok("config", "hello", "set", "B=2", "--dry-run").out
    run = kw.ok("run", "hello", "--dry-run", "--", "python3", "-c", "s3cr3t").out
    assert f"run {HOST}:" in run and "spawn python3 in v2" in run and "s3cr3t" not in run

    assert _ops(kw) == before and kw.app_pids() == pids
    assert kw.get(HOST)[0] == 200


def test_a_dry_run_refuses_what_the_run_would_refuse(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    kw.ok("fence", HOST)
    refused = kw.run("start", "hello", "--dry-run")
    assert refused.code != 0 and "it cannot start" in refused.err
    assert kw.run("park", "nosuch.test", "--dry-run").code != 0


# -- deploy: the build it would stage, then each instance's plan ----------------------


def _changed_example(tmp_path: Path) -> Path:
    """The example app with one byte more: a source whose build is not staged yet."""
    source = tmp_path / "src"
    shutil.copytree(EXAMPLE, source)
    with (source / "web.py").open("a") as web:
        web.write("\n")
    return source


def _home_files(kw: Keelway) -> list[str]:
    """Every path in the home but the logs (which the daemon appends to as it pleases)."""
    found = (Path(d, n).relative_to(kw.home) for d, ds, fs in os.walk(kw.home)
             for n in (*ds, *fs))
    return sorted(str(rel) for rel in found if rel.parts[0] != "logs")


def test_a_deploys_dry_run_prints_its_build_and_each_instances_plan_and_changes_nothing(
        kw: Keelway, tmp_path: Path) -> None:
    kw.replicate = False  # a replicator writes its files in the home on its own schedule
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST, "--host", "two.test")
    kw.ok("park", "two.test")
    source = _changed_example(tmp_path)
    before = (kw.store_dump(), _ops(kw), kw.app_pids(), _home_files(kw))

    said = kw.ok("deploy", "hello", str(source), "--dry-run", "--host", "three.test").out
    lines = said.splitlines()
    assert re.fullmatch(rf"build [0-9a-f]{{12}} of directory {source}: would be built "
                        r"\(nothing to install\)", lines[0])
    assert lines[1].startswith("release v2 of hello: build ")
    assert lines[2:4] == [f"deploy {HOST}:", f"  1. lay-down: lay {HOST} down whole (data "
                          "dir, databases, env file)"]
    assert "start web (replacing generation" in lines[4]
    assert lines[5:7] == ["deploy two.test:", "  1. defer: two.test is parked: v2 is left "
                          "pending for its next wake"]
    assert lines[7:9] == ["would add instance three.test", "deploy three.test:"]
    reused = kw.ok("deploy", "hello", str(EXAMPLE), "--dry-run", "--json").json()
    assert reused["dry_run"] is True and reused["build"]["reused"] is True
    assert [p["instance"] for p in reused["plans"]] == [HOST, "two.test"]
    held = kw.ok("deploy", "hello", str(source), "--dry-run", "--mode", "hold").out
    assert "services web (web, hold), worker (worker, hold)" in held

    assert (kw.store_dump(), _ops(kw), kw.app_pids(), _home_files(kw)) == before


# What an attempt journals for each part its dry-run line lists (by StepKind, of the
# part's service if it names one): the table this test holds the line to.
_ATTEMPT_PARTS: list[tuple[str, tuple[StepKind, ...]]] = [
    (r"start (\S+)( \(replacing generation \d+\))?", (StepKind.SPAWN, StepKind.READY)),
    (r"stop (\S+) generation \d+ \(hold mode\)", (StepKind.STOP,)),
    (r"withdraw the route \(holding\)", (StepKind.WITHDRAW,)),
    (r"record the execution evidence", (StepKind.HOLD_EXEC,)),
    (r"check the schedule", ()),
    (r"run the release command", (StepKind.RELEASE_COMMAND,)),
    (r"activate", (StepKind.ACTIVATE,)),
    (r"publish", (StepKind.PUBLISH,)),
    (r"settle \S+s", (StepKind.SETTLE,)),
    (r"verify", ()),
    (r"mark the build good", ()),
    (r"retire (\S+) generation \d+", (StepKind.RETIRE,)),
]


def _promised(plan: dict[str, Any]) -> list[str]:
    """The journal a dry-run plan promises, as `keelway ops` names each step: a planned
    step's own, or for the attempt, the steps each part of its line journals."""
    names = []
    for step in plan["steps"]:
        kind = StepKind(step["step"])
        if step["describe"].startswith("attempt "):
            listed = step["describe"].split("): ", 1)[1].split("; on failure:")[0]
            for part in listed.split(", "):
                match = next((m, kinds) for pattern, kinds in _ATTEMPT_PARTS
                             if (m := re.fullmatch(pattern, part)))
                service = match[0].group(1) if match[0].groups() else None
                names += [k.label(service) for k in match[1]]
        else:
            names.append(kind.label(step.get("service")))
    return names


def test_a_deploys_dry_run_lines_are_what_the_deploy_then_journals(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST, "--host", "two.test")
    kw.ok("park", "two.test")
    source = _changed_example(tmp_path)
    dry = kw.ok("deploy", "hello", str(source), "--dry-run", "--host", "three.test",
                "--json").json()
    last = max(op["id"] for op in _ops(kw))
    done = kw.ok("deploy", "hello", str(source), "--host", "three.test", "--json").json()
    assert done["build"] == dry["build"]["digest"]
    ran = {op["instance"]: op for op in _ops(kw) if op["id"] > last and op["kind"] == "deploy"}
    for plan in dry["plans"]:
        # The replication hook's steps follow any operation's plan; they are its own.
        journal = [s["name"] for s in ran[plan["instance"]]["steps"]
                   if s["service"] != "replica"]
        assert journal == _promised(plan), plan["instance"]
    assert {i["release"] for i in done["instances"]} == {f"v{dry['release']['number']}"}


def test_a_deploys_dry_run_refuses_what_the_deploy_refuses_and_changes_nothing(
        kw: Keelway, tmp_path: Path) -> None:
    kw.replicate = False  # as above: only the home's files that a deploy would write
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    broken = _changed_example(tmp_path)
    (broken / "keelway.toml").write_text("[services.web]\nmode = 'sideways'\n")
    before = (kw.store_dump(), _ops(kw), _home_files(kw))
    refusals = {"sideways": [str(broken)], "does not exist": [str(tmp_path / "nowhere")],
                "x_y.test": [str(EXAMPLE), "--host", "x_y.test"]}
    for why, args in refusals.items():
        dry = kw.run("deploy", "hello", *args, "--dry-run")
        real = kw.run("deploy", "hello", *args)
        # The deploy streams its progress first; its error is the dry run's.
        assert dry.code == real.code != 0 and real.err.endswith(dry.err), args
        assert why in dry.err
    bad = kw.run("deploy", "Bad_App", str(EXAMPLE), "--dry-run")
    assert bad.code != 0 and bad.err == kw.run("deploy", "Bad_App", str(EXAMPLE)).err
    assert "Bad_App" in bad.err
    assert (kw.store_dump(), _ops(kw), _home_files(kw)) == before
    kw.ok("fence", HOST)
    refused = kw.run("deploy", "hello", str(EXAMPLE), "--dry-run")
    assert refused.code != 0 and f"{HOST} is fenced" in refused.err
    assert "it cannot deploy" in refused.err
