"""mkdocs hooks (``hooks:`` in mkdocs.yml) that put the figures and the results' READMEs on the docs site.

The pages link figures, result files, the results' READMEs and configs relative to the repository
(``../results/memories/poc/poc-memories.png``), so that they open on GitHub and in a checkout. mkdocs copies only what
is inside docs/, so these hooks copy each file of results/ and configs/ that a page links into the site, at the same
path; a linked README.md becomes a page of the site, and what it links is copied in turn. Each page's links are then
pointed at the copies. mkdocs loads this file by its path, so it imports nothing of the project.
"""

from __future__ import annotations

import glob
import os
import posixpath
import re

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COPIED = ("results", "configs")  # the folders beside docs/ whose linked files the site gets
# A relative link's target, without its anchor (a link with a scheme, such as https:, is left out)
LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:)([^)#\s]+)(#[^)\s]*)?\)")


def link_targets(page: str) -> set[str]:
    """The files that the relative links of the markdown file ``page`` point at, as absolute paths."""
    with open(page, encoding="utf-8") as file:
        targets = LINK.findall(file.read())
    return {os.path.normpath(os.path.join(os.path.dirname(page), target)) for target, _ in targets}


def linked_files(docs_dir: str) -> set[str]:
    """The files of results/ and configs/ that the pages link, and those that the linked READMEs link in turn
    (folders, which a site cannot show, left out).

    :param docs_dir: the folder of the pages
    :return: their paths relative to the repository root, e.g. "results/memories/poc/poc-memories.png"
    """
    linked: set[str] = set()
    to_read = glob.glob(os.path.join(docs_dir, "*.md"))
    while to_read:
        for target in link_targets(to_read.pop()):
            path = os.path.relpath(target, ROOT)
            if path.split(os.sep)[0] in COPIED and os.path.isfile(target) and path not in linked:
                linked.add(path)
                if path.endswith(".md"):
                    to_read.append(target)
    return {path.replace(os.sep, "/") for path in linked}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """mkdocs' files event: the site's files, with each linked file of results/ and configs/ added."""
    for path in sorted(linked_files(config["docs_dir"])):
        files.append(File(path, src_dir=ROOT, dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"]))
    return files


def site_path(target: str, docs_dir: str, copied: set[str]) -> str | None:
    """Where the file ``target`` (an absolute path) is in the site, relative to its root; None where it is not there."""
    if os.path.commonpath([target, docs_dir]) == docs_dir:
        return os.path.relpath(target, docs_dir).replace(os.sep, "/")
    path = os.path.relpath(target, ROOT).replace(os.sep, "/")
    return path if path in copied else None


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """mkdocs' page markdown event: the page with its links to files that the site holds pointed at them there."""
    # "../results/x.png" from docs/results.md is "results/x.png" in the site, where on_files put the copy; from
    # results/a/README.md, "../../docs/results.md" is "../../results.md"
    docs_dir, copied = os.path.abspath(config["docs_dir"]), linked_files(config["docs_dir"])
    folder = os.path.dirname(page.file.abs_src_path)

    def relink(link: re.Match) -> str:
        target = site_path(os.path.normpath(os.path.join(folder, link.group(1))), docs_dir, copied)
        if target is None:
            return link.group(0)
        return f"]({posixpath.relpath(target, posixpath.dirname(page.file.src_uri) or '.')}{link.group(2) or ''})"

    return LINK.sub(relink, markdown)
