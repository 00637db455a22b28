"""Which source entries a build leaves out: the default ignores and `.keelwayignore`.

Owns the rule, and nothing else: pure (no I/O), so a directory copy, a tarball and a git
export all ask the same `IgnoreRules` and stage the same tree from the same source.

Invariants:
- `.git` (a directory, or a worktree's `.git` file) and a top-level `.keelway-build.log`
  are always left out: local state and keelway's own build output, never source.
- The defaults (`.env`, `.venv`, `node_modules`, `__pycache__`, at any depth) come first,
  as if they were the first lines of `.keelwayignore`, so a `!` line may keep one of them.
- A left-out directory is left out whole: nothing below it can be kept again (as in git,
  and so a walk can skip it without reading it).

`.keelwayignore` (only the one at the root of the source) is a subset of gitignore:
    # comment        blank lines and lines starting with `#` are skipped (`\\#` is a `#`)
    name             matches that name at any depth
    dir/             a trailing `/`: matches directories only
    /top, a/b        a `/` at the start or inside anchors the pattern at the root
    * ? [a-z] [!x]   a path component's glob (none of them matches `/`)
    **/x, a/**, a/**/b   any number of directories (zero or more)
    !pattern         keeps what an earlier line left out; the last matching line wins
Trailing spaces are dropped unless escaped with `\\`. Not supported: `.keelwayignore`
files below the root, and `\\` anywhere but before a character it escapes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from keelway.builds.errors import SourceError

IGNORE_FILE = ".keelwayignore"
BUILD_LOG = ".keelway-build.log"
ALWAYS_IGNORED = (".git", f"/{BUILD_LOG}")
DEFAULT_IGNORED = (".env", ".venv", "node_modules", "__pycache__")
MAX_IGNORE_FILE_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class _Rule:
    regex: re.Pattern[str]
    negated: bool
    dirs_only: bool


@dataclass(frozen=True, slots=True)
class IgnoreRules:
    """Rules in file order; `ignored` applies them to one path (last match wins)."""

    always: tuple[_Rule, ...]
    rules: tuple[_Rule, ...]

    @classmethod
    def parse(cls, text: str = "") -> IgnoreRules:
        """The defaults followed by the lines of a `.keelwayignore` (empty: defaults only).

        Raises SourceError naming the first line it cannot read.
        """
        always = tuple(_compile(p, line=None) for p in ALWAYS_IGNORED)
        rules = [_compile(p, line=None) for p in DEFAULT_IGNORED]
        for number, raw in enumerate(text.splitlines(), start=1):
            rule = _parse_line(raw, number)
            if rule is not None:
                rules.append(rule)
        return cls(always=always, rules=tuple(rules))

    @classmethod
    def from_file(cls, data: bytes | None) -> IgnoreRules:
        """The rules for a source whose root `.keelwayignore` holds `data` (None: none)."""
        if data is None:
            return cls.parse()
        if len(data) > MAX_IGNORE_FILE_BYTES:
            raise SourceError(f"{IGNORE_FILE} is over {MAX_IGNORE_FILE_BYTES} bytes")
        try:
            return cls.parse(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise SourceError(f"{IGNORE_FILE} is not UTF-8 text: {exc}") from None

    def ignored(self, rel: str, *, is_dir: bool) -> bool:
        """Whether the entry at `rel` (a relative posix path) is itself left out.

        Its parents are not looked at: a walk stops at a left-out directory, and
        `ignored_below` checks every ancestor for callers that see paths flat.
        """
        if any(_matches(rule, rel, is_dir) for rule in self.always):
            return True
        verdict = False
        for rule in self.rules:
            if _matches(rule, rel, is_dir):
                verdict = not rule.negated
        return verdict

    def ignored_below(self, rel: str, *, is_dir: bool) -> bool:
        """Whether `rel` or any directory above it is left out."""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if self.ignored("/".join(parts[:depth]), is_dir=True):
                return True
        return self.ignored(rel, is_dir=is_dir)


def _matches(rule: _Rule, rel: str, is_dir: bool) -> bool:
    return (is_dir or not rule.dirs_only) and rule.regex.fullmatch(rel) is not None


def _parse_line(raw: str, number: int) -> _Rule | None:
    line = _strip_trailing_spaces(raw)
    if not line or line.startswith("#"):
        return None
    return _compile(line, line=number)


def _strip_trailing_spaces(raw: str) -> str:
    line = raw.rstrip("\r")
    while line.endswith(" ") and not line.endswith("\\ "):
        line = line[:-1]
    return line


def _where(line: int | None) -> str:
    return f"{IGNORE_FILE} line {line}" if line is not None else "a default ignore"


def _compile(text: str, *, line: int | None) -> _Rule:
    pattern = text
    negated = pattern.startswith("!")
    if negated or pattern.startswith(("\\!", "\\#")):  # the `!`, or the escape of one
        pattern = pattern[1:]
    dirs_only = pattern.endswith("/") and not pattern.endswith("\\/")
    pattern = pattern.rstrip("/") if dirs_only else pattern
    anchored = "/" in pattern
    pattern = pattern.lstrip("/")
    if not pattern:
        raise SourceError(f"{_where(line)}: {text!r} has no name in it")
    body = _translate(pattern.split("/"), line)
    regex = body if anchored else f"(?:.*/)?{body}"
    return _Rule(re.compile(regex, re.DOTALL), negated, dirs_only)


def _translate(segments: list[str], line: int | None) -> str:
    """A regex for a whole relative path, from the pattern's `/`-separated segments."""
    out: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            # last: everything inside; elsewhere: zero or more whole directories
            out.append(".*" if last else "(?:[^/]*/)*")
            continue
        out.append(_segment(segment, line))
        if not last:
            out.append("/")
    return "".join(out)


def _segment(segment: str, line: int | None) -> str:
    """One path component's glob as a regex: `*`, `?`, `[...]`, `\\x`; never crosses `/`."""
    out: list[str] = []
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "\\" and i + 1 < len(segment):
            out.append(re.escape(segment[i + 1]))
            i += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end, klass = _bracket(segment, i, line)
            out.append(klass)
            i = end
            continue
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def _bracket(segment: str, start: int, line: int | None) -> tuple[int, str]:
    """The character class that opens at `segment[start]`; returns (index after, regex)."""
    i = start + 1
    negate = i < len(segment) and segment[i] in "!^"
    if negate:
        i += 1
    members: list[str] = []
    first = True
    while i < len(segment) and (segment[i] != "]" or first):
        first = False
        char = segment[i]
        if char == "\\" and i + 1 < len(segment):
            members.append(re.escape(segment[i + 1]))
            i += 2
        elif char == "-" and members and i + 1 < len(segment) and segment[i + 1] != "]":
            members.append("-")
            i += 1
        else:
            members.append(re.escape(char) if char != "-" else "\\-")
            i += 1
    if i >= len(segment):
        raise SourceError(f"{_where(line)}: {segment!r} opens a '[' it never closes")
    body = "".join(members)
    # a negated class must still not match `/`: a glob never crosses a component
    return i + 1, (f"[^/{body}]" if negate else f"[{body}]")
