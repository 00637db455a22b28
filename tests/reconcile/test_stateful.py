"""Random sequences of operations and crashes; SPEC §5 must hold after every step.

Each rule drives the real CLI against a real daemon. `crash` SIGKILLs the control plane
at a random moment of a random operation, then starts it again (boot reconciliation);
`crash_app` SIGKILLs the web's leader, as an app crash. Every web daemonizes a
grandchild (fork, setsid, fork), so invariant 5's scan of the home's cgroups and of
/proc for its marker has detached descendants to find after every step.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from keelway.runtime import process
from tests.deploy.apps import daemonizing, hello
from tests.e2e.harness import Keelway, free_port, wait_until
from tests.invariants import violations

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

OPERATIONS = ("deploy-a", "deploy-b", "deploy-broken", "restart", "config", "rollback")


class Operations(RuleBasedStateMachine):
    kw: Keelway
    apps: dict[str, Path]

    @initialize()
    def start(self) -> None:
        root = Path(tempfile.mkdtemp(prefix="kws-", dir="/tmp"))
        self.kw = Keelway(home=root / "h", http_port=free_port())
        self.apps = {
            "a": daemonizing(root, "a", settle="0.2s"),
            "b": daemonizing(root, "b", settle="0.2s", greeting="howdy from"),
            "broken": hello(root, "broken", web_cmd="python3 -c 'raise SystemExit(4)'"),
        }
        self.kw.up()
        self.kw.ok("deploy", "hello", str(self.apps["a"]), "--host", "one.test")

    def teardown(self) -> None:
        if hasattr(self, "kw"):
            self.kw.teardown()

    def _run(self, operation: str) -> int:
        kw = self.kw
        match operation:
            case "deploy-a" | "deploy-b" | "deploy-broken":
                return kw.run("deploy", "hello", str(self.apps[operation[7:]])).code
            case "restart":
                return kw.run("restart", "hello").code
            case "config":
                return kw.run("config", "hello", "set", f"N={time.monotonic_ns()}").code
            case "rollback":
                return kw.run("rollback", "hello").code
        raise AssertionError(operation)

    @rule(operation=st.sampled_from(OPERATIONS))
    def operate(self, operation: str) -> None:
        self._run(operation)

    @rule(operation=st.sampled_from(OPERATIONS), after_s=st.floats(0.0, 1.5))
    def crash(self, operation: str, after_s: float) -> None:
        pid = self.kw.daemon_pid
        assert pid is not None
        worker = threading.Thread(target=self._run, args=(operation,))
        worker.start()
        time.sleep(after_s)
        os.kill(pid, signal.SIGKILL)
        worker.join(60)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stat = process.read_stat(pid)
            if stat is None or stat.state == "Z":
                break
            time.sleep(0.02)
        self.kw.up()

    @rule()
    def reconcile(self) -> None:
        self.kw.ok("reconcile")

    @rule()
    def crash_app(self) -> None:
        """SIGKILL the ACTIVE web's leader; return once the supervisor has removed its
        tree and either restarted it or is waiting out a slow (a minute or more) retry,
        so the invariants are checked on a settled system."""
        inst = self.kw.ok("status", "--json").json()["apps"][0]["instances"][0]
        web = next((p for p in inst["processes"] if p["service"] == "web" and p["active"]
                    and p["state"] != "gone"), None)
        if web is None or inst["state"] != "running":
            return
        os.kill(web["pid"], signal.SIGKILL)

        def settled() -> bool:
            now = self.kw.ok("status", "--json").json()["apps"][0]["instances"][0]
            if any(c["service"] == "web" and c["retry_at"] - time.time() > 30
                   for c in now["crashed"]):
                return True
            return any(p["service"] == "web" and p["active"] and p["id"] != web["id"]
                       and p["state"] in ("running", "ready") for p in now["processes"])

        assert wait_until(settled, 30, 0.1)

    @invariant()
    def spec_invariants_hold(self) -> None:
        if hasattr(self, "kw"):
            assert violations(self.kw.home) == []


TestOperations = Operations.TestCase
TestOperations.settings = settings(
    max_examples=int(os.environ.get("KEELWAY_STATEFUL_EXAMPLES", "5")),
    stateful_step_count=8, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
