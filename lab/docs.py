"""Write the generated parts of the docs, so that each is written once: the configuration reference's key table from
config.py's schema, and the flag table of each command (train.py, enjoy.py, the lab's tools) from its usage text
(tests/test_docs.py fails when a page differs from what this writes).

Usage:
  python -m lab.docs [--write]
  python -m lab.docs (-h | --help)

Options:
  --write     Write the tables into their pages; without it, list the pages whose tables are out of date (exit 1 if any).
  -h --help   Show this help.
"""

from __future__ import annotations

import ast
import os
import re

from cli import ROOT, parse_args, public_help
from config import RECURRENCE_SCHEMA, REQUIRED, SCHEMA, TRANSFORMER_SCHEMA

CONFIGURATION = os.path.join(ROOT, "docs", "configuration.md")
BEGIN = "<!-- config table: written by `python -m lab.docs --write` from config.py's schema; do not edit by hand -->"
END = "<!-- end of the config table -->"
# The nested sections, each listed right after its own key
SECTIONS = {"transformer": TRANSFORMER_SCHEMA, "recurrence": RECURRENCE_SCHEMA}
FLAGS_BEGIN = "<!-- flag table: written by `python -m lab.docs --write` from {script}'s usage text; do not edit by hand -->"
FLAGS_END = "<!-- end of the flag table -->"
# script: the page that holds its flag table (a page may hold several, each between markers naming its script).
# Every script of the repository with a usage text is here; tests/test_docs.py checks that none is missing.
FLAG_PAGES = {
    "train.py": "docs/training.md",
    "enjoy.py": "docs/evaluation.md",
    "lab/export.py": "docs/evaluation.md",
    "lab/experiment.py": "docs/experiments.md",
    "lab/plot.py": "docs/experiments.md",
    "lab/panel.py": "docs/experiments.md",
    "lab/tune.py": "docs/tuning.md",
    "lab/benchmark.py": "docs/benchmark.md",
    "lab/docs.py": "docs/testing.md",
    "lab/mutation.py": "docs/testing.md",
}
# A word of a usage text that is code on a page: a flag, a key=value, a path, a <placeholder>, a file extension, a
# CONSTANT_NAME, a snake_case_name, a file name, a comma-separated list of values ("1,2,4"). "K/V" stays a word: a
# path has a lower-case letter or a placeholder; "==" is no key=value.
CODE_WORD = re.compile(
    r"--[a-z][\w-]*|[^\s=]+=\S*|\S*[a-z<]\S*/\S*|\S*/\S*[a-z<]\S*|\S*<\w+>\S*|\.[a-z0-9]+|[A-Z][A-Z0-9]*_[A-Z0-9_]+"
    r"|[a-z][a-z0-9]*_[a-z0-9_]+|[\w-]+\.(?:py|json|yaml|md|log|nn|pt|png)|[\w-]+(?:,[\w-]+)+"
)
RATE = re.compile(r"\w+/s")  # "steps/s" is a rate, no path


def format_default(default: object) -> str:
    """A schema default as the table shows it: YAML spelling, strings as code, a constant schedule by its value.

    :param default: the default of a schema entry (``REQUIRED`` for a key without one)
    :return: the table cell
    """
    if default is REQUIRED:
        return "required"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float) and 0 < abs(default) < 0.01:
        # learning rates and epsilons read best as 3e-4, not Python's 0.0003 or 1e-08
        mantissa, exponent = f"{default:e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    if isinstance(default, float):
        return repr(default)  # 10.0, not 10: the key takes a number with a fraction
    if isinstance(default, str):
        return f"`{default}`" if default else '`""`'
    if isinstance(default, dict) and default and default.get("initial") == default.get("final"):
        return f"{format_default(float(default['initial']))} constant"
    if isinstance(default, dict):
        return f"`{default}`"
    return str(default)


def config_table() -> str:
    """The configuration reference's key table, one row per key of ``SCHEMA``, the nested keys after their section.

    :return: the markdown table, without a final newline
    """
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for key, (_, default, _, meaning) in SCHEMA.items():
        rows.append(f"| `{key}` | {format_default(default)} | {meaning} |")
        for sub_key, (_, sub_default, _, sub_meaning) in SECTIONS.get(key, {}).items():
            rows.append(f"| `{key}.{sub_key}` | {format_default(sub_default)} | {sub_meaning} |")
    return "\n".join(rows)


def with_table(text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """``text`` with the part between the ``begin`` marker and the first ``end`` marker after it replaced by ``table``.

    :param text: a page holding both markers, each on its own line, the begin marker once (a page with several tables
        has a begin marker for each, naming its source, and the same end marker after each)
    :param table: what goes between them
    :param begin: the opening marker
    :param end: the closing marker
    :return: the new page
    """
    if text.count(begin) != 1 or end not in text.split(begin)[-1]:
        raise ValueError(f"the page needs one line '{begin}' and after it a line '{end}'")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{table}\n{end}{rest.split(end, 1)[1]}"


def as_markdown(text: str) -> str:
    """A usage text's words as a table cell shows them: flags, paths, placeholders and the like in code spans (a bare
    ``<id>`` would be read as an HTML tag), quoted values (one word, or the whole text) as code.

    :param text: a flag's description from a usage text, on one line
    :return: the markdown
    """
    if re.fullmatch(r'"[^"]*"', text):
        return f"`{text[1:-1]}`"
    text = re.sub(r'"([^"\s]+)"', r"`\1`", text)
    words = []
    for word in text.split(" "):
        # punctuation of the sentence around the word, and a possessive 's, stay outside its code span
        lead, core, tail = re.fullmatch(r"(\(?)(.*?)((?:'s)?[).,;:]*)", word).groups()
        if core and not core.startswith("`") and CODE_WORD.fullmatch(core) and not RATE.fullmatch(core):
            core = f"`{core}`"
        words.append(lead + core + tail)
    # "--set updates=10" is one piece of code, not two
    return " ".join(words).replace("` `", " ")


def usage_options(doc: str) -> list[tuple[str, str, str]]:
    """The arguments and options of a docopt usage text, as the reader sees them in ``--help`` (no internal ones, no
    ``--help``). A description ending in "(default: ...)" or "[default: ...]" gives the default, one ending in
    "(required)" the default "required".

    :param doc: the usage text
    :return: (argument or flag as written, e.g. "<experiment>" or "--seed=<n>"; its default or ""; its description
        on one line), in the text's order
    """
    entries: list[list[str]] = []
    section = ""
    for line in public_help(doc).splitlines():
        if line and not line.startswith(" "):
            section = line  # "Arguments:", "Options:", or the prose after them
            continue
        if section not in ("Arguments:", "Options:"):
            continue
        entry = re.match(r"^  (<\S+>|-\S+(?: -\S+)*)\s{2,}(\S.*)$", line)
        if entry:
            entries.append([entry.group(1), entry.group(2)])
        elif line.startswith("    ") and entries:
            entries[-1][1] += " " + line.strip()
    rows = []
    for name, text in entries:
        if name.startswith("-h"):
            continue
        default = re.search(r" ?(?:[\[(]default: (.*?)[\])]|\((required)\))\.?$", text)
        if default:
            text = text[: default.start()] + ("." if text.endswith(".") else "")
        rows.append((name, next((group for group in default.groups() if group), "") if default else "", text))
    return rows


def flag_table(doc: str) -> str:
    """The flag table of a command: argument or flag, default and meaning, each row from the usage text's entry.

    :param doc: the command's usage text
    :return: the markdown table, without a final newline
    """
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for flag, default, text in usage_options(doc):
        if not default:
            default = "" if "=" in flag or flag.startswith("<") else "off"
        elif default == "required" or re.fullmatch(r"[\d.]+", default):
            pass
        elif " " not in default:
            default = f"`{default}`"
        else:
            default = as_markdown(default)
        # a cell reads as the rest of a sentence ("seed of the model"), but "YAML config" keeps its capitals
        first = text[0] if re.match(r"[A-Z]{2,}\b", text) else text[0].lower()
        meaning = as_markdown(first + text[1:].rstrip("."))
        rows.append(f"| `{flag}` | {default} | {meaning} |")
    return "\n".join(rows)


def usage_text(script: str) -> str:
    """A script's usage text, its module docstring, read from the source: importing the lab's tools would import
    torch, Optuna and the rest for a page of text.

    :param script: the script's path relative to the repository root, e.g. "lab/tune.py"
    :return: the docstring
    """
    with open(os.path.join(ROOT, script), encoding="utf-8") as file:
        doc = ast.get_docstring(ast.parse(file.read()), clean=False)
    if not doc or "Usage:" not in doc:
        raise ValueError(f"{script} has no usage text (a module docstring with 'Usage:')")
    return doc


def generated_pages() -> dict[str, str]:
    """Each page with generated parts, as this module writes it.

    :return: {path: the page's full text}
    """
    with open(CONFIGURATION, encoding="utf-8") as file:
        pages = {CONFIGURATION: with_table(file.read(), config_table())}
    for script, page in FLAG_PAGES.items():
        path = os.path.join(ROOT, page)
        if path not in pages:
            with open(path, encoding="utf-8") as file:
                pages[path] = file.read()
        begin = FLAGS_BEGIN.format(script=script)
        pages[path] = with_table(pages[path], flag_table(usage_text(script)), begin, FLAGS_END)
    return pages


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    stale = []
    for path, text in generated_pages().items():
        with open(path, encoding="utf-8") as file:
            if file.read() == text:
                continue
        stale.append(os.path.relpath(path, ROOT))
        if args["--write"]:
            with open(path, "w", encoding="utf-8") as file:
                file.write(text)
    verb = "wrote" if args["--write"] else "out of date (python -m lab.docs --write):"
    print(f"{verb} {', '.join(stale)}" if stale else "the generated docs are up to date")
    return 1 if stale and not args["--write"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
