"""Starting one generation of one service of one instance, as journaled steps.

Shared by every path that starts something (deploy, restart, config, rollback, start,
wake, crash restarts): journal the generation and its port claim, re-check the
attempt's gate at the spawn, spawn, record the pid, wait for ready. Each effect sits
between a step written `pending` (naming the candidate in `after_gen`) and the step's
outcome, so the reconciler can always find the candidate of an interrupted start. The
release command is a generation of its own, started and attended the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from keelway import failpoints
from keelway.builds.manifest import ServiceKind, ServiceSpec
from keelway.deploy.steps import Done, Failed, Steps
from keelway.deploy.targets import Target
from keelway.home import Home
from keelway.journal import StepKind
from keelway.runtime.environment import process_env
from keelway.runtime.notify import NotifyListener
from keelway.runtime.ports import pick_free_port
from keelway.runtime.supervisor import ReadyOutcome, Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState
from keelway.store.records import Generation

failpoints.declare("plan.before", "plan.after", "ready.after")

RELEASE_TIMEOUT_S = 600.0
RELEASE_SERVICE = "release"
# The release command is no service of the manifest, so it has no stop_grace of its own;
# one still running past its timeout has had 10 minutes already: SIGKILL after 5 s.
RELEASE_STOP_GRACE_S = 5.0

Gate = Callable[[str], None]


def _open_gate(_point: str) -> None:
    pass


def layered_config(store: Store, instance: str, app_config: dict[str, str]) -> dict[str, str]:
    """What a process of `instance` gets as config: its instance's own over its app's."""
    inst = store.instances.get_instance(instance)
    return {**app_config, **inst.config} if inst is not None else dict(app_config)


@dataclass(frozen=True)
class StartFailed:
    """An expected outcome, returned as a value: the candidate did not start, get ready
    or (the release command) finish; its step is journaled failed."""

    service: str
    reason: str
    generation: Generation | None

    def __str__(self) -> str:
        return f"{self.service} {self.reason}"


async def start_generation(
    *, store: Store, home: Home, supervisor: Supervisor, op_id: int, instance: str,
    target: Target, spec: ServiceSpec, before_gen: int | None, gate: Gate = _open_gate,
) -> Generation | StartFailed:
    """Spawn a candidate and wait until it is ready, or say why not (StartFailed).

    A failed candidate is left to the reconciler, which removes every candidate that
    ACTIVE does not name: one removal path for failures and crashes alike.
    `gate` is called before the spawn and again at it; it raises to refuse (a
    superseded attempt spawns nothing).
    """
    gate("before the spawn")
    port = (pick_free_port(store.local.port_claimed) if spec.kind is ServiceKind.WEB
            else None)
    failpoints.hit("plan.before")
    gen = store.plan_generation(
        app=target.app, instance=instance, service=spec.name, release=target.release,
        build_digest=target.build_digest, op_id=op_id, port=port,
    )
    failpoints.hit("plan.after")
    home.data_dir(instance).mkdir(parents=True, exist_ok=True)
    env = process_env(
        home=home, app=target.app, instance=instance, service=spec.name,
        release=target.release, generation=gen.id, port=port,
        config=layered_config(store, instance, target.config), build_path=target.build_path,
    )
    steps = Steps(store, op_id)
    health = spec.health if spec.kind is ServiceKind.WEB else None
    notify = NotifyListener(home.notify_socket(gen.id))
    notify.open()
    try:
        async def spawn() -> Done:
            nonlocal gen
            gate("at the spawn")
            gen = await supervisor.spawn(gen, spec.command, target.build_path, env,
                                         spec.limits)
            return Done(f"pid {store.local.presence(gen.id).pid}")

        await steps.run(StepKind.SPAWN, spawn, service=spec.name, before_gen=before_gen,
                        after_gen=gen.id,
                        detail=f"v{target.release}" + (f" port {port}" if port else ""))

        async def ready() -> Done | Failed:
            nonlocal gen
            readiness = await supervisor.wait_ready(gen, health, spec.ready_timeout_s,
                                                    notify.ready, host=instance)
            match readiness.outcome:
                case ReadyOutcome.EXITED:
                    return Failed(readiness.said)
                case ReadyOutcome.TIMED_OUT:
                    return Failed(f"was not ready within {spec.ready_timeout_s:g}s: "
                                  f"{readiness.said}")
                case ReadyOutcome.READY:
                    if (now := store.generations.get_generation(
                        gen.id)) and now.state is GenState.RUNNING:
                        gen = store.generations.set_generation_state(now, GenState.READY)
                    return Done(readiness.said)
                case unknown:
                    assert_never(unknown)

        failed = await steps.run(StepKind.READY, ready, service=spec.name, after_gen=gen.id,
                                 after=("ready.after",))
    finally:
        notify.close()
    if failed is not None:
        return StartFailed(spec.name, failed.reason,
                           store.generations.get_generation(gen.id) or gen)
    return gen


async def run_release_command(
    *, store: Store, home: Home, supervisor: Supervisor, op_id: int, instance: str,
    target: Target, gate: Gate = _open_gate, timeout_s: float = RELEASE_TIMEOUT_S,
) -> StartFailed | None:
    """Run the manifest's one-shot `release` command to completion; None when it
    exited 0, else why not.

    It is a generation like any other (journaled, logged, proven gone), so a crash while
    it runs leaves a candidate the reconciler removes.
    """
    command = target.manifest.release_command
    assert command is not None
    gate("before the release command")
    gen = store.plan_generation(
        app=target.app, instance=instance, service=RELEASE_SERVICE, release=target.release,
        build_digest=target.build_digest, op_id=op_id, port=None,
    )
    home.data_dir(instance).mkdir(parents=True, exist_ok=True)
    env = process_env(
        home=home, app=target.app, instance=instance, service=RELEASE_SERVICE,
        release=target.release, generation=gen.id, port=None,
        config=layered_config(store, instance, target.config), build_path=target.build_path,
    )

    async def release() -> Done | Failed:
        nonlocal gen
        gen = await supervisor.spawn(gen, command, target.build_path, env)
        code = await supervisor.wait_exit(gen, timeout_s, RELEASE_STOP_GRACE_S)
        if code == 0:
            return Done()
        return Failed("release command " + ("did not finish in time" if code is None
                                            else f"exited with code {code}"))

    failed = await Steps(store, op_id).run(StepKind.RELEASE_COMMAND, release,
                                           service=RELEASE_SERVICE, after_gen=gen.id,
                                           detail=command)
    if failed is not None:
        return StartFailed(RELEASE_SERVICE, failed.reason.removeprefix("release "),
                           store.generations.get_generation(gen.id))
    return None


