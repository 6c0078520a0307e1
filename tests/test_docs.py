"""The README and docs/ stay true to the code: every config key and flag documented on its page, every mentioned file
present, every relative link pointing at a file (and heading) that exists, every command of the repository's tools
accepted as written, and the README short enough to read."""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from docopt import DocoptExit, docopt

import config
from cli import docopt_text
from config import RECURRENCE_SCHEMA, SCHEMA, TRANSFORMER_SCHEMA
from environments import ENV_TYPES, FAMILIES
from lab import docs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_PATH = os.path.join(ROOT, "README.md")
DOC_PATHS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
# The results' READMEs, beside their experiments: their links and commands are checked as the docs' are
RESULT_PAGES = sorted(glob.glob(os.path.join(ROOT, "results", "**", "README.md"), recursive=True))
README_MAX_BYTES = 15_000


def read(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as file:
        return file.read()


def without_code_blocks(text: str) -> str:
    """The text outside fenced code blocks: a `# comment` in a bash block is no heading, a `[x](y)` there no link."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def anchors(path: str) -> set[str]:
    """The anchors GitHub gives the headings of a markdown file: lower case, punctuation dropped, spaces to hyphens,
    a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", without_code_blocks(read(path)), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def test_every_config_key_is_documented() -> None:
    configuration = read("docs/configuration.md")
    for key in SCHEMA:
        assert f"`{key}`" in configuration, key
    for key in TRANSFORMER_SCHEMA:
        assert f"`transformer.{key}`" in configuration, key
    for key in RECURRENCE_SCHEMA:
        assert f"`recurrence.{key}`" in configuration, key


def test_every_environment_type_and_key_is_documented() -> None:
    environments = read("docs/environments.md")
    for env_type in ENV_TYPES:
        assert f"`{env_type}`" in environments, env_type
        for key in FAMILIES[env_type].schema:
            assert f"`{key}`" in environments, f"{env_type}.{key}"


def test_every_script_with_a_usage_text_has_a_generated_flag_table() -> None:
    scripts = sorted(glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "lab", "*.py")))
    with_usage = {
        os.path.relpath(path, ROOT) for path in scripts if "Usage:" in (ast.get_docstring(ast.parse(read(path))) or "")
    }
    assert {"train.py", "enjoy.py", "lab/tune.py"} <= with_usage
    assert with_usage == set(docs.FLAG_PAGES), "each script with a usage text needs its page in lab/docs.py's FLAG_PAGES"


@pytest.mark.parametrize("script, page", sorted(docs.FLAG_PAGES.items()))
def test_every_flag_is_documented(script: str, page: str) -> None:
    usage = read(script).split('"""')[1]
    flags = set(re.findall(r"^\s+(--[a-z-]+)", usage, flags=re.MULTILINE)) - {"--help", "--child", "--overrides"}
    assert flags, "no flags found"
    text = read(page)
    for flag in flags:
        assert f"`{flag}" in text, f"{script} {flag} in {page}"


def test_every_mentioned_file_exists() -> None:
    docs = "".join(read(path) for path in [README_PATH, *DOC_PATHS])
    mentioned = set(re.findall(r"`((?:configs|docs|tests|environments|lab|memories)/[\w./-]+|[\w-]+\.(?:py|txt|yaml))`", docs))
    assert len(mentioned) > 10
    for path in mentioned:
        candidates = [os.path.join(ROOT, path), os.path.join(ROOT, "docs", path)]
        assert any(os.path.exists(c) for c in candidates), path


def test_the_readme_is_short() -> None:
    size = os.path.getsize(README_PATH)
    assert size <= README_MAX_BYTES, f"README.md has {size} bytes, at most {README_MAX_BYTES}: move details into docs/"


@pytest.mark.parametrize("page", [README_PATH, *DOC_PATHS, *RESULT_PAGES], ids=lambda path: os.path.relpath(path, ROOT))
def test_every_relative_link_points_to_an_existing_file(page: str) -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", without_code_blocks(read(page)))
    relative = [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]
    assert relative or page != README_PATH, "the README links into docs/"
    for link in relative:
        target, _, anchor = link.partition("#")
        path = os.path.normpath(os.path.join(os.path.dirname(page), target)) if target else page
        assert os.path.exists(path), f"{os.path.relpath(page, ROOT)}: {link} ({os.path.relpath(path, ROOT)} is missing)"
        if anchor and path.endswith(".md"):
            assert anchor in anchors(path), f"{os.path.relpath(page, ROOT)}: {link} (no such heading)"


def test_the_readme_links_every_docs_page() -> None:
    readme = read(README_PATH)
    # docs/index.md is the docs site's home page; on GitHub the README is the home
    for path in [p for p in DOC_PATHS if os.path.basename(p) != "index.md"]:
        assert f"](docs/{os.path.basename(path)})" in readme, f"the README's doc map lacks docs/{os.path.basename(path)}"


def test_config_comments_name_result_files_that_exist() -> None:
    # A config says where its results are (results/<id>) instead of repeating their numbers, which drift.
    named = 0
    for path in glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True):
        comments = "\n".join(line.split("#", 1)[1] for line in open(path, encoding="utf-8") if "#" in line)
        for result in re.findall(r"results/[\w./-]*\w", comments):
            named += 1
            assert os.path.exists(os.path.join(ROOT, result)), f"{os.path.relpath(path, ROOT)} names {result}"
    assert named >= 10


def nav_pages(nav: list) -> list[str]:
    """The page files of mkdocs.yml's nav, at any depth of sections.

    :param nav: the nav list: page names, or one-key dicts of a title to a page name or to a list of such entries
    :return: the page names, relative to docs/
    """
    pages = []
    for entry in nav:
        for item in entry.values() if isinstance(entry, dict) else [entry]:
            pages.extend(nav_pages(item) if isinstance(item, list) else [item])
    return pages


def test_every_docs_page_is_in_the_site_nav() -> None:
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as file:
        pages = nav_pages(yaml.safe_load(file)["nav"])
    assert len(pages) == len(set(pages)), "a page is twice in mkdocs.yml's nav"
    assert set(pages) == {os.path.basename(path) for path in DOC_PATHS}, "mkdocs.yml's nav and docs/*.md differ"


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs-material is not installed (pip install -r requirements-dev.txt, which `make test` does)",
)
def test_the_docs_site_builds_in_strict_mode(tmp_path: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert os.path.exists(tmp_path / "site" / "configuration" / "index.html")


def test_the_generated_tables_are_the_ones_the_schema_and_usage_texts_give() -> None:
    pages = docs.generated_pages()
    assert {os.path.join(ROOT, page) for page in docs.FLAG_PAGES.values()} | {docs.CONFIGURATION} == set(pages)
    for path, text in pages.items():
        assert read(path) == text, f"{os.path.relpath(path, ROOT)} differs from its sources: python -m lab.docs --write"


def test_a_changed_schema_meaning_changes_the_config_table(monkeypatch: pytest.MonkeyPatch) -> None:
    kind, default, check, _ = SCHEMA["gamma"]
    monkeypatch.setitem(SCHEMA, "gamma", (kind, default, check, "a new meaning"))
    monkeypatch.setitem(TRANSFORMER_SCHEMA, "num_heads", (int, 8, None, "more heads"))
    table = docs.config_table()
    assert "| `gamma` | 0.99 | a new meaning |" in table
    assert "| `transformer.num_heads` | 8 | more heads |" in table


@pytest.mark.parametrize(
    "default, cell",
    [
        (config.REQUIRED, "required"),
        (False, "false"),
        (10.0, "10.0"),
        (1e-8, "1e-8"),
        (3e-4, "3e-4"),
        ("", '`""`'),
        ("chunks", "`chunks`"),
        ({}, "`{}`"),
        ({"initial": 3e-4, "final": 3e-4, "max_decay_steps": 1}, "3e-4 constant"),
    ],
)
def test_defaults_are_written_as_a_config_file_would(default: object, cell: str) -> None:
    assert docs.format_default(default) == cell


def test_the_generator_refuses_a_page_without_its_markers() -> None:
    with pytest.raises(ValueError, match="config table"):
        docs.with_table("no markers here", "| table |")
    assert docs.with_table(f"a\n{docs.BEGIN}\nold\n{docs.END}\nb", "new") == f"a\n{docs.BEGIN}\nnew\n{docs.END}\nb"
    with pytest.raises(ValueError, match="after it"):
        docs.with_table(f"{docs.END}\n{docs.BEGIN}\nold", "new", docs.BEGIN, docs.END)


def test_a_page_holds_several_flag_tables_each_between_its_own_markers() -> None:
    first, second = docs.FLAGS_BEGIN.format(script="a.py"), docs.FLAGS_BEGIN.format(script="b.py")
    page = f"{first}\nold a\n{docs.FLAGS_END}\ntext\n{second}\nold b\n{docs.FLAGS_END}\n"
    page = docs.with_table(docs.with_table(page, "new b", second, docs.FLAGS_END), "new a", first, docs.FLAGS_END)
    assert page == f"{first}\nnew a\n{docs.FLAGS_END}\ntext\n{second}\nnew b\n{docs.FLAGS_END}\n"


def test_a_stale_flag_table_is_found_and_rewritten(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    # a tool whose usage text changed after its page's table was written: the check fails until --write
    script = tmp_path / "tool.py"
    script.write_text(f'"""{USAGE}"""\n', encoding="utf-8")
    begin = docs.FLAGS_BEGIN.format(script=script)
    (tmp_path / "page.md").write_text(f"# Tool\n\n{begin}\n| flag |\n|---|\n| `--old` |\n{docs.FLAGS_END}\n", encoding="utf-8")
    (tmp_path / "configuration.md").write_text(read("docs/configuration.md"), encoding="utf-8")
    monkeypatch.setattr(docs, "CONFIGURATION", str(tmp_path / "configuration.md"))
    monkeypatch.setattr(docs, "FLAG_PAGES", {str(script): str(tmp_path / "page.md")})
    assert docs.main([]) == 1
    assert "out of date" in capsys.readouterr().out
    assert docs.main(["--write"]) == 0
    assert docs.main([]) == 0
    assert docs.flag_table(USAGE) in (tmp_path / "page.md").read_text(encoding="utf-8")


USAGE = """Usage:
  tool.py [options] <run>...

Arguments:
  <run>          A run folder.

Options:
  --name=<id>    Name of the study (required).
  --out=<path>   Where the <id>.json files go [default: out/x].
  --fast         Skip the "slow" part: --out still applies, e.g. --out a=b
                 and so on (default: OMP_NUM_THREADS, else 1).
  --child=<n>    (internal) The scripts' own flag.
                 Its second line.
  -h --help      Show this help.

A file of the tool:

  key: value     # not an option
    more: 1
"""


def test_flag_tables_come_from_the_usage_text() -> None:
    assert docs.usage_options(USAGE) == [
        ("<run>", "", "A run folder."),
        ("--name=<id>", "required", "Name of the study."),
        ("--out=<path>", "out/x", "Where the <id>.json files go."),
        ("--fast", "OMP_NUM_THREADS, else 1", 'Skip the "slow" part: --out still applies, e.g. --out a=b and so on.'),
    ]
    assert docs.flag_table(USAGE).splitlines()[2:] == [
        "| `<run>` |  | a run folder |",
        "| `--name=<id>` | required | name of the study |",
        "| `--out=<path>` | `out/x` | where the `<id>.json` files go |",
        "| `--fast` | `OMP_NUM_THREADS`, else 1 | skip the `slow` part: `--out` still applies, e.g. `--out a=b` and so on |",
    ]


@pytest.mark.parametrize(
    "text, markdown",
    [
        ("K/V cache in models/<id>.nn.", "K/V cache in `models/<id>.nn`."),
        ("(see docs/memory.md), or .mp4", "(see `docs/memory.md`), or `.mp4`"),
        ("written by train.py; e.g. --set updates=10", "written by `train.py`; e.g. `--set updates=10`"),
        ("steps/s where fast == plain, e.g. 1,2,4 in train.log", "steps/s where fast == plain, e.g. `1,2,4` in `train.log`"),
        ("--gpu-check's table of n_workers", "`--gpu-check`'s table of `n_workers`"),
        ('"<metric>: IQM over seeds"', "`<metric>: IQM over seeds`"),
    ],
)
def test_usage_words_become_code_spans(text: str, markdown: str) -> None:
    assert docs.as_markdown(text) == markdown


def shell_commands(text: str) -> list[list[str]]:
    """The commands of the fenced code blocks of a markdown ``text``, split into words: comments dropped, lines joined
    where they end in a backslash, ``a && b``, ``a; b`` and ``a | b`` taken apart, leading ``NAME=value`` settings
    dropped. Blocks of YAML or Python and lines that shlex cannot split (prose in a text block) are left out."""
    commands = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        if language not in ("", "bash", "sh", "shell", "console"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line.removeprefix("$ "), comments=True)
            except ValueError:
                continue
            command: list[str] = []
            for word in [*words, ";"]:
                if word in ("&&", "||", ";", "|"):
                    while command and re.match(r"^[A-Z_]+=", command[0]):
                        command.pop(0)
                    if command:
                        commands.append(command)
                    command = []
                else:
                    command.append(word)
    return commands


def tool_and_arguments(command: list[str]) -> tuple[str, list[str]] | None:
    """The repository file a command runs (``train.py``, ``lab/experiment.py``, ``results/.../x.py``) and its
    arguments; None for a command of another program."""
    if command[0] not in ("python", "python3") or len(command) < 2:
        return None
    if command[1] == "-m" and len(command) > 2 and command[2].startswith("lab."):
        return command[2].replace(".", "/") + ".py", command[3:]
    if command[1].endswith(".py"):
        return command[1], command[2:]
    return None


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", read("Makefile"), flags=re.MULTILINE))


def command_problems(command: list[str]) -> list[str]:
    """What keeps a command of this repository's tools from running as written: a missing script or module, arguments
    its docopt usage refuses, a named config that does not exist, an unknown make target. Nothing is run."""
    if command[0] == "make":
        return [f"no make target {target}" for target in command[1:] if "=" not in target and target not in make_targets()]
    found = tool_and_arguments(command)
    if found is None:
        return []
    script, arguments = found
    if not os.path.isfile(os.path.join(ROOT, script)):
        return [f"{script} does not exist"]
    problems = []
    for argument in arguments:
        path = argument.split("=", 1)[-1]
        if re.match(r"configs/[\w./-]+\.yaml$", path) and not os.path.isfile(os.path.join(ROOT, path)):
            problems.append(f"{path} does not exist")
    doc = ast.get_docstring(ast.parse(read(script)))
    if doc and "Usage:" in doc and not any(argument in ("-h", "--help") for argument in arguments):
        try:
            docopt(docopt_text(doc), arguments, help=False)
        except DocoptExit:
            problems.append(f"{script}'s usage does not accept {shlex.join(arguments)}")
    return problems


@pytest.mark.parametrize("page", [README_PATH, *DOC_PATHS, *RESULT_PAGES], ids=lambda path: os.path.relpath(path, ROOT))
def test_every_command_runs_as_written(page: str) -> None:
    problems = [
        f"{shlex.join(command)}: {problem}" for command in shell_commands(read(page)) for problem in command_problems(command)
    ]
    assert not problems, f"{os.path.relpath(page, ROOT)}:\n" + "\n".join(problems)


def test_the_command_check_catches_what_would_not_run() -> None:
    text = """```bash
python -m lab.experiment --config configs/poc_memory_env.yaml --seeds 0-2 --run-id ablations/poc/x  # fine
OMP_NUM_THREADS=1 python train.py --config=configs/missing.yaml && python -m lab.nothing
python enjoy.py --no-such-flag
make test-fast && make no-such-target
```
"""
    problems = [problem for command in shell_commands(text) for problem in command_problems(command)]
    assert problems == [
        "configs/missing.yaml does not exist",
        "lab/nothing.py does not exist",
        "enjoy.py's usage does not accept --no-such-flag",
        "no make target no-such-target",
    ]


def test_the_set_up_commands_say_the_same_everywhere() -> None:
    """The README and docs/installation.md give the same `make` lines (what each does and how long it takes): the two
    once said 4-15 and ~4 minutes for `make train`, 7-15 and ~15 for `make test`."""

    def make_lines(path: str) -> list[str]:
        with open(path, encoding="utf-8") as file:
            return [" ".join(line.split()) for line in file if re.match(r"make (train|test|test-fast)\s+#", line)]

    readme = make_lines(README_PATH)
    assert [line.split()[1] for line in readme] == ["train", "test", "test-fast"], readme
    assert make_lines(os.path.join(ROOT, "docs", "installation.md")) == readme
