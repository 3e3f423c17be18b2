"""Secrets reach workers without leaving a trace in Ray's records.

A private one-node Ray *with* the dashboard, because the state API (``ray list actors --detail``,
``list_jobs``) is one of the places a runtime_env shows up in plain text. The leak search covers
the state API (actors, jobs, tasks), the GCS job and actor tables, and every file under the
session's folder (logs, including ``runtime_env_agent.log``). The negative control passes a second
secret the ordinary way (a runtime_env) and must be found, which shows the search can fail.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from rlinfra import Cluster, ComponentPlacement, Worker
from rlinfra.placement import PlacementError
from rlinfra.placement.config import parse_secret_specs
from rlinfra.runtime.hosting import WorkerContext
from rlinfra.runtime.secrets import SecretError, SecretsChannel, read_secrets

pytestmark = pytest.mark.timeout(180)

TOKEN = f"rlinfra-env-secret-{uuid.uuid4().hex}"  # from the driver's environment
FILE_TOKEN = f"rlinfra-file-secret-{uuid.uuid4().hex}"  # from a file, exposed as env
CONTROL = f"rlinfra-control-secret-{uuid.uuid4().hex}"  # negative control, via runtime_env
TOKEN_VAR = "RLINFRA_TEST_HF_TOKEN"
FLUSH_S = 20.0


def digest(value: str | None) -> str:
    return hashlib.sha256((value or "").encode()).hexdigest()


class Reader(Worker):
    def __init__(self) -> None:
        self.digest_at_init = digest(self.secret("HF_TOKEN"))  # usable in the constructor already

    def digests(self) -> dict[str, str]:
        self.log_info(f"rank {self._rank} has {len(self.secret('HF_TOKEN'))} characters of token")
        return {
            "init": self.digest_at_init,
            "HF_TOKEN": digest(self.secret("HF_TOKEN")),
            "WANDB_API_KEY": digest(self.secret("WANDB_API_KEY")),
            "env WANDB_API_KEY": digest(os.environ.get("WANDB_API_KEY")),
            "env HF_TOKEN": digest(os.environ.get("HF_TOKEN")),
        }

    def missing(self) -> str:
        try:
            self.secret("NOPE")
        except KeyError as error:
            return str(error)
        return ""


@ray.remote(num_cpus=0.1)
class PlainActor:
    def length(self) -> int:
        return len(os.environ["CONTROL_TOKEN"])


@pytest.fixture(scope="module")
def cluster_cfg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    key_file = tmp_path_factory.mktemp("secrets") / "wandb_key"
    key_file.write_text(FILE_TOKEN + "\n")
    key_file.chmod(0o600)
    yield {
        "num_nodes": 1,
        "secrets": {
            "HF_TOKEN": {"from_env": TOKEN_VAR},
            "WANDB_API_KEY": {"from_file": str(key_file), "expose_as_env": True},
        },
        "component_placement": {"reader": {"node_group": "node", "placement": "0:0-1"}},
    }


@pytest.fixture(scope="module")
def cluster(cluster_cfg: dict) -> Iterator[Cluster]:
    ray.init(address="local", num_cpus=4, include_dashboard=True, logging_level="warning")
    try:
        live = Cluster(cluster_cfg=cluster_cfg)  # attaches to the Ray above
        # Set after Ray started, so that workers cannot inherit it from the raylet's environment.
        os.environ[TOKEN_VAR] = TOKEN
        yield live
    finally:
        os.environ.pop(TOKEN_VAR, None)
        ray.shutdown()


def leak_sites(value: str) -> list[str]:
    """Every place among Ray's records and files where ``value`` appears in plain text."""
    from ray.util.state import list_actors, list_jobs, list_tasks

    address = ray.get_runtime_context().gcs_address
    sites = []
    records = {
        "state API: actors": lambda: list_actors(address=address, detail=True),
        "state API: jobs": lambda: list_jobs(address=address, detail=True),
        "state API: tasks": lambda: list_tasks(address=address, detail=True),
        "GCS actor table": ray._private.state.actors,
        "GCS job table": ray._private.state.state.job_table,
    }
    for name, read in records.items():
        if value in repr(read()):
            sites.append(name)
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    needle = value.encode()
    for path in session.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                sites.append(str(path.relative_to(session)))
        except OSError:
            continue  # sockets, files removed while searching
    return sites


def test_secrets_reach_workers_and_leave_no_trace(cluster: Cluster) -> None:
    placement = ComponentPlacement({"cluster": cluster.config}, cluster)
    group = Reader.create_group().launch(
        cluster, placement.get_strategy("reader"), name="reader", num_cpus=0.1
    )
    try:
        for seen in group.digests().wait():
            assert seen["init"] == seen["HF_TOKEN"] == digest(TOKEN)
            assert seen["WANDB_API_KEY"] == seen["env WANDB_API_KEY"] == digest(FILE_TOKEN)
            assert seen["env HF_TOKEN"] == digest(None)  # not exposed: self.secret() only
        assert (
            group.missing().wait()[0]
            == "\"no secret 'NOPE' in this worker; secrets: HF_TOKEN, WANDB_API_KEY\""
        )
        assert "WANDB_API_KEY" not in os.environ  # exposed in the workers, not in the driver

        # Negative control: the same kind of value passed the way rlinfra avoids. It must be found,
        # and finding it bounds how long records and logs take to be written.
        control = PlainActor.options(runtime_env={"env_vars": {"CONTROL_TOKEN": CONTROL}}).remote()
        assert ray.get(control.length.remote(), timeout=60) == len(CONTROL)
        deadline = time.monotonic() + FLUSH_S
        while not {"state API: actors", "logs/runtime_env_agent.log"} <= set(found := leak_sites(CONTROL)):
            assert time.monotonic() < deadline, f"the control secret was found only in {found}"
            time.sleep(0.5)
        ray.kill(control)

        assert leak_sites(TOKEN) == []
        assert leak_sites(FILE_TOKEN) == []
    finally:
        group.shutdown()


def test_a_missing_secret_fails_before_anything_starts(cluster: Cluster, cluster_cfg: dict) -> None:
    cfg = {**cluster_cfg, "secrets": {"HF_TOKEN": {"from_env": "RLINFRA_TEST_UNSET_VARIABLE"}}}
    missing = Cluster(cluster_cfg=cfg)  # attaches to the same Ray, with another config
    placement = ComponentPlacement({"cluster": cfg}, missing)
    before = len(ray._private.state.actors())
    with pytest.raises(SecretError, match="RLINFRA_TEST_UNSET_VARIABLE is not set on the driver"):
        Reader.create_group().launch(missing, placement.get_strategy("reader"), name="unset")
    assert len(ray._private.state.actors()) == before


def test_the_channel_and_context_do_not_show_values(cluster: Cluster) -> None:
    channel = SecretsChannel(ray.put({"HF_TOKEN": TOKEN}), ("HF_TOKEN",))
    assert TOKEN not in repr(channel) and "HF_TOKEN" in repr(channel)
    placement = ComponentPlacement({"cluster": cluster.config}, cluster).get_placements("reader")[0]
    assert TOKEN not in repr(WorkerContext("reader", placement, secrets=channel))


# --- parsing and reading (no Ray needed) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("secrets", "fragment"),
    [
        ({"HF_TOKEN": {}}, "exactly one source"),
        ({"HF_TOKEN": {"from_env": "A", "from_file": "/b"}}, "exactly one source"),
        ({"HF_TOKEN": {"from_env": "A", "value": "x"}}, "unknown key 'value'"),
        (
            {"HF_TOKEN": {"from_env": "A", "expose_as_env": "yes"}},
            "expose_as_env: expected true or false",
        ),
        ({"HF-TOKEN": {"from_env": "A"}}, "bad secret name"),
        (["HF_TOKEN"], "expected a mapping"),
    ],
)
def test_bad_secrets_sections(secrets: object, fragment: str) -> None:
    with pytest.raises(PlacementError) as caught:
        parse_secret_specs(secrets)
    assert fragment in str(caught.value)


def test_reading_names_the_source_never_the_value(tmp_path: Path) -> None:
    specs = parse_secret_specs({"A": {"from_env": "VAR_A"}, "B": {"from_file": str(tmp_path / "b")}})
    (tmp_path / "b").write_text("  file-value\n")
    assert read_secrets(specs, {"VAR_A": "env-value"}) == {"A": "env-value", "B": "file-value"}
    with pytest.raises(SecretError, match="VAR_A is empty"):
        read_secrets(specs, {"VAR_A": ""})
    (tmp_path / "b").unlink()
    with pytest.raises(SecretError) as caught:
        read_secrets(specs, {"VAR_A": "env-value"})
    assert "secret 'B': cannot read" in str(caught.value) and "env-value" not in str(caught.value)
