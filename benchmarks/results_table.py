"""The Benchmarks page's figures, rendered from ``benchmarks/results/*.json`` (what each
benchmark's last real run wrote, see ``harness.emit``): an MkDocs hook (``mkdocs.yml``) that puts
the table where the page says ``<!-- benchmark results -->``. A benchmark with no file yet is
listed as not measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MARK = "<!-- benchmark results -->"


def _scalars(figures: dict[str, Any]) -> str:
    """The benchmark's top-level numbers and words, then its goals when it states them."""
    shown = [
        f"{k}: {v}" for k, v in figures.items() if isinstance(v, (int, float, str, bool)) and k != "benchmark"
    ]
    goals = figures.get("goals")
    if isinstance(goals, dict):
        shown.append("goals: " + ", ".join(f"{k} {v}" for k, v in goals.items()))
    return "; ".join(shown) or "(rows: see every figure below)"


def table(results: Path = HERE / "results") -> str:
    """Markdown: a row per benchmark script (date, machine, headline figures), then every file in full."""
    scripts = sorted(
        p.stem
        for p in HERE.glob("*.py")
        if p.name != Path(__file__).name and "harness.emit(" in p.read_text()
    )
    rows, details = ["| benchmark | measured | on | figures |", "|---|---|---|---|"], []
    for name in scripts:
        path = results / f"{name}.json"
        if not path.exists():
            rows.append(f"| `{name}` | not measured yet | | |")
            continue
        kept = json.loads(path.read_text(encoding="utf-8"))
        rows.append(f"| `{name}` | {kept['date']} | {kept['machine']} | {_scalars(kept['figures'])} |")
        details.append(
            f'??? note "{name}: every figure"\n    ```json\n'
            + "\n".join("    " + line for line in json.dumps(kept["figures"], indent=1).splitlines())
            + "\n    ```"
        )
    return "\n".join(rows) + "\n\n" + "\n\n".join(details)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """The MkDocs hook: the table in place of the mark."""
    return markdown.replace(MARK, table()) if MARK in markdown else markdown
