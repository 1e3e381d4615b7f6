"""The browser client's ES modules import each other without a circle: each module can be read (and
loaded) after the ones it imports."""

from __future__ import annotations

import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

JS = Path(__file__).resolve().parents[2] / "web" / "js"
IMPORT = re.compile(r'^import\s[^;]*?from\s+"\./([\w.-]+\.js)";', re.MULTILINE | re.DOTALL)


def _imports() -> dict[str, set[str]]:
    return {path.name: set(IMPORT.findall(path.read_text())) for path in sorted(JS.glob("*.js"))}


def test_every_import_names_a_module_of_the_client() -> None:
    graph = _imports()
    assert len(graph) > 10 and sum(map(len, graph.values())) > 20  # the pattern finds the imports
    missing = {(m, d) for m, deps in graph.items() for d in deps if d not in graph}
    assert missing == set()


def test_the_modules_import_each_other_without_a_circle() -> None:
    try:
        order = list(TopologicalSorter(_imports()).static_order())
    except CycleError as exc:
        raise AssertionError(f"web/js imports in a circle: {' -> '.join(exc.args[1])}") from None
    assert set(order) == set(_imports())
