"""The API of scheduled jobs (keelway/deploy/jobs.py):

    GET  /v1/apps/{app}/jobs                          -> 200 {"app","jobs":[job],"runs":[run]}
    POST /v1/apps/{app}/jobs/{job}/run {"instance":H|null}
                                                      -> 202 {"app","job","hosts":[H]}
    job = {"name","schedule","describe","timezone","instances","overlap","missed",
           "missed_window_s","wake","spread_s","timeout_s","hosts","next_run","running"}
    run = {"job","instance","operation","scheduled"|null,"by_hand","state","error",
           "started_at","finished_at"}

A run by hand is dispatched as a scheduled one is (the job's overlap rule, the box's
gate) and answered once dispatched: its outcome is in `GET .../jobs`, events and logs.
A job's command is not shown: it is the app's code, read from its build.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from aiohttp import web

from keelway.api.http import read_body, route
from keelway.deploy.jobs import Jobs


class JobRunBody(msgspec.Struct, forbid_unknown_fields=True):
    instance: str | None = None


@dataclass(frozen=True)
class JobsApi:
    jobs: Jobs

    @route("GET", "/v1/apps/{app}/jobs")
    async def listing(self, request: web.Request) -> web.Response:
        return web.json_response(self.jobs.listing(request.match_info["app"]))

    @route("POST", "/v1/apps/{app}/jobs/{job}/run")
    async def run(self, request: web.Request) -> web.Response:
        body: JobRunBody = await read_body(request, JobRunBody)
        app, job = request.match_info["app"], request.match_info["job"]
        hosts = self.jobs.run_now(app, job, body.instance)
        return web.json_response({"app": app, "job": job, "hosts": hosts}, status=202)
