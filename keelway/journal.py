"""The journal's vocabulary: the kinds of operations and steps, causes, and inhibitions.

Deploy, the reconciler and the store speak these values, never free strings: the
journal stores an enum's value, and reading it back refuses a word nobody defined, so
a step kind cannot drift apart between the writer and the reader of a crash's journal.
A leaf module (no keelway imports), so the store can type its records with it.

Values are stable on disk: a member may be added, never renamed (a renamed value would
strand the journals already written; that takes a migration in keelway/store/schema.py).
"""

from __future__ import annotations

import enum
from typing import assert_never

# The service name of an instance's replicator (keelway/data/replicas.py), reserved in
# every Procfile (keelway/builds/manifest.py): its generation is named by its own
# record, not by ACTIVE, and the reconciler keeps one alive per running instance.
REPLICA = "replica"


class OpKind(enum.StrEnum):
    """What an operation is; an instance's latest one decides what convergence does."""

    DEPLOY = "deploy"
    CONFIG = "config"
    ROLLBACK = "rollback"
    RESTART = "restart"
    STOP = "stop"
    START = "start"
    # The reconciler's RESTART_ACTIVE: ACTIVE respawned after a control-plane restart.
    RECOVER = "recover"
    # A published generation that crashed, restarted after its backoff.
    RESTART_CRASHED = "restart-crashed"
    # Scale to zero and back (keelway/deploy/parking.py).
    PARK = "park"
    WAKE = "wake"
    # `keelway run`: a one-off process in the instance's ACTIVE build. Never an
    # instance's latest operation (it changes nothing convergence reads).
    RUN = "run"
    # `instances add`: the new instances' files laid down (journaled on the first one).
    ADD_INSTANCES = "add-instances"
    # `instances remove`: one instance withdrawn, stopped and forgotten.
    REMOVE_INSTANCE = "remove-instance"
    # `apps destroy`: every instance removed, then the app's builds and records.
    DESTROY = "destroy"
    # `seed import` / `seed rollback` (keelway/deploy/seeding.py): the import journal
    # (keelway/store/imports.py) is what convergence of these reads, not their steps.
    SEED_IMPORT = "seed-import"
    SEED_ROLLBACK = "seed-rollback"
    # `db restore`: an instance's database replaced by a verified snapshot.
    RESTORE = "restore"
    # The reconciler's START_REPLICA: an awake instance's replicator (re)started
    # (keelway/data/replicas.py), e.g. after it died.
    REPLICATE = "replicate"
    # `db restore H --from-replica`: the database swapped for a verified replica restore.
    RESTORE_REPLICA = "restore-replica"
    # A scheduled job's run (keelway/deploy/jobs.py): a one-off process like RUN, keyed
    # by (job, scheduled time) on its instance, so no run of a schedule starts twice.
    JOB = "job"
    # A certificate for one of an instance's names from the ACME CA (keelway/deploy/
    # certify.py): never its instance's latest (it changes nothing convergence reads);
    # the order it carries is kept in files, so a crash ends it and the next one for
    # the name resumes that order rather than placing another.
    CERTIFY = "certify"
    # The frozen tier (keelway/deploy/freezing.py): every process of an idle instance
    # stopped in place, memory kept, its route `frozen`; a wake thaws it.
    FREEZE = "freeze"

    @property
    def one_off(self) -> bool:
        """A one-off operation (a process, a certificate): never its instance's latest
        (it changes nothing convergence reads), ended by the boot pass if a crash cut
        it short."""
        return self in ONE_OFFS

    @property
    def releases(self) -> bool:
        """It runs a new release: a hold-mode one that executed is never fallen back."""
        match self:
            case OpKind.DEPLOY | OpKind.ROLLBACK:
                return True
            case (OpKind.CONFIG | OpKind.RESTART | OpKind.STOP | OpKind.START
                  | OpKind.RECOVER | OpKind.RESTART_CRASHED | OpKind.PARK | OpKind.WAKE
                  | OpKind.RUN | OpKind.ADD_INSTANCES | OpKind.REMOVE_INSTANCE
                  | OpKind.DESTROY | OpKind.SEED_IMPORT | OpKind.SEED_ROLLBACK
                  | OpKind.RESTORE | OpKind.REPLICATE | OpKind.RESTORE_REPLICA
                  | OpKind.JOB | OpKind.CERTIFY | OpKind.FREEZE):
                return False
            case _:
                assert_never(self)

    @property
    def ends_with_the_box(self) -> bool:
        """Its effects are processes and routes, which a reboot ends anyway: its steps
        that end with the box commit without their own fsync (keelway/durable.py). The
        data plane's, a one-off run's and the removals' outlive a reboot."""
        match self:
            case (OpKind.DEPLOY | OpKind.CONFIG | OpKind.ROLLBACK | OpKind.RESTART
                  | OpKind.STOP | OpKind.START | OpKind.RECOVER | OpKind.RESTART_CRASHED
                  | OpKind.PARK | OpKind.WAKE | OpKind.REPLICATE | OpKind.FREEZE):
                return True
            # A job's run begins durably: after a power loss, a run that started is
            # never found unjournaled and started again.
            case (OpKind.RUN | OpKind.ADD_INSTANCES | OpKind.REMOVE_INSTANCE
                  | OpKind.DESTROY | OpKind.SEED_IMPORT | OpKind.SEED_ROLLBACK
                  | OpKind.RESTORE | OpKind.RESTORE_REPLICA | OpKind.JOB
                  | OpKind.CERTIFY):
                return False
            case _:
                assert_never(self)


ONE_OFFS: frozenset[OpKind] = frozenset({OpKind.RUN, OpKind.JOB, OpKind.CERTIFY})


class StepKind(enum.StrEnum):
    """One journaled step of an operation; `label` is how `keelway ops` shows it."""

    # An attempt's first step before its LAY_DOWN laid the instance down whole (issue 17):
    # no longer written, still read in old journals.
    INSTANCE_KEY = "instance-key"
    RELEASE_COMMAND = "release-command"
    SPAWN = "spawn"
    READY = "ready"
    WITHDRAW = "withdraw"
    STOP = "stop"
    # Written before a hold-mode release execs anything of its new build (its release
    # command or its first process): the execution evidence convergence reads.
    HOLD_EXEC = "hold-exec"
    ACTIVATE = "activate"
    PUBLISH = "publish"
    SETTLE = "settle"
    RETIRE = "retire"
    # A failed attempt's candidates stopped because nothing could replace them.
    STOP_NO_FALLBACK = "stop-no-fallback"
    # A hold-mode release that executed and failed: everything of the instance stops.
    STOP_DOWN = "stop-down"
    # A failed step of this kind records an exception the operation itself raised.
    FAULT = "fault"
    # `stop`: the instance STOPPED and its route gated in one write, then published;
    # once it succeeded, convergence stops whatever ACTIVE still runs.
    OUT_OF_SERVICE = "out-of-service"
    # `start`: the instance RUNNING again; once written, convergence restarts ACTIVE.
    IN_SERVICE = "in-service"
    # The instance parked and its route parked, in one write (before anything stops).
    PARK = "park"
    # The instance running again (before anything of it is spawned).
    WAKE = "wake"
    # A one-off process (`keelway run`) spawned, then its exit (or its stop, the
    # terminal having gone away).
    RUN = "run"
    RUN_EXIT = "run-exit"
    # Instances' data dirs, empty databases and env files with minted keys
    # (keelway/deploy/instances.py `lay_down`): `instances add`'s batch, and every
    # attempt's and wake's first step.
    LAY_DOWN = "lay-down"
    # An instance's data dir and env file removed (`--purge-data`).
    PURGE_DATA = "purge-data"
    # An instance's (or an app's) records deleted, so the name can be used again.
    FORGET = "forget"
    # An app's staged builds removed from disk (`apps destroy`).
    REMOVE_BUILDS = "remove-builds"

    # A rollout reached a parked instance: the release is left pending for its next
    # wake (which runs it as an attempt), and nothing of it starts now.
    DEFER = "defer"

    # Seed import and rollback (SPEC §4 Seed import), each an effect of its own: the
    # seed's copy stored; the journal row with the gate closed; the fence; the seeded
    # database and its marker laid down; the import's key (and database) in the env
    # file; the gate open; then the rollback's gate closed again, the key retired, the
    # import's local data removed, the original route back, the fence lifted, the
    # seed's copy and the replica deleted, the row deleted, the record swapped.
    SEED_STORE = "seed-store"
    SEED_JOURNAL = "seed-journal"
    SEED_FENCE = "seed-fence"
    SEED_LAY_DOWN = "seed-lay-down"
    SEED_KEY = "seed-key"
    SEED_OPEN = "seed-open"
    SEED_CLOSE = "seed-close"
    SEED_RETIRE_KEY = "seed-retire-key"
    SEED_REMOVE_DATA = "seed-remove-data"
    SEED_RESTORE = "seed-restore"
    SEED_UNFENCE = "seed-unfence"
    SEED_DELETE_COPY = "seed-delete-copy"
    SEED_DELETE_REPLICA = "seed-delete-replica"
    SEED_FORGET = "seed-forget"
    SEED_RECORD = "seed-record"
    # `db restore`: the route held (requests wait) before the instance stops.
    HOLD_ROUTE = "hold-route"
    # `db restore` (a snapshot or the replica): the verified copy committed and swapped
    # in for the database (its -wal/-shm with it, the old one kept); once begun, boot
    # finishes the swap (keelway/data/swap.py). The one swap step written.
    SWAP_DB = "swap-db"
    # The instance's replicator (keelway/data/replicas.py): spawned, or synced and
    # stopped (proven gone).
    REPLICA_START = "replica-start"
    REPLICA_STOP = "replica-stop"
    # Written by a replica restore before SWAP_DB was the one swap; no longer written,
    # read as SWAP_DB (old journals must still read).
    SWAP_DATABASE = "swap-database"
    # `--purge-data`, after the data dir: the instance's replica in the object store
    # (its imports' and the ones a restore set aside too), then its snapshots.
    PURGE_REPLICA = "purge-replica"
    PURGE_SNAPSHOTS = "purge-snapshots"
    # `db restore`: the replica set aside and a new one begun from the restored file
    # (keelway/deploy/restore.py).
    REPLICA_RESET = "replica-reset"
    # A certificate by ACME (keelway/deploy/certify.py): the order placed (or the one a
    # crash left found again), its challenges answered, the order finalized and the
    # certificate fetched, then installed for the router. Each is an external effect
    # at the CA or a file that outlives a reboot.
    ORDER = "order"
    AUTHORIZE = "authorize"
    FINALIZE = "finalize"
    INSTALL = "install"
    # The frozen tier: the route `frozen` (one write), then every process of the
    # instance frozen in place; a wake thaws them, then serves the route again.
    FREEZE_ROUTE = "freeze-route"
    FREEZE = "freeze"
    THAW = "thaw"
    THAW_ROUTE = "thaw-route"

    def label(self, service: str | None) -> str:
        who = service or "?"
        match self:
            case StepKind.INSTANCE_KEY:
                return "instance key"
            case StepKind.RELEASE_COMMAND:
                return "release command"
            case StepKind.SPAWN | StepKind.READY | StepKind.STOP | StepKind.RETIRE:
                return f"{self.value} {who}"
            case StepKind.WITHDRAW:
                return "withdraw traffic"
            case StepKind.HOLD_EXEC:
                return "hold exec"
            case (StepKind.ACTIVATE | StepKind.PUBLISH | StepKind.SETTLE | StepKind.FAULT
                  | StepKind.PARK | StepKind.WAKE):
                return self.value
            case StepKind.STOP_NO_FALLBACK:
                return f"stop {who} (no fallback)"
            case StepKind.STOP_DOWN:
                return f"stop {who} (down)"
            case StepKind.OUT_OF_SERVICE:
                return "out of service"
            case StepKind.IN_SERVICE:
                return "in service"
            case StepKind.DEFER:
                return "deferred to the next wake"
            case StepKind.RUN:
                return "run"
            case StepKind.RUN_EXIT:
                return "run exit"
            case StepKind.LAY_DOWN:
                return "lay down"
            case StepKind.PURGE_DATA:
                return "purge data"
            case StepKind.FORGET:
                return "forget"
            case StepKind.REMOVE_BUILDS:
                return "remove builds"
            case (StepKind.SEED_STORE | StepKind.SEED_JOURNAL | StepKind.SEED_FENCE
                  | StepKind.SEED_LAY_DOWN | StepKind.SEED_KEY | StepKind.SEED_OPEN
                  | StepKind.SEED_CLOSE | StepKind.SEED_RETIRE_KEY
                  | StepKind.SEED_REMOVE_DATA | StepKind.SEED_RESTORE
                  | StepKind.SEED_UNFENCE | StepKind.SEED_DELETE_COPY
                  | StepKind.SEED_DELETE_REPLICA | StepKind.SEED_FORGET
                  | StepKind.SEED_RECORD):
                return self.value.replace("-", " ")
            case StepKind.HOLD_ROUTE:
                return "hold route"
            case StepKind.SWAP_DB:
                return "swap database"
            case StepKind.SWAP_DATABASE:
                return "swap database (an older journal's replica restore)"
            case StepKind.REPLICA_START:
                return "start replicator"
            case StepKind.REPLICA_STOP:
                return "sync and stop replicator"
            case StepKind.PURGE_REPLICA:
                return "purge replica"
            case StepKind.PURGE_SNAPSHOTS:
                return "purge snapshots"
            case StepKind.REPLICA_RESET:
                return "reset replica"
            case StepKind.ORDER:
                return "order certificate"
            case StepKind.AUTHORIZE:
                return "answer challenge"
            case StepKind.FINALIZE:
                return "finalize order"
            case StepKind.INSTALL:
                return "install certificate"
            case StepKind.FREEZE_ROUTE:
                return "route frozen"
            case StepKind.FREEZE:
                return "freeze"
            case StepKind.THAW:
                return "thaw"
            case StepKind.THAW_ROUTE:
                return "route served"
            case _:
                assert_never(self)

    @property
    def ends_with_the_box(self) -> bool:
        """What it does is undone by a reboot, or redone from an older journal to the
        same end: a process, a route, a desired state the operation's durable end
        acknowledges, files laid down again alike. Its begin may wait for the next
        durable commit (keelway/durable.py). A step whose effect outlives a reboot and
        must be neither repeated nor forgotten (a release command ran, a hold-mode build
        executed, a one-off run, the data plane's changes, removals) begins durably."""
        match self:
            case (StepKind.SPAWN | StepKind.READY | StepKind.WITHDRAW | StepKind.STOP
                  | StepKind.ACTIVATE | StepKind.PUBLISH | StepKind.SETTLE | StepKind.RETIRE
                  | StepKind.STOP_NO_FALLBACK | StepKind.STOP_DOWN | StepKind.FAULT
                  | StepKind.OUT_OF_SERVICE | StepKind.IN_SERVICE | StepKind.PARK
                  | StepKind.WAKE | StepKind.LAY_DOWN | StepKind.DEFER | StepKind.HOLD_ROUTE
                  | StepKind.REPLICA_START | StepKind.REPLICA_STOP | StepKind.INSTANCE_KEY
                  | StepKind.FREEZE_ROUTE | StepKind.FREEZE | StepKind.THAW
                  | StepKind.THAW_ROUTE):
                return True
            case (StepKind.RELEASE_COMMAND | StepKind.HOLD_EXEC | StepKind.RUN
                  | StepKind.RUN_EXIT | StepKind.PURGE_DATA | StepKind.FORGET
                  | StepKind.REMOVE_BUILDS | StepKind.SEED_STORE | StepKind.SEED_JOURNAL
                  | StepKind.SEED_FENCE | StepKind.SEED_LAY_DOWN | StepKind.SEED_KEY
                  | StepKind.SEED_OPEN | StepKind.SEED_CLOSE | StepKind.SEED_RETIRE_KEY
                  | StepKind.SEED_REMOVE_DATA | StepKind.SEED_RESTORE
                  | StepKind.SEED_UNFENCE | StepKind.SEED_DELETE_COPY
                  | StepKind.SEED_DELETE_REPLICA | StepKind.SEED_FORGET
                  | StepKind.SEED_RECORD | StepKind.SWAP_DB | StepKind.SWAP_DATABASE
                  | StepKind.PURGE_REPLICA | StepKind.PURGE_SNAPSHOTS
                  | StepKind.REPLICA_RESET | StepKind.ORDER | StepKind.AUTHORIZE
                  | StepKind.FINALIZE | StepKind.INSTALL):
                return False
            case _:
                assert_never(self)


class Cause(enum.StrEnum):
    """Why an attempt replaces what an instance runs; with the mode and the execution
    evidence it picks the fallback (keelway/deploy/plan.py)."""

    RELEASE = "release"  # deploy, rollback
    CONFIG = "config"
    RESTART = "restart"


class Inhibition(enum.StrEnum):
    """A mark on a generation that keeps a pass from treating it as a stray."""

    # A hold-mode old generation being stopped before its successor starts; stale once
    # the successor's candidate is converged (the old one was proven gone first).
    REPLACEMENT_PENDING = "replacement-pending"
    # An overlap old generation still draining; retired once its successor is verified
    # and routed.
    RETIREMENT_PENDING = "retirement-pending"
