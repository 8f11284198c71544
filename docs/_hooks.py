"""mkdocs hook: links that leave docs/ work on GitHub and on the site.

The guides link to files outside ``docs/`` (``../RESULTS.md``, ``../research/...``, ``../benchmarks/...``), and the
results page (``RESULTS.md`` at the root, which this hook
puts in place of ``docs/results.md``) links to ``docs/...`` and to result files.
On the site, a link to RESULTS.md becomes the results page, one to a guide becomes the guide, and one to any other
file of the repository becomes that path as code (the site carries no data files). A link to a file that does not
exist in the repository is an error, so the strict build still catches broken links."""
from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.links")
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)|!\[([^\]]*)\]\(([^)\s]+)\)")


def on_page_markdown(markdown, page, config, files):
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    # results.md is RESULTS.md included whole: its links are relative to the repository root
    if page.file.src_uri == "results.md":
        markdown = (root / "RESULTS.md").read_text(encoding="utf-8")
    base = root if page.file.src_uri == "results.md" else (docs / page.file.src_uri).parent

    def fix(m):
        text, target = (m.group(1), m.group(2)) if m.group(2) else (m.group(3), m.group(4))
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        dest = (base / path).resolve()
        if dest == docs or docs in dest.parents:
            if base == docs:
                return m.group(0)
            rel = dest.relative_to(docs).as_posix()
            return f"[{text}]({rel}{'#' + anchor if anchor else ''})"
        if not dest.exists():
            log.warning("%s links to %s, which does not exist", page.file.src_uri, target)
            return m.group(0)
        if dest == root / "RESULTS.md":
            rel = Path("results.md") if base == docs else None
            return f"[{text}]({rel or 'results.md'}{'#' + anchor if anchor else ''})"
        if dest == root / "README.md":
            return f"[{text}](index.md)"
        shown = dest.relative_to(root).as_posix()
        return f"{text} (`{shown}`)" if m.group(2) else f"(`{shown}`)"

    return LINK.sub(fix, markdown)
