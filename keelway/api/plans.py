"""A dry run as the API answers it: the plan the runner would run, step by step, as
`plan.as_json()` plus the lines `--dry-run` prints (keelway/deploy/operation.py), so the
CLI shows the runner's own description and never a second list of its own."""

from __future__ import annotations

from aiohttp import web

from keelway.deploy.deploy_plan import DeployPlan
from keelway.deploy.operation import Plan


def plan_response(*plans: Plan) -> web.Response:
    """The plans an operation would run (one per instance, in the order it would run
    them), as JSON and as the lines `--dry-run` prints."""
    return web.json_response({"dry_run": True, "plans": [p.as_json() for p in plans],
                              "lines": [line for p in plans for line in p.lines()]})


def deploy_plan_response(plan: DeployPlan) -> web.Response:
    """A dry-run deploy: the build, the release and the instances it would add besides
    each instance's plan, as JSON and as the lines `--dry-run` prints."""
    return web.json_response({"dry_run": True, **plan.as_json(), "lines": plan.lines()})
