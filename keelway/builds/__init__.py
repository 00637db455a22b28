"""Builds: stage an app's source into an immutable, content-named build, and collect them.

Modules, lowest first (each imports only those above it, plus keelway.durable):

    errors      the BuildError tree, named for whose fault it is
    ignore      which source entries a build leaves out (defaults, .keelwayignore)
    manifest    Procfile + keelway.toml -> Manifest (pure parsing and validation)
    extract     safe tar extraction
    tree        copy, digest, seal, flush and remove a staged tree
    build_step  run one build step in its own process group, logged
    toolchain   the Pythons and the node this box has; .python-version, engines.node
    cache       installed dependencies by key, shared with builds by hard links
    deps        detect an app's dependencies and install them (or link them from cache)
    stage       directory | tarball | git ref -> builds/<app>/<digest>/, and sweep()
    preview     what stage would make of a source, read only (deploy --dry-run)
    gc          remove staged builds nothing pins, and unused cache entries
"""

from keelway.builds.errors import (
    BuildCommandError,
    BuildError,
    BuildInputError,
    BuildLimitError,
    ManifestError,
    SourceError,
    StagingError,
    UnsafeArchiveError,
)
from keelway.builds.gc import collect
from keelway.builds.manifest import Manifest, Mode, ServiceKind, ServiceSpec, load_manifest
from keelway.builds.stage import StagedBuild, stage, sweep

__all__ = [
    "BuildCommandError",
    "BuildError",
    "BuildInputError",
    "BuildLimitError",
    "Manifest",
    "ManifestError",
    "Mode",
    "ServiceKind",
    "ServiceSpec",
    "SourceError",
    "StagedBuild",
    "StagingError",
    "UnsafeArchiveError",
    "collect",
    "load_manifest",
    "stage",
    "sweep",
]
