"""The layout stays as the issue drew it: the top level holds the entry points and the training core (at most 20
files), the research tools live in the package lab/ (each run as ``python -m lab.<tool>``), the core imports nothing
from the lab, and no module imports itself round a circle, not even through an import inside a function.

The import graph is read from the source with ``ast``: every ``import`` and ``from ... import`` of a repository module,
at module level and inside functions, of every .py file of the repository (tests and results/ scripts included).
"""

from __future__ import annotations

import ast
import glob
import os
import pathlib
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_TOP_LEVEL = 20
CORE_PACKAGES = ("memories", "environments")  # with the top-level modules: the training core
LAB = "lab"
SKIPPED_FOLDERS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "summaries", "models", "plots"}


def repository_files() -> list[str]:
    """Every .py file of the repository, as a path relative to the root ("lab/plot.py")."""
    files = []
    for folder, folders, names in os.walk(ROOT):
        folders[:] = sorted(name for name in folders if name not in SKIPPED_FOLDERS)
        files += [os.path.relpath(os.path.join(folder, name), ROOT) for name in names if name.endswith(".py")]
    return sorted(files)


def module_file(module: str, search: list[str]) -> str | None:
    """The repository file of a dotted module name (a module or a package's __init__.py) found from the folders
    ``search`` (relative to the root, "" for the root), or None for a module from outside the repository."""
    for folder in search:
        base = os.path.join(folder, *module.split("."))
        for candidate in (f"{base}.py", os.path.join(base, "__init__.py")):
            if os.path.isfile(os.path.join(ROOT, candidate)):
                return os.path.normpath(candidate)
    return None


def search_path(path: str) -> list[str]:
    """Where the imports of a file are looked up: the repository root (from which the scripts and ``python -m lab.x``
    run), and first the file's own folder where that is no package (tests/ and results/ scripts import their
    neighbours as top-level modules)."""
    folder = os.path.dirname(path)
    if folder and not os.path.isfile(os.path.join(ROOT, folder, "__init__.py")):
        return [folder, ""]
    return [""]


def package_of(path: str) -> str:
    """The dotted package a file belongs to ("lab" for lab/plot.py and lab/__init__.py, "" at the top level)."""
    return os.path.dirname(path).replace(os.sep, ".")


def imports_of(path: str) -> set[str]:
    """The repository files that ``path`` imports, at module level or inside a function or class."""
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), filename=path)
    search, imported = search_path(path), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the file's package, one level up per extra dot
                parts = package_of(path).split(".") if package_of(path) else []
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module
            # "from package import name": name is a submodule where such a file exists, else a name of the package
            modules = [f"{base}.{alias.name}" if module_file(f"{base}.{alias.name}", search) else base for alias in node.names]
        else:
            continue
        for module in modules:
            target = module_file(module, search)
            if target is not None and target != path:
                imported.add(target)
    return imported


def import_graph() -> dict[str, set[str]]:
    return {path: imports_of(path) for path in repository_files()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as its nodes in order, the first repeated at the end (["a", "b", "a"]), or None."""
    state: dict[str, str] = {}  # node -> "open" while on the current path, "done" once all its successors are
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == "open":
                return [*path[path.index(successor) :], successor]
            if successor not in state:
                cycle = visit(successor)
                if cycle:
                    return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def is_core(path: str) -> bool:
    return os.sep not in path or path.split(os.sep)[0] in CORE_PACKAGES


def test_the_cycle_finder_finds_circles_and_only_circles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"d": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None  # a diamond is no circle


def test_imports_are_read_at_module_and_function_level(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A circle that a function-level import hides is a circle: the graph of a synthetic repository holds both edges.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "one.py").write_text("from pkg import two\n")
    (tmp_path / "pkg" / "two.py").write_text("def later():\n    from pkg.one import thing\n")
    (tmp_path / "top.py").write_text("import os\nfrom pkg.two import later\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    graph = import_graph()
    assert graph == {
        "pkg/__init__.py": set(),
        "pkg/one.py": {"pkg/two.py"},
        "pkg/two.py": {"pkg/one.py"},
        "top.py": {"pkg/two.py"},
    }
    assert find_cycle(graph) == ["pkg/one.py", "pkg/two.py", "pkg/one.py"]


def test_the_graph_sees_the_repository() -> None:
    graph = import_graph()
    assert "lab/experiment.py" in graph["lab/panel.py"]
    assert "memories/base.py" in graph["memories/trxl.py"] and "transformer.py" in graph["memories/trxl.py"]
    assert {"memories/__init__.py", "memories/base.py"} <= graph["model.py"]


def test_no_import_circles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, (
        f"import circle {' -> '.join(cycle)}: move the helper that closes it into the module it belongs to "
        "(not into a function-level import)"
    )


def test_the_core_imports_nothing_from_the_lab() -> None:
    graph = import_graph()
    offending = sorted(
        f"{path} imports {target}"
        for path, targets in graph.items()
        if is_core(path)
        for target in targets
        if target.split(os.sep)[0] == LAB
    )
    assert not offending, offending


def test_the_top_level_holds_only_entry_points_and_the_core() -> None:
    top = sorted(os.path.basename(path) for path in glob.glob(os.path.join(ROOT, "*.py")))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} modules at the top level, at most {MAX_TOP_LEVEL}: {top}"


def test_every_lab_tool_says_how_it_is_run() -> None:
    # A tool of the lab is a module with a command line; its usage lines run it as `python -m lab.<tool>`.
    tools = 0
    for path in sorted(glob.glob(os.path.join(ROOT, LAB, "*.py"))):
        source = open(path, encoding="utf-8").read()
        if 'if __name__ == "__main__":' not in source:
            continue
        tools += 1
        name = f"{LAB}.{os.path.basename(path)[:-3]}"
        usage = re.search(r"Usage:\n((?:  .+\n)+)", ast.get_docstring(ast.parse(source)) + "\n")
        assert usage, f"{path} has no usage text"
        for line in usage.group(1).splitlines():
            assert line.strip().startswith(f"python -m {name} "), f"{name}: usage line '{line.strip()}'"
    assert tools >= 5
