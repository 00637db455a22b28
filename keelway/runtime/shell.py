"""How a Procfile line runs: as `/bin/sh -c LINE`, the way Heroku runs it through a
shell, so `VAR=value cmd`, `$PORT`, quotes, `cd dir && cmd` and redirections all mean
what they mean in a shell.

The shell must not stay between keelway and the app. A generation is stopped by
SIGTERM to its tree, and a shell that waits on a child dies of that SIGTERM at once; its
leader gone, the supervisor would kill what is left before the app has shut down, and
`status` would show the shell's pid, not the app's. So the line's last command is run
with `exec`, as bash does for `bash -c`: `ISSO_SETTINGS=isso.cfg isso run` becomes
`ISSO_SETTINGS=isso.cfg exec isso run` (assignments before `exec` reach the command),
`cd app && gunicorn x` becomes `cd app && exec gunicorn x`.

`exec` goes in only where it cannot change what the line does: the line is a list of
simple commands joined by `&&`, `||` or `;`, its last command is a plain command (not a
reserved word, not `exec` already), and nothing in it is a pipe, a background `&`, a
subshell, a command substitution or a second line. Any other line runs as written,
under a shell that stays; its stop is still graceful (the supervisor gives what is left
of the tree the stop's grace when the shell dies of the SIGTERM).
"""

from __future__ import annotations

import re

SHELL = "/bin/sh"
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# Words that start a compound command (POSIX reserved words), or that `exec` would break.
_NOT_EXECUTABLE = frozenset({"!", "{", "}", "case", "do", "done", "elif", "else", "esac",
                             "fi", "for", "function", "if", "in", "select", "then", "until",
                             "while", "[[", "exec"})


def shell_argv(line: str) -> list[str]:
    """The argv that runs a Procfile `line` (see the module header)."""
    at = _exec_offset(line)
    script = line if at is None else f"{line[:at]}exec {line[at:]}"
    return [SHELL, "-c", script]


def _exec_offset(line: str) -> int | None:
    """Where `exec ` goes in `line` (the start of its last command's name), or None
    when the line must run as written."""
    segments = _segments(line)
    if segments is None or not segments[-1]:
        return None
    for segment in segments:
        name = _command_word(line, segment)
        if name is not None and line[name[0]:name[1]] in _NOT_EXECUTABLE:
            return None
    last = _command_word(line, segments[-1])
    return None if last is None else last[0]


def _command_word(line: str, words: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The first word of a simple command that is not an assignment (None: only
    assignments, a command that sets variables and runs nothing)."""
    for start, end in words:
        if not _ASSIGNMENT.match(line, start, end):
            return start, end
    return None


def _segments(line: str) -> list[list[tuple[int, int]]] | None:
    """`line` as its simple commands (each a list of word spans) split at `&&`, `||` and
    `;`; None when it holds anything else a shell treats specially (see the header) or
    a quote that never closes."""
    segments: list[list[tuple[int, int]]] = [[]]
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch in " \t":
            i += 1
            continue
        if ch == "#":
            break  # a comment runs to the end of the line
        if line.startswith(("&&", "||"), i):
            segments.append([])
            i += 2
            continue
        if ch == ";":
            segments.append([])
            i += 1
            continue
        end = _word_end(line, i)
        if end is None:
            return None
        segments[-1].append((i, end))
        i = end
    if any(not words for words in segments[:-1]):
        return None  # `&& cmd` or `a ; ; b`: a syntax error, for sh to report
    return segments


def _word_end(line: str, i: int) -> int | None:
    """The end of the word that starts at `i`; None at a character that makes the line
    one to run as written."""
    n = len(line)
    while i < n:
        ch = line[i]
        if ch in " \t;" or line.startswith("||", i):
            return i
        if ch in "\n\r|()`" or line.startswith("$(", i):
            return None
        if ch == "&":
            if i > 0 and line[i - 1] in "<>":
                i += 1  # `2>&1`, `<&0`: a redirection, not a background job
                continue
            if line.startswith("&&", i):
                return i
            return None
        if ch == "\\":
            i += 2
        elif ch == "'":
            close = line.find("'", i + 1)
            if close < 0:
                return None
            i = close + 1
        elif ch == '"':
            i += 1
            while i < n and line[i] != '"':
                if line[i] == "`" or line.startswith("$(", i):
                    return None
                i += 2 if line[i] == "\\" else 1
            if i >= n:
                return None
            i += 1
        else:
            i += 1
    return n
