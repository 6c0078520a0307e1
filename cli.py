"""Command-line helpers shared by train.py, enjoy.py and the lab's tools: argument parsing that names misspelt flags,
paths of the files shipped with the repository, and whether a window can open.

The docopt usage text of each script stays the single source of its flags; ``parse_args`` reads them from it. A usage
line says how the program is run: ``train.py [options]`` for a script, ``python -m lab.tune [options]`` for a tool of
the lab (a module of the package lab/, run from the repository root).
"""

from __future__ import annotations

import difflib
import os
import re
import sys

from docopt import DocoptExit, docopt, printable_usage

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
