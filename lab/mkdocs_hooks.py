"""mkdocs hooks (``hooks:`` in mkdocs.yml) that put the figures on the docs site.

The pages link figures, result files and configs relative to the repository
(``../results/memories/poc/poc-memories.png``), so that they open on GitHub and in a checkout. mkdocs copies only what is inside docs/, so these hooks copy each file of
results/ and configs/ that a page links into the site and point the page's links at the copy. mkdocs loads this file
by its path, so it imports nothing of the project.
"""

from __future__ import annotations

import glob
import os
import re

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A link from a page of docs/ to a file of a folder beside it; the anchor, if any, is not part of the path
LINK = re.compile(r"\]\(\.\./((?:results|configs)/[^)#\s]+)")


def linked_files(docs_dir: str) -> set[str]:
    """The files of results/ and configs/ that the pages link (folders, which a site cannot show, left out).

    :param docs_dir: the folder of the pages
    :return: their paths relative to the repository root, e.g. "results/memories/poc/poc-memories.png"
    """
    linked = set()
    for page in glob.glob(os.path.join(docs_dir, "*.md")):
        with open(page, encoding="utf-8") as file:
            linked.update(LINK.findall(file.read()))
    return {path for path in linked if os.path.isfile(os.path.join(ROOT, path))}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """mkdocs' files event: the site's files, with each linked file of results/ and configs/ added."""
    for path in sorted(linked_files(config["docs_dir"])):
        files.append(File(path, src_dir=ROOT, dest_dir=config["site_dir"], use_directory_urls=config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """mkdocs' page markdown event: the page with its links to the copied files pointed at the copies."""
    # "../results/x.png" from docs/results.md is "results/x.png" in the site, where on_files put the copy
    copied = linked_files(config["docs_dir"])
    return LINK.sub(lambda link: f"]({link.group(1)}" if link.group(1) in copied else link.group(0), markdown)
