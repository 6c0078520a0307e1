"""Write the generated parts of the docs: the configuration reference's key table from config.py's schema, so that a
key's default and meaning are written once (tests/test_docs.py fails when docs/configuration.md differs from what
this writes).

Usage:
  python -m lab.docs [--write]
  python -m lab.docs (-h | --help)

Options:
  --write     Write the tables into their pages; without it, list the pages whose tables are out of date (exit 1 if any).
  -h --help   Show this help.
"""

from __future__ import annotations

import os

from cli import ROOT, parse_args
from config import RECURRENCE_SCHEMA, REQUIRED, SCHEMA, TRANSFORMER_SCHEMA

CONFIGURATION = os.path.join(ROOT, "docs", "configuration.md")
BEGIN = "<!-- config table: written by `python -m lab.docs --write` from config.py's schema; do not edit by hand -->"
END = "<!-- end of the config table -->"
# The nested sections, each listed right after its own key
SECTIONS = {"transformer": TRANSFORMER_SCHEMA, "recurrence": RECURRENCE_SCHEMA}


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
        raise ValueError(f"the page needs one '{begin}' line and one '{end}' line")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{table}\n{end}{rest.split(end, 1)[1]}"


def generated_pages() -> dict[str, str]:
    """Each page with generated parts, as this module writes it.

    :return: {path: the page's full text}
    """
    with open(CONFIGURATION, encoding="utf-8") as file:
        return {CONFIGURATION: with_table(file.read(), config_table())}


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
