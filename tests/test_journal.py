"""The journal's vocabulary: what each word means to the code that reads a journal."""

from __future__ import annotations

from keelway.journal import OpKind, StepKind


def test_only_a_deploy_or_a_rollback_runs_a_new_release() -> None:
    assert {k for k in OpKind if k.releases} == {OpKind.DEPLOY, OpKind.ROLLBACK}


def test_every_step_kind_reads_as_its_own_label_for_the_same_service() -> None:
    labels = [kind.label("web") for kind in StepKind]
    assert len(set(labels)) == len(labels)
    assert StepKind.SPAWN.label("worker") == "spawn worker"
    assert StepKind.STOP_DOWN.label("worker") == "stop worker (down)"
