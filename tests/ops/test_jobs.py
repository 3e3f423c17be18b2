"""``rlinfra.ops.jobs`` and ``rlinfra job``: against a real Ray head with the dashboard.

One head for the whole module (``ray start --head`` takes ~5-15 s and 670 MB on these machines):
loopback dashboard, its own temp dir and ports, token authentication on with a token of its own
(passed in ``RAY_AUTH_TOKEN``, so ``~/.ray/auth_token`` is neither read nor written), two logical
GPUs so that ``--require`` has something to compare. It is stopped by its process group, never
with ``ray stop``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from rlinfra.cli.main import app
from rlinfra.ops.jobs import (
    DEFAULT_ADDRESS,
    JobsClient,
    JobsError,
    auth_token,
    build_runtime_env,
    parse_requirements,
    resolve_address,
)
from rlinfra.placement.env_vars import credential_reason
from tests.ports import free_ports
from tests.processes import stop_process_group

pytest.importorskip("aiohttp", reason="the Jobs API needs ray[default] (the `jobs` extra)")

pytestmark = pytest.mark.ray_fixtures("head")  # the tests without the head start no Ray

HEAD_GPUS = 2
HEAD_CPUS = 2
START_TIMEOUT_S = 120.0
CONFIG = """\
cluster:
  num_nodes: 1
  component_placement:
    actor: all
runtime_env:
  env_vars:
    TOKENIZERS_PARALLELISM: "false"
"""


@dataclass(frozen=True)
class Head:
    address: str
    token: str
    process: subprocess.Popen


def _wait_until_ready(head: Head, log: Path) -> None:
    """The dashboard answers and reports an alive node with its GPUs, or the test session fails."""
    headers = {"Authorization": f"Bearer {head.token}"}
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if head.process.poll() is not None:
            pytest.fail(f"ray start --head exited with {head.process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            answer = requests.get(f"{head.address}/api/v0/nodes?detail=1", headers=headers, timeout=5)
            nodes = answer.json()["data"]["result"]["result"] if answer.status_code == 200 else []
            if any(node["state"] == "ALIVE" and node["resources_total"].get("GPU") for node in nodes):
                return
        except (requests.RequestException, ValueError, KeyError):
            pass
        time.sleep(0.5)
    pytest.fail(f"the Ray head did not come up within {START_TIMEOUT_S:g} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    temp_dir = tempfile.mkdtemp(prefix="rlj")
    token = secrets.token_hex(32)
    gcs, dashboard, client, agent = free_ports(4)
    bin_dir = Path(sys.executable).parent
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    # Jobs run `python` from the head's PATH: make it this interpreter.
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token
    )
    command = [
        str(bin_dir / "ray"), "start", "--head", "--block",
        "--node-ip-address=127.0.0.1", f"--port={gcs}", f"--temp-dir={temp_dir}",
        "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
        f"--ray-client-server-port={client}", f"--dashboard-agent-listen-port={agent}",
        f"--num-cpus={HEAD_CPUS}", f"--num-gpus={HEAD_GPUS}", "--disable-usage-stats",
    ]  # fmt: skip
    log = Path(temp_dir) / "ray-start.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    started = Head(f"http://127.0.0.1:{dashboard}", token, process)
    try:
        _wait_until_ready(started, log)
        yield started
    finally:
        stop_process_group(process)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def client(head: Head) -> JobsClient:
    return JobsClient(head.address, token=head.token)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "conf.yaml"
    path.write_text(CONFIG)
    return path


def invoke(head: Head, *args: str | Path):
    env = {"RAY_AUTH_TOKEN": head.token, "RAY_ADDRESS": None, "COLUMNS": "250", "NO_COLOR": "1"}
    return CliRunner().invoke(app, ["job", *map(str, args)], env=env)


def assert_user_error(result, *fragments: str) -> None:
    """Exit 2, the message on stderr, and no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def ray_job(head: Head, *args: str) -> subprocess.CompletedProcess[str]:
    """Ray's own ``ray job ...`` CLI against the head, with the token where Ray looks for it."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=head.token)
    command = [str(Path(sys.executable).parent / "ray"), "job", *args, "--address", head.address]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=90)


def job_ids(head: Head) -> set[str]:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(head.address, headers={"Authorization": f"Bearer {head.token}"})
    return {job.submission_id for job in client.list_jobs()}


def _wait_for_status(client: JobsClient, job_id: str, wanted: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (status := client.status(job_id)) != wanted:
        assert time.monotonic() < deadline, f"{job_id} is {status}, not {wanted}, after {timeout_s:g} s"
        time.sleep(0.2)


def new_id() -> str:
    return f"rlj-{uuid.uuid4().hex[:12]}"


# --- against the head ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_submit_follows_the_job_to_success(head: Head, config: Path, client: JobsClient) -> None:
    job_id = new_id()
    result = invoke(
        head, "submit", config, "--address", head.address, "--submission-id", job_id,
        "--require", f"GPU={HEAD_GPUS}", "--require", f"CPU={HEAD_CPUS}",
        "--", "python", "-c", "print('hello rlinfra')",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "hello rlinfra" in result.stdout
    assert f"{job_id}: SUCCEEDED" in result.stderr

    assert client.status(job_id) == "SUCCEEDED"
    # The rest is Ray's own CLI, on the same address and token (docs/operations.md says so).
    status = ray_job(head, "status", job_id)
    assert status.returncode == 0 and "succeeded" in status.stdout.lower(), status.stderr
    logs = ray_job(head, "logs", job_id)
    assert logs.returncode == 0 and "hello rlinfra" in logs.stdout, logs.stderr
    listed = ray_job(head, "list")
    assert listed.returncode == 0 and job_id in listed.stdout, listed.stderr


@pytest.mark.timeout(120)
def test_a_failing_job_exits_1_and_its_id_is_printed_without_wait(head: Head, config: Path) -> None:
    result = invoke(head, "submit", config, "--address", head.address, "--no-wait", "--", "exit 3")
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert JobsClient(head.address, token=head.token).wait(job_id, timeout_s=60) == "FAILED"

    waited = invoke(head, "submit", config, "--address", head.address, "--", "exit 3")
    assert waited.exit_code == 1
    assert "FAILED" in waited.stderr


@pytest.mark.timeout(120)
def test_following_ends_at_its_deadline_and_rays_cli_stops_the_job(
    head: Head, config: Path, client: JobsClient
) -> None:
    job_id = new_id()
    started = time.monotonic()
    followed = invoke(
        head, "submit", config, "--address", head.address, "--submission-id", job_id,
        "--timeout", "2", "--", "sleep", "60",
    )  # fmt: skip
    assert followed.exit_code == 0, followed.output
    assert f"{job_id} is still RUNNING after 2 s; stopped following it" in followed.stderr
    assert time.monotonic() - started < 30  # following ended at its deadline, the job did not
    stopped = ray_job(head, "stop", job_id)
    assert stopped.returncode == 0, stopped.stderr
    _wait_for_status(client, job_id, "STOPPED")


@pytest.mark.timeout(60)
def test_require_mismatch_refuses_with_the_diff_and_submits_nothing(
    head: Head, config: Path, client: JobsClient
) -> None:
    job_id = new_id()
    result = invoke(
        head, "submit", config, "--address", head.address, "--submission-id", job_id,
        "--require", "GPU=16", "--", "python", "-c", "print('never')",
    )  # fmt: skip
    assert_user_error(result, "does not have the resources", "GPU: required 16, Ray has 2 (-14)", "nothing")
    assert job_id not in job_ids(head)
    with pytest.raises(JobsError, match=r"GPU: required 16, Ray has 2"):
        client.require({"GPU": 16})
    client.require({"GPU": HEAD_GPUS})


@pytest.mark.timeout(60)
def test_credential_looking_env_is_refused_and_nothing_submitted(
    head: Head, config: Path, client: JobsClient
) -> None:
    before = job_ids(head)
    value = "hf_abcdefghijklmnopqrstuvwxyz123456"
    result = invoke(
        head, "submit", config, "--address", head.address, "--env", f"HF_TOKEN={value}", "--", "true"
    )
    assert_user_error(result, "--env HF_TOKEN", "secrets channel")
    assert value not in result.output
    url = invoke(
        head, "submit", config, "--address", head.address,
        "--env", "DATA_URL=https://user:hunter2@example.com/d", "--", "true",
    )  # fmt: skip
    assert_user_error(url, "DATA_URL", "user:password")
    assert "hunter2" not in url.output
    with pytest.raises(JobsError, match="WANDB_API_KEY"):
        client.submit("true", {"env_vars": {"WANDB_API_KEY": "abc123"}})
    assert job_ids(head) == before


@pytest.mark.timeout(120)
def test_runtime_env_recorded_by_ray_holds_no_secrets(
    head: Head, config: Path, client: JobsClient, tmp_path: Path
) -> None:
    from ray.job_submission import JobSubmissionClient

    work = tmp_path / "work"
    work.mkdir()
    (work / "main.py").write_text(
        "import os\nprint('env', os.environ['RLJ_MODE'], os.environ['TOKENIZERS_PARALLELISM'])\n"
    )
    job_id = new_id()
    result = invoke(
        head, "submit", config, "--address", head.address, "--submission-id", job_id,
        "--env", "RLJ_MODE=fast", "--working-dir", work, "--", "python", "main.py",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "env fast false" in result.stdout

    ray_client = JobSubmissionClient(head.address, headers={"Authorization": f"Bearer {head.token}"})
    info = ray_client.get_job_info(job_id)
    env_vars = info.runtime_env["env_vars"]
    assert env_vars == {"TOKENIZERS_PARALLELISM": "false", "RLJ_MODE": "fast"}
    assert all(credential_reason(name, value) is None for name, value in env_vars.items())
    assert head.token not in repr(info)
    assert info.metadata == {"rlinfra.config": "conf.yaml"}


@pytest.mark.timeout(60)
def test_errors_name_the_address_and_what_to_check(head: Head, config: Path) -> None:
    with pytest.raises(JobsError, match="token authentication and the token is missing"):
        JobsClient(head.address, token="")
    with pytest.raises(JobsError, match="token authentication and the token was refused"):
        JobsClient(head.address, token="0" * 64)
    with pytest.raises(JobsError, match="no job 'raysubmit_nope'"):
        JobsClient(head.address, token=head.token).status("raysubmit_nope")

    (closed,) = free_ports(1)
    refused = invoke(head, "submit", config, "--address", f"127.0.0.1:{closed}", "--", "true")
    assert_user_error(refused, f"http://127.0.0.1:{closed} (from --address)", "not the GCS address")


@pytest.mark.timeout(30)
def test_every_request_has_a_deadline() -> None:
    """A server that accepts connections but never answers: the client gives up on time."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(JobsError, match=r"did not answer within 1 s"):
            JobsClient(address, timeout_s=1.0, token="")
        assert time.monotonic() - started < 10


# --- without a cluster --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HF_TOKEN", "hf_x"),
        ("WANDB_API_KEY", "abc"),
        ("AWS_SECRET_ACCESS_KEY", "abc"),
        ("db-password", "pw"),
        ("OPENAI_APIKEY", "sk-1"),
        ("ANYTHING", "postgres://me:pw@db:5432/x"),
    ],
)
def test_credential_reason_refuses_credentials(name: str, value: str) -> None:
    assert credential_reason(name, value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TOKENIZERS_PARALLELISM", "false"),
        ("HF_TOKEN_PATH", "/secrets/hf"),
        ("WANDB_DISABLE_KEY", "1"),
        ("DATA_URL", "https://example.com/data"),
        ("MAX_TOKENS_PER_BATCH", "4096"),
    ],
)
def test_credential_reason_lets_ordinary_variables_through(name: str, value: str) -> None:
    assert credential_reason(name, value) is None


def test_parse_requirements() -> None:
    assert parse_requirements(["GPU=16", "CPU=2.5", "accel_type:H100=1"]) == {
        "GPU": 16.0,
        "CPU": 2.5,
        "accel_type:H100": 1.0,
    }
    for bad in ("GPU", "GPU=many", "GPU=-1", "=4", "GPU=nan"):
        with pytest.raises(JobsError, match="--require"):
            parse_requirements([bad])


def test_build_runtime_env_merges_config_and_flags(tmp_path: Path) -> None:
    env = build_runtime_env(
        {"B": "flag", "C": "3"}, tmp_path, {"env_vars": {"A": 1, "B": "config", "FLAG": True}}
    )
    assert env == {"env_vars": {"A": "1", "B": "flag", "FLAG": "1", "C": "3"}, "working_dir": str(tmp_path)}
    assert build_runtime_env() == {}
    with pytest.raises(JobsError, match=r"runtime_env\.pip: not supported"):
        build_runtime_env(config_runtime_env={"pip": ["torch"]})
    with pytest.raises(JobsError, match=r"config runtime_env\.env_vars: GITHUB_TOKEN"):
        build_runtime_env(config_runtime_env={"env_vars": {"GITHUB_TOKEN": "ghp_x"}})
    with pytest.raises(JobsError, match="not a directory"):
        build_runtime_env(working_dir=tmp_path / "missing")


def test_resolve_address_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    assert resolve_address() == (DEFAULT_ADDRESS, "the default")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:8265")
    assert resolve_address() == ("http://10.0.0.1:8265", "RAY_ADDRESS")
    assert resolve_address(None, {"address": "https://head:8265/"}) == (
        "https://head:8265",
        "cluster.address",
    )
    assert resolve_address("http://a:1", {"address": "b:2"}) == ("http://a:1", "--address")
    with pytest.raises(JobsError, match="Ray Client address"):
        resolve_address("ray://head:10001")


def test_auth_token_follows_rays_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-home\n")
    named = tmp_path / "token"
    named.write_text("from-path")
    assert auth_token({"HOME": str(home)}) == "from-home"
    assert auth_token({"HOME": str(home), "RAY_AUTH_TOKEN_PATH": str(named)}) == "from-path"
    assert (
        auth_token({"HOME": str(home), "RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(named)})
        == "from-env"
    )
    assert auth_token({"HOME": str(home), "RAY_AUTH_MODE": "disabled"}) is None
    assert auth_token({"HOME": str(tmp_path / "nobody")}) is None


def test_cli_user_errors_need_no_cluster(tmp_path: Path) -> None:
    config = tmp_path / "conf.yaml"
    config.write_text(CONFIG)
    runner = CliRunner()
    bad_require = runner.invoke(app, ["job", "submit", str(config), "--require", "GPU", "--", "true"])
    assert_user_error(bad_require, "--require 'GPU': expected NAME=VALUE")
    missing = runner.invoke(app, ["job", "submit", str(tmp_path / "nope.yaml"), "--", "true"])
    assert_user_error(missing, "no such file")
    secret = runner.invoke(app, ["job", "submit", str(config), "--env", "MY_SECRET=x", "--", "true"])
    assert_user_error(secret, "--env MY_SECRET")
