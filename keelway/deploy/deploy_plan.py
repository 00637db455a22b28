"""A deploy's dry run as one value: the build the deploy would stage or reuse
(keelway/builds/preview.py), the release it would write, the instances it would add,
and each instance's plan, made by the attempt spec's own plan function
(keelway/deploy/deployer.py `Deployer.dry_deploy`); and how `--dry-run` shows it."""

from __future__ import annotations

from dataclasses import dataclass

from keelway.builds.preview import BuildPreview
from keelway.deploy.operation import Plan
from keelway.deploy.targets import Target


@dataclass(frozen=True)
class DeployPlan:
    """A dry-run deploy: the build it would stage or reuse, the release it would write
    (`target`), the instances it would add, and each instance's plan in rollout order."""

    build: BuildPreview
    target: Target
    added: tuple[str, ...]
    plans: list[Plan]

    def lines(self) -> list[str]:
        """As `deploy --dry-run` prints it: the build, the release, then each
        instance's plan, one it would add said so first."""
        target = self.target
        config = ", ".join(sorted(target.config)) or "none"
        services = ", ".join(f"{s.name} ({s.kind.value}, {s.mode.value})"
                             for s in target.manifest.services.values())
        lines = [self.build.line(),
                 f"release v{target.release} of {target.app}: build "
                 f"{target.build_digest[:12]}, config {config}; services {services}"]
        for plan in self.plans:
            if plan.host in self.added:
                lines.append(f"would add instance {plan.host}")
            lines += plan.lines()
        return lines

    def as_json(self) -> dict[str, object]:
        target = self.target
        return {"app": target.app, "build": self.build.as_json(),
                "release": {"number": target.release, "build": target.build_digest,
                            "config": sorted(target.config),
                            "services": {s.name: {"kind": s.kind.value, "mode": s.mode.value}
                                         for s in target.manifest.services.values()}},
                "adds": list(self.added), "plans": [p.as_json() for p in self.plans]}
