"""Write the generated parts of the docs, so that each is written once: the configuration reference's key table from
config.py's schema, and the flag tables of train.py and enjoy.py from their usage texts (tests/test_docs.py fails
when a page differs from what this writes).

Usage:
  python -m lab.docs [--write]
  python -m lab.docs (-h | --help)

Options:
  --write     Write the tables into their pages; without it, list the pages whose tables are out of date (exit 1 if any).
  -h --help   Show this help.
"""

from __future__ import annotations

import os
import re

import enjoy
import train
from cli import ROOT, parse_args, public_help
from config import RECURRENCE_SCHEMA, REQUIRED, SCHEMA, TRANSFORMER_SCHEMA

CONFIGURATION = os.path.join(ROOT, "docs", "configuration.md")
BEGIN = "<!-- config table: written by `python -m lab.docs --write` from config.py's schema; do not edit by hand -->"
END = "<!-- end of the config table -->"
# The nested sections, each listed right after its own key
SECTIONS = {"transformer": TRANSFORMER_SCHEMA, "recurrence": RECURRENCE_SCHEMA}
FLAGS_BEGIN = "<!-- flag table: written by `python -m lab.docs --write` from {script}'s usage text; do not edit by hand -->"
FLAGS_END = "<!-- end of the flag table -->"
# script: (its usage text, the page whose flag table it writes)
FLAG_PAGES = {
    "train.py": (train.__doc__, os.path.join(ROOT, "docs", "training.md")),
    "enjoy.py": (enjoy.__doc__, os.path.join(ROOT, "docs", "evaluation.md")),
}
# A word of a usage text that is code on a page: a flag, a key=value, a path, a <placeholder>, a file extension, a
# CONSTANT_NAME. "K/V" stays a word: a path has a lower-case letter or a placeholder.
CODE_WORD = re.compile(
    r"--[a-z][\w-]*|\S*=\S*|\S*[a-z<]\S*/\S*|\S*/\S*[a-z<]\S*|\S*<\w+>\S*|\.[a-z0-9]+|[A-Z][A-Z0-9]*_[A-Z0-9_]+|\w+\.py"
)


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
    """``text`` with the part between the ``begin`` and ``end`` markers replaced by ``table``.

    :param text: a page holding both markers, each on its own line
    :param table: what goes between them
    :param begin: the opening marker
    :param end: the closing marker
    :return: the new page
    """
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"the page needs one line '{begin}' and one line '{end}'")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{table}\n{end}{rest.split(end, 1)[1]}"


def as_markdown(text: str) -> str:
    """A usage text's words as a table cell shows them: flags, paths, placeholders and the like in code spans (a bare
    ``<id>`` would be read as an HTML tag), quoted values as code.

    :param text: a flag's description from a usage text, on one line
    :return: the markdown
    """
    text = re.sub(r'"(\w+)"', r"`\1`", text)
    words = []
    for word in text.split(" "):
        # punctuation of the sentence around the word stays outside its code span
        lead, core, tail = re.fullmatch(r"(\(?)(.*?)([).,;:]*)", word).groups()
        if core and not core.startswith("`") and CODE_WORD.fullmatch(core):
            core = f"`{core}`"
        words.append(lead + core + tail)
    # "--set updates=10" is one piece of code, not two
    return " ".join(words).replace("` `", " ")


def usage_options(doc: str) -> list[tuple[str, str, str]]:
    """The options of a docopt usage text, as the reader sees them in ``--help`` (no internal ones, no ``--help``).

    :param doc: the usage text
    :return: (flag as written, e.g. "--seed=<n>"; its default or ""; its description on one line), in the text's order
    """
    options: list[list[str]] = []
    for line in public_help(doc).split("Options:", 1)[1].splitlines():
        option = re.match(r"^  (-\S+(?: -\S+)*)\s{2,}(\S.*)$", line)
        if option:
            options.append([option.group(1), option.group(2)])
        elif line.startswith("    ") and options:
            options[-1][1] += " " + line.strip()
    rows = []
    for flag, text in options:
        if flag.startswith("-h"):
            continue
        default = re.search(r" ?[\[(]default: (.*?)[\])]\.?$", text)
        if default:
            text = text[: default.start()] + ("." if text.endswith(".") else "")
        rows.append((flag, default.group(1) if default else "", text))
    return rows


def flag_table(doc: str) -> str:
    """The flag table of a command: flag, default and meaning, each row from the usage text's option.

    :param doc: the command's usage text
    :return: the markdown table, without a final newline
    """
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for flag, default, text in usage_options(doc):
        if not default:
            default = "" if "=" in flag else "off"
        elif " " not in default:
            default = default if re.fullmatch(r"[\d.]+", default) else f"`{default}`"
        else:
            default = as_markdown(default)
        # a cell reads as the rest of a sentence ("seed of the model"), but "YAML config" keeps its capitals
        meaning = as_markdown((text[0].lower() if text[1:2].islower() else text[0]) + text[1:].rstrip("."))
        rows.append(f"| `{flag}` | {default} | {meaning} |")
    return "\n".join(rows)


def generated_pages() -> dict[str, str]:
    """Each page with generated parts, as this module writes it.

    :return: {path: the page's full text}
    """
    with open(CONFIGURATION, encoding="utf-8") as file:
        pages = {CONFIGURATION: with_table(file.read(), config_table())}
    for script, (doc, path) in FLAG_PAGES.items():
        with open(path, encoding="utf-8") as file:
            pages[path] = with_table(file.read(), flag_table(doc), FLAGS_BEGIN.format(script=script), FLAGS_END)
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
