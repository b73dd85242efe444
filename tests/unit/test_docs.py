"""The docs stay true to the tree: every link resolves, and the variable table is env.VARIABLES'."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from arxtune.runtime.env import VARIABLES

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "results").glob("**/README.md"))]
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")
HEADING = re.compile(r"^#+ (.*)$", re.M)
ENV_BLOCK = re.compile(r"<!-- env:begin -->\n(.*?)<!-- env:end -->", re.S)
#: Pages the README links that are written alongside this one; each must exist once they are merged.
WRITTEN_ELSEWHERE = {"docs/bad-input.md"}
#: Inline code (`kernel[grid](...)`) is not a link.
CODE_SPAN = re.compile(r"`[^`\n]*`")


def env_table() -> str:
    """docs/runtime.md's table of variables, rendered from their declarations."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for v in VARIABLES.values():
        default = f"`{v.default}`" if v.default else ""
        rows.append(f"| `{v.name}` | {default} | {v.meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(rows) + "\n"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in HEADING.findall(page.read_text())}


def test_the_runtime_page_lists_every_variable_as_declared():
    block = ENV_BLOCK.search((ROOT / "docs" / "runtime.md").read_text())
    assert block, "docs/runtime.md has no <!-- env:begin --> ... <!-- env:end --> block"
    assert block.group(1) == env_table(), f"docs/runtime.md's variable table is stale; it should read:\n{env_table()}"


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for page in PAGES:
        for target, anchor in LINK.findall(CODE_SPAN.sub("", page.read_text())):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                if path.relative_to(ROOT).as_posix() not in WRITTEN_ELSEWHERE:
                    broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def committed_results_folders() -> list[Path]:
    """The folders under results/ that git tracks: what `make run` measured since is the user's, not the docs'.
    Outside a git checkout (an unpacked release), every folder there."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "results"], capture_output=True, timeout=60)
    if listed.returncode != 0:
        return sorted(p for p in (ROOT / "results").iterdir() if p.is_dir())
    names = {Path(f).parts[1] for f in listed.stdout.decode().split("\0") if f and len(Path(f).parts) > 2}
    return sorted(ROOT / "results" / name for name in names)


def test_every_results_folder_has_a_readme_and_a_line_in_the_index():
    index = (ROOT / "results" / "README.md").read_text()
    folders = committed_results_folders()
    assert folders
    for folder in folders:
        assert (folder / "README.md").is_file(), f"{folder.relative_to(ROOT)} has no README.md"
        assert f"]({folder.name}/README.md)" in index, f"results/README.md has no line for {folder.name}"
