"""Every ```python block of the main README and of this package's README, run as written.

Each block runs on its own (a fresh namespace: a reader copies one block, not the page), against
the session's own redis-server: the blocks name ``redis://127.0.0.1:6379``, which is replaced by
its URL. A block that cannot run must not be fenced ```python (``crates/tollgate-server/tests/
readme_commands.rs`` checks that no other page holds Python blocks).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Tuple

import pytest

REPO = Path(__file__).resolve().parents[3]
PAGES = [REPO / "README.md", REPO / "crates" / "tollgate-py" / "README.md"]
DOCUMENTED_URL = "redis://127.0.0.1:6379"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def blocks() -> List[Tuple[str, str]]:
    """(page:line, code) of every Python block."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(REPO)}:{line}", match.group(1)))
    return found


BLOCKS = blocks()


def test_readme_has_python_blocks() -> None:
    pages = {place.split(":")[0] for place, _ in BLOCKS}
    assert pages == {str(page.relative_to(REPO)) for page in PAGES}, pages


@pytest.mark.parametrize("place, code", BLOCKS, ids=[place for place, _ in BLOCKS])
def test_readme_block_runs(place: str, code: str, redis_url: str) -> None:
    assert DOCUMENTED_URL in code or "redis_url" not in code, f"{place}: name Redis as {DOCUMENTED_URL}"
    exec(compile(code.replace(DOCUMENTED_URL, redis_url), place, "exec"), {"__name__": "__readme__"})
