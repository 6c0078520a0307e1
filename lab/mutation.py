"""Mutation testing of the core's numerics with mutmut (``make mutation``; docs/testing.md#mutation-testing).

mutmut (configured in pyproject.toml's [tool.mutmut]) makes small changes ("mutants": a flipped sign, a changed
constant, a dropped argument) in a copy of the repository (mutants/), and runs the tests that call the changed
function on each; a mutant no test notices "survives". mutmut mutates whole files; this tool runs only the mutants
of the functions in ``SCOPE`` (one process, as the machine's cores are shared), then prints per file how many were
killed, survived and timed out, and the diff of each survivor.

Usage:
  python -m lab.mutation [--report]
  python -m lab.mutation (-h | --help)

Options:
  --report    Print the counts and the survivors of the last run (mutants/) without running mutmut.
  -h --help   Show this help.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections import Counter

from mutmut.stats import status_by_exit_code

from cli import ROOT, parse_args

# The functions whose mutants run, per mutated file (None: every function of the file). "Class.method" or "function",
# as written in the file. mutmut does not mutate decorated functions (other than classmethod and staticmethod): the
# core writes torch.no_grad() as a block where mutants should reach (normalization.py).
SCOPE: dict[str, tuple[str, ...] | None] = {
    "normalization.py": None,
    "transformer.py": ("alibi_slopes", "AttentionMask.build", "MultiHeadAttention.forward", "Transformer.attention_mask"),
    "ppo.py": ("ppo_loss", "reconstruction_loss"),
    "buffer.py": ("Buffer.compute_advantages",),
}
STATUSES = ("killed", "survived", "timeout", "no tests")  # the columns; any other status counts as "other"


def mutant_pattern(path: str, function: str | None) -> str:
    """The mutmut names (fnmatch pattern) of the mutants of ``function`` in the file ``path`` (None: all of the file).

    mutmut names a mutant <module>.x_<function>__mutmut_<n>, or <module>.xǁ<Class>ǁ<method>__mutmut_<n>.
    """
    module = path[: -len(".py")].replace("/", ".")
    if function is None:
        return f"{module}.*"
    owner, _, name = function.rpartition(".")
    key = f"xǁ{owner}ǁ{name}" if owner else f"x_{name}"
    return f"{module}.{key}__mutmut_*"


def scope_patterns() -> list[tuple[str, str]]:
    """(file, pattern) of every entry of ``SCOPE``."""
    return [
        (path, mutant_pattern(path, function))
        for path, functions in SCOPE.items()
        for function in (functions if functions is not None else (None,))
    ]


def load_results(folder: str) -> dict[str, dict[str, int | None]]:
    """Per file of ``SCOPE``, the exit code of each of its mutants in scope (None: not run), from mutmut's records.

    Raises:
        ValueError: Where a file has no record (mutmut has not run) or an entry of ``SCOPE`` has no mutant.
    """
    results = {}
    for path in SCOPE:
        record = os.path.join(folder, f"{path}.meta")
        if not os.path.isfile(record):
            raise ValueError(f"{record} does not exist: run `python -m lab.mutation` (without --report) first")
        with open(record, encoding="utf-8") as file:
            codes = json.load(file)["exit_code_by_key"]
        results[path] = {}
        for file_path, pattern in scope_patterns():
            if file_path != path:
                continue
            matching = {name: code for name, code in codes.items() if fnmatch.fnmatch(name, pattern)}
            if not matching:
                raise ValueError(
                    f"no mutant of {path} matches {pattern}: name only functions that exist in {path} in "
                    "lab/mutation.py's SCOPE (a renamed or deleted function must be renamed or removed there too)"
                )
            results[path].update(matching)
    return results


def count(codes: dict[str, int | None]) -> Counter:
    """How many mutants have each status: the columns of ``STATUSES``, "other" and "total"."""
    counts = Counter(total=len(codes))
    for code in codes.values():
        status = status_by_exit_code[code]
        counts[status if status in STATUSES else "other"] += 1
    return counts


def report(results: dict[str, dict[str, int | None]]) -> list[str]:
    """Print a table of the counts per file and return the names of the surviving mutants."""
    columns = ("total", *STATUSES, "other")
    print("| file | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    totals: Counter = Counter()
    for path, codes in results.items():
        counts = count(codes)
        totals.update(counts)
        print(f"| {path} | " + " | ".join(str(counts[column]) for column in columns) + " |")
    print("| all | " + " | ".join(str(totals[column]) for column in columns) + " |")
    survivors = [name for codes in results.values() for name, code in codes.items() if status_by_exit_code[code] == "survived"]
    return sorted(survivors)


def check_copied_modules(root: str) -> None:
    """Raise ValueError naming the top-level modules that pyproject.toml's [tool.mutmut] neither mutates nor copies:
    the tests in mutants/ could not import them."""
    with open(os.path.join(root, "pyproject.toml"), "rb") as file:
        settings = tomllib.load(file)["tool"]["mutmut"]
    copied = set(settings["source_paths"]) | set(settings["also_copy"])
    missing = sorted(os.path.basename(path) for path in glob.glob(os.path.join(root, "*.py")))
    missing = [name for name in missing if name not in copied]
    if missing:
        raise ValueError(
            f"pyproject.toml's [tool.mutmut] neither mutates nor copies {missing}, so the tests in mutants/ cannot "
            "import them: add them to its also_copy"
        )


def mutmut_command() -> str:
    """The mutmut executable beside this Python's (``python -m mutmut`` imports its main module twice)."""
    beside = os.path.join(os.path.dirname(sys.executable), "mutmut")
    found = beside if os.path.isfile(beside) else shutil.which("mutmut")
    if found is None:
        raise ValueError(f"mutmut is not installed for {sys.executable}: run `make mutation`, which installs it")
    return found


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.mutation`` with the command-line arguments ``argv`` (default: sys.argv[1:]); returns the exit
    code."""
    args = parse_args(__doc__, argv)
    try:
        if not args["--report"]:
            check_copied_modules(ROOT)
            # A fresh copy every run: mutmut keeps its map of which tests call which function from run to run, and a
            # test changed since would keep its old entries.
            shutil.rmtree(os.path.join(ROOT, "mutants"), ignore_errors=True)
            patterns = [pattern for _, pattern in scope_patterns()]
            # One test process at a time: the mutants' tests are single-threaded, and the machine's cores are shared.
            command = [mutmut_command(), "run", "--max-children", "1", *patterns]
            code = subprocess.run(command, cwd=ROOT, check=False).returncode
            if code != 0:
                print(f"error: mutmut stopped with exit code {code}: {' '.join(command)}", file=sys.stderr)
                return code
        results = load_results(os.path.join(ROOT, "mutants"))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    survivors = report(results)
    print(f"\n{len(survivors)} surviving mutants" + (":" if survivors else ""))
    for name in survivors:
        shown = subprocess.run([mutmut_command(), "show", name], cwd=ROOT, capture_output=True, text=True, check=False)
        print(shown.stdout.rstrip() or f"# {name}: {shown.stderr.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
