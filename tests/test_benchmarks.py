"""Every benchmark script runs: ``--smoke`` (``benchmarks/harness.py``) takes each one through its
own code path at its smallest size, as a user runs it (a subprocess from the repository root),
and its last line is one JSON object naming the benchmark and marked as a smoke run. Timings are
not asserted: a benchmark measures, the suite only keeps it from breaking unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import stop_process_group

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
    path for path in (ROOT / "benchmarks").glob("*.py") if 'if __name__ == "__main__":' in path.read_text()
)
SMOKE_TIMEOUT_S = 420  # the slowest (vllm_engine: vLLM started four times) takes about a third of it
pytestmark = [pytest.mark.ray, pytest.mark.timeout(SMOKE_TIMEOUT_S + 60)]


def test_every_benchmark_script_is_run_here():
    """The glob finds the scripts (not the helpers they share), so a new benchmark is run too."""
    assert {path.stem for path in SCRIPTS} >= {"weight_sync", "launch", "ppo_cartpole", "vllm_engine"}
    assert not {path.stem for path in SCRIPTS} & {"harness", "bundled_job", "noop_actors"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
def test_the_benchmark_runs_in_smoke_mode(script: Path):
    process = subprocess.Popen(
        [sys.executable, str(script), "--smoke"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # whatever it leaves behind is stopped with it
    )
    try:
        output, _ = process.communicate(timeout=SMOKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        stop_process_group(process)
        output, _ = process.communicate()
        pytest.fail(f"{script.name} --smoke ran past {SMOKE_TIMEOUT_S} s:\n{output[-3000:]}")
    finally:
        stop_process_group(process)
    assert process.returncode == 0, f"{script.name} --smoke exited {process.returncode}:\n{output[-3000:]}"
    last = output.strip().splitlines()[-1]
    figures = json.loads(last)
    assert figures["benchmark"] == script.stem and figures["smoke"] is True
