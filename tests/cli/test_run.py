"""``rlinfra run``: entrypoint resolution, overrides and exit status, without starting Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlinfra.cli.main import app

pytestmark = pytest.mark.timeout(60)

SEEN: dict = {}


def fake_job(cfg, *, resume: bool = False) -> int:
    """An entrypoint that reports what it was given and exits with a status of its choosing."""
    SEEN.update(json.loads(json.dumps(dict(cfg.algo))), resume=resume)
    return int(cfg.algo.status)


def _config(tmp_path: Path, entrypoint: str | None) -> Path:
    run = f"run:\n  entrypoint: {entrypoint}\n" if entrypoint is not None else ""
    path = tmp_path / "job.yaml"
    path.write_text(run + "cluster:\n  num_nodes: 1\n  component_placement:\n    a: 0\nalgo:\n  status: 0\n")
    return path


def test_calls_the_entrypoint_with_overrides_and_returns_its_status(tmp_path: Path) -> None:
    SEEN.clear()
    config = _config(tmp_path, "tests.cli.test_run:fake_job")
    result = CliRunner().invoke(app, ["run", str(config), "algo.status=7", "algo.lr=0.5", "--resume"])
    assert result.exit_code == 7, result.output
    assert SEEN == {"status": 7, "lr": 0.5, "resume": True}


@pytest.mark.parametrize(
    ("entrypoint", "message"),
    [
        (None, "run.entrypoint: expected 'package.module:function', got None"),
        ("no_colon_here", "expected 'package.module:function'"),
        ("no_such_package.job:main", "cannot import 'no_such_package.job'"),
        ("tests.cli.test_run:missing", "has no function 'missing'"),
    ],
)
def test_a_bad_entrypoint_is_a_usage_error(tmp_path: Path, entrypoint: str | None, message: str) -> None:
    result = CliRunner().invoke(app, ["run", str(_config(tmp_path, entrypoint))])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_malformed_override_is_a_usage_error(tmp_path: Path) -> None:
    config = _config(tmp_path, "tests.cli.test_run:fake_job")
    result = CliRunner().invoke(app, ["run", str(config), "algo.status"])
    assert result.exit_code == 2
    assert "algo.status" in result.output


def test_show_config_lists_every_key_of_the_jobs_schema_and_starts_nothing():
    bandit = Path(__file__).resolve().parents[2] / "examples" / "bandit" / "bandit.yaml"
    shown = CliRunner().invoke(
        app, ["run", str(bandit), "--show-config", "algo.pulls=32"], env={"COLUMNS": "250"}
    )
    assert shown.exit_code == 0, shown.output
    rows = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines() if line.count("│") > 3}
    assert {"run.checkpoint_every", "run.transport", "algo.iterations", "algo.pulls", "algo.target"} <= set(
        rows
    )
    assert [cell.strip() for cell in rows["algo.pulls"].split("│")[2:5]] == ["32", "64", "int"]
    assert (
        "≥ 1" in rows["run.checkpoint_every"]
        and "iterations between checkpoints" in rows["run.checkpoint_every"]
    )
    assert "'object_store', 'object_store_shared'" in rows["run.transport"]
    refused = CliRunner().invoke(app, ["run", str(bandit), "--show-config", "algo.pullz=32"])
    assert refused.exit_code == 2 and "unknown key 'pullz'; did you mean 'pulls'?" in refused.stderr
