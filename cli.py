"""Command-line helpers shared by train.py, enjoy.py and the lab's tools: argument parsing that names misspelt flags,
paths of the files shipped with the repository, whether a window can open, and the lock that keeps a second command
off a run that one is training.

The docopt usage text of each script stays the single source of its flags; ``parse_args`` reads them from it. A usage
line says how the program is run: ``train.py [options]`` for a script, ``python -m lab.tune [options]`` for a tool of
the lab (a module of the package lab/, run from the repository root).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import socket
import sys
import time

from docopt import DocoptExit, docopt, printable_usage

try:
    import fcntl
except ImportError:  # Windows has no flock: runs are not locked there
    fcntl = None

ROOT = os.path.dirname(os.path.abspath(__file__))  # the repository root, where configs/ and models/ live
SHIPPED_FOLDERS = ("configs", "models")  # relative paths under these fall back to the repository root


def usage_flags(doc: str) -> list[str]:
    """The long flags (``--name``) that the option lines of a docopt usage text define, in order."""
    flags = []
    for line in doc.splitlines():
        stripped = line.strip()
        if not stripped.startswith("-"):
            continue
        definition = re.split(r"\s{2,}", stripped, maxsplit=1)[0]  # the part before the description
        for flag in re.findall(r"--[A-Za-z0-9][\w-]*", definition):
            if flag not in flags:
                flags.append(flag)
    return flags


def program_name(doc: str) -> str:
    """The command that runs the program of the first usage line, e.g. "python train.py" or "python -m lab.tune"."""
    match = re.search(r"usage:\s*((?:python -m )?\S+)", doc, flags=re.IGNORECASE)
    name = match.group(1) if match else os.path.basename(sys.argv[0])
    return name if name.startswith("python ") else f"python {name}"


def docopt_text(doc: str) -> str:
    """The usage text as docopt reads it: docopt takes the first word of a usage line for the program's name, so
    ``python -m lab.tune [options]`` becomes ``lab.tune [options]``."""
    return re.sub(r"^(\s*)python -m (\S)", r"\1\2", doc, flags=re.MULTILINE)


def unknown_flags(argv: list[str], flags: list[str]) -> list[str]:
    """The ``--name`` arguments in ``argv`` that are neither a flag nor a prefix of exactly one flag (docopt accepts
    unique prefixes)."""
    unknown = []
    for argument in argv:
        if argument == "--":
            break
        if not argument.startswith("--"):
            continue
        name = argument.split("=", 1)[0]
        if not any(flag.startswith(name) for flag in flags):  # an ambiguous prefix is docopt's to explain
            unknown.append(name)
    return unknown


def unknown_flag_message(name: str, flags: list[str], program: str) -> str:
    """The error line for an unknown flag: the closest real flag, or the list of flags where none is close."""
    close = difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
    if close:
        return f"error: unknown flag '{name}': did you mean {close[0]}? ({program} --help lists every flag)"
    return f"error: unknown flag '{name}': {program} takes {', '.join(flags)}"


def parse_args(doc: str, argv: list[str] | None = None) -> dict:
    """docopt's parse of ``argv`` (default: the command line), but a wrong command line exits with code 2 and says
    what is wrong: an unknown flag is named, with the closest flag of the usage text (difflib).

    ``--help`` prints the usage text, without the options marked "(internal)", and exits 0.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(argument in ("-h", "--help") for argument in argv):
        # Option lines marked "(internal)" (and their continuation lines) are for the scripts' own use, not the reader.
        try:
            print(public_help(doc).strip("\n"), flush=True)
        except BrokenPipeError:  # `--help | head`: the reader has what it wanted; no traceback on the way out
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0)
    try:
        return docopt(docopt_text(doc), argv)
    except DocoptExit as error:
        flags, program = usage_flags(doc), program_name(doc)
        unknown = unknown_flags(argv, flags)
        if unknown:
            message = "\n".join(unknown_flag_message(name, flags, program) for name in unknown)
        else:
            text = str(error.code or "").strip()
            usage = DocoptExit.usage.strip()
            detail = text[: -len(usage)].strip() if usage and text.endswith(usage) else ""
            message = f"error: {detail}" if detail else "error: the arguments do not fit the usage"
            message += f"\n{printable_usage(doc).strip()}\n({program} --help explains every flag)"
        print(message, file=sys.stderr)
        raise SystemExit(2) from None


def public_help(doc: str) -> str:
    """The usage text without the option lines whose description starts with "(internal)"."""
    lines, hiding = [], False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.startswith("-"):
            hiding = "(internal)" in line
        elif not stripped or not line.startswith(" " * 4):
            hiding = False
        if not hiding:
            lines.append(line)
    return "\n".join(lines)


def shipped_path(path: str) -> str:
    """``path`` itself where it exists; a relative path under configs/ or models/ that exists only below the
    repository root (the script was started from another folder) resolved against the root."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    first = os.path.normpath(path).split(os.sep)[0]
    candidate = os.path.join(ROOT, path)
    if first in SHIPPED_FOLDERS and os.path.exists(candidate):
        return candidate
    return path


def module_environment() -> dict[str, str]:
    """``os.environ`` with the repository root first on PYTHONPATH: a ``python -m lab.<tool>`` child started in another
    folder finds the repository's modules (``-m`` puts the current folder on the path, not the repository)."""
    paths = [ROOT, *[path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def no_display_reason() -> str | None:
    """Why no window can open here (SDL's dummy video driver, or Linux without DISPLAY and WAYLAND_DISPLAY), or None."""
    driver = os.environ.get("SDL_VIDEODRIVER", "")
    if driver.lower() in ("dummy", "offscreen"):
        return f"SDL_VIDEODRIVER is '{driver}'"
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return "neither DISPLAY nor WAYLAND_DISPLAY is set"
    return None


class RunInUse(RuntimeError):
    """A run's lock is held by a process that is still running (the message names it and what to do)."""


class RunLock:
    """The lock of a run id while one command trains it: ``<models_dir>/<run-id>.lock``, beside the run's model file,
    held with ``flock`` and holding the holder's pid, host, start time and command line (JSON).

    The kernel lets go of a flock when its process ends, however it ends, so the lock of a process that was killed
    (SIGKILL, a crash) is free: the next run takes it over and says whose it was. ``release`` removes the file.
    """

    def __init__(self, models_dir: str, run_id: str, command: str) -> None:
        self.run_id = run_id
        self.path = os.path.join(models_dir, f"{run_id}.lock")
        self.command = command
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock; returns a note where it was taken over from a process that ended without releasing it.

        Raises:
            RunInUse: If a running process holds it.
        """
        if fcntl is None:
            return None
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunInUse(self._in_use(holder)) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # its holder removed the file between our open and flock: lock the one at the path now
        earlier = _read_holder(fd)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": self.command}  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        if not earlier:
            return None
        return (
            f"note: took over the lock of run '{self.run_id}' ({self.path}) from {_describe(earlier)}, which ended "
            "without releasing it"
        )

    def release(self) -> None:
        """Remove the lock file and let go of the lock (nothing where it is not held)."""
        if self._fd is None:
            return
        if _same_file(self._fd, self.path):
            os.remove(self.path)  # before unlocking: whoever opens the path next makes a new file, not this one
        fcntl.flock(self._fd, fcntl.LOCK_UN)  # also where forked environment workers still hold the descriptor
        os.close(self._fd)
        self._fd = None

    def _in_use(self, holder: dict) -> str:
        here = holder.get("host", socket.gethostname()) == socket.gethostname()
        stop = f"stop it (kill {holder['pid']})" if here and "pid" in holder else "stop it"
        if not here:
            stop += f" (where that process is gone, remove {self.path})"
        return (
            f"run '{self.run_id}' is being trained by {_describe(holder)} (it holds {self.path}): wait for it to end, "
            f"{stop}, or train under another --run-id; --overwrite and --resume do not take a run from a process "
            "that is training it"
        )


def _read_holder(fd: int) -> dict:
    """The holder record of a lock file ({} where it is empty or unreadable: being written, or written by none)."""
    try:
        record = json.loads(os.pread(fd, 1 << 16, 0).decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def _same_file(fd: int, path: str) -> bool:
    """Whether the open file ``fd`` is still the file at ``path``."""
    try:
        opened, current = os.fstat(fd), os.stat(path)
        return (opened.st_dev, opened.st_ino) == (current.st_dev, current.st_ino)
    except FileNotFoundError:
        return False


def _describe(holder: dict) -> str:
    """The holder as "process 1234 on host h since 2026-01-01 10:00:00 (python train.py ...)" from a holder record."""
    if "pid" not in holder:
        return "another process (it has not written its details yet)"
    host, since, command = (holder.get(key, "?") for key in ("host", "since", "command"))
    return f"process {holder['pid']} on host {host} since {since} ({command})"
