"""The documentation cannot rot: the site builds strictly (broken links and missing pages fail),
every Python block compiles, every YAML block with a ``cluster`` section is planned by
``rlinfra plan`` (or refused, where the page says it is), every ``rlinfra`` command shown exists,
every troubleshooting entry quotes a message its source file still raises, and no page speaks
of the project's history."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlinfra.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```(?P<lang>\w*)[^\n]*\n(?P<body>.*?)\n```", re.S)
REFUSED = "<!-- refused -->"  # on the line before a block that shows a config rlinfra refuses
HISTORY = re.compile(
    r"\bissue\s+#?\d+|before (?:this|the) (?:change|split)|\bused to be\b|earlier sessions?|this session",
    re.I,
)


def _blocks(lang: str) -> list[tuple[str, str, str]]:
    """(page, the line before, body) of every fenced block in ``lang``."""
    return [
        (page.name, match["before"], match["body"])
        for page in PAGES
        for match in BLOCK.finditer(page.read_text(encoding="utf-8"))
        if match["lang"] == lang
    ]


@pytest.mark.timeout(300)
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8").count("start_trainer") > 0
    benchmarks = (tmp_path / "site" / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "benchmark results -->" not in benchmarks and "<code>weight_sync</code>" in benchmarks


def test_every_benchmark_result_names_its_benchmark_date_and_machine() -> None:
    """``benchmarks/results/*.json``: what a real run wrote (``harness.emit``), for the docs' table."""
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        kept = json.loads(path.read_text(encoding="utf-8"))
        assert kept.keys() == {"date", "machine", "figures"} and kept["figures"]["benchmark"] == path.stem
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", kept["date"]) and "CPUs" in kept["machine"]


@pytest.mark.parametrize(("page", "before", "body"), _blocks("python"))
def test_every_python_block_compiles(page: str, before: str, body: str) -> None:
    compile(body, f"{page}: python block", "exec")


@pytest.mark.parametrize(
    ("page", "before", "body"), [b for b in _blocks("yaml") if "\ncluster:" in "\n" + b[2]]
)
def test_every_cluster_config_shown_is_planned_or_refused_as_the_page_says(
    page: str, before: str, body: str, tmp_path: Path
) -> None:
    config = tmp_path / "shown.yaml"
    config.write_text(body, encoding="utf-8")
    result = CliRunner().invoke(app, ["plan", str(config)])
    refused = REFUSED in before
    assert (result.exit_code == 2) if refused else (result.exit_code == 0), (
        f"{page}:\n{body}\n{result.output}"
    )


def _commands() -> list[tuple[str, str]]:
    shown = {
        (page, line.split()[1])
        for page, _, body in _blocks("console") + _blocks("bash") + _blocks("sh")
        for line in (text.removeprefix("$ ").strip() for text in body.splitlines())
        if line.startswith("rlinfra ") and len(line.split()) > 1 and line.split()[1][0] not in "[-"
    }
    return sorted(shown)


@pytest.mark.parametrize(("page", "command"), _commands())
def test_every_rlinfra_command_shown_exists(page: str, command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0, f"{page}: rlinfra {command}: {result.output}"


TROUBLE = re.compile(r"<!-- raised by (?P<source>\S+): (?P<fragment>.+?) -->")


def test_the_troubleshooting_page_quotes_at_least_12_messages_the_code_raises() -> None:
    text = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    entries = [(m["source"], m["fragment"], m.end()) for m in TROUBLE.finditer(text)]
    assert len(entries) >= 12
    for source, fragment, at in entries:
        assert fragment in (ROOT / source).read_text(encoding="utf-8"), (
            f"{source} no longer says {fragment!r}"
        )
        shown = text[at : text.find("<!-- raised by", at) if "<!-- raised by" in text[at:] else len(text)]
        assert fragment in shown, f"the page's message for {source} does not show {fragment!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_page_speaks_of_the_projects_history(page: Path) -> None:
    found = HISTORY.findall(page.read_text(encoding="utf-8"))
    assert not found, f"{page.name}: {found} (history goes to CHANGELOG.md)"


GENERATED = "<!-- generated by: typer rlinfra.cli.main utils docs --name rlinfra -->"


def test_the_cli_reference_is_what_the_app_says(tmp_path: Path) -> None:
    """``docs/cli.md`` below its marker is typer's own rendering of the app, regenerated here."""
    typer = Path(sys.executable).with_name("typer")
    out = tmp_path / "cli.md"
    made = subprocess.run(
        [str(typer), "rlinfra.cli.main", "utils", "docs", "--name", "rlinfra", "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert GENERATED in page
    assert page.split(GENERATED, 1)[1].strip() == out.read_text(encoding="utf-8").strip()


def test_every_public_name_states_its_contract() -> None:
    """What ``rlinfra`` and ``rlinfra.driver`` export has a docstring of its own (the API page)."""
    import inspect

    import rlinfra
    import rlinfra.driver

    for module in (rlinfra, rlinfra.driver):
        for name in module.__all__:
            exported = getattr(module, name)
            if inspect.isclass(exported) or inspect.isfunction(exported):
                assert (exported.__doc__ or "").strip(), f"{module.__name__}.{name} has no docstring"


def test_the_plan_picture_is_what_rlinfra_plan_draws(tmp_path: Path) -> None:
    """README's picture: ``rlinfra plan examples/ppo_cartpole/disaggregated.yaml --svg``, now."""
    drawn = tmp_path / "plan.svg"
    config = ROOT / "examples" / "ppo_cartpole" / "disaggregated.yaml"
    assert CliRunner().invoke(app, ["plan", str(config), "--svg", str(drawn)]).exit_code == 0
    assert drawn.read_text(encoding="utf-8") == (ROOT / "docs" / "assets" / "plan.svg").read_text(
        encoding="utf-8"
    )
