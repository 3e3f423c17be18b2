"""The embedded Ray is reachable from this machine only, and only with the run's token.

On the module's simulated 2-node Ray (the rendezvous tests' Ray), with a torch process group and a
cross group up, every socket the run's processes listen on (Ray's GCS, raylets, agents, workers;
rlinfra's rendezvous store; gloo's pairs) is read from ``/proc`` and must be bound to loopback,
and a connection to any of those ports at the machine's own address is refused. A second process
without the token, or with another one, is refused by Ray; with the token it gets in (so the
refusal is the token's doing). The token is in no file of the run's Ray session (logs included).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray

from rlinfra import Worker
from rlinfra.runtime.process_groups import interface_of
from rlinfra.runtime.rendezvous import bring_up, bring_up_cross, tear_down, tear_down_cross
from tests.listeners import descendants, listeners_of, machine_address
from tests.ports import free_ports
from tests.processes import stop_process_group, wait_for_port

pytest.importorskip("torch")

CFG = {
    "cluster": {
        "num_nodes": 2,
        "simulate": "2x4",
        "component_placement": {"trainer": "0-1,4-5", "rollout": "2-3,6-7"},
    }
}
pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster(CFG), pytest.mark.ray]

CLIENT = """\
import sys, ray
try:
    ray.init(address=sys.argv[1], logging_level="error")
except ConnectionError as error:
    print("REFUSED", error)
else:
    print("CONNECTED", len(ray.nodes()))
"""


class Peer(Worker):
    def all_reduce_rank(self) -> float:
        import torch
        import torch.distributed as dist

        value = torch.tensor([float(self._rank + 1)])
        dist.all_reduce(value)
        return value.item()

    def cross_sum(self, name: str) -> float:
        import torch

        from rlinfra.runtime.process_groups import cross_group

        return cross_group(name).all_reduce(torch.tensor([1.0])).item()

    def pid(self) -> int:
        return os.getpid()

    def gloo_interface(self) -> str | None:
        return os.environ.get("GLOO_SOCKET_IFNAME")


@pytest.fixture(scope="module")
def groups_up(cluster, placement):
    trainer = Peer.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")
    rollout = Peer.create_group().launch(cluster, placement.get_strategy("rollout"), name="rollout")
    bring_up(trainer, timeout_s=30)
    cross = bring_up_cross("weights", [(trainer, [0]), (rollout, [0, 1, 2, 3])], timeout_s=30)
    yield trainer, rollout
    tear_down_cross(cross)
    tear_down(trainer)
    trainer.shutdown()
    rollout.shutdown()


def _gcs_port() -> int:
    return int(ray.get_runtime_context().gcs_address.rsplit(":", 1)[1])


def test_every_listener_of_the_run_is_on_loopback(groups_up):
    trainer, rollout = groups_up
    assert trainer.all_reduce_rank().wait() == [10.0] * 4
    remote = trainer.execute_on(0).cross_sum("weights")
    assert rollout.cross_sum("weights").wait(timeout=30) == [5.0] * 4 and remote.wait(timeout=30) == [5.0]
    assert trainer.gloo_interface().wait() == ["lo"] * 4  # gloo's pairs bind the node's interface

    listeners = listeners_of(descendants(os.getpid()))
    commands = {listener.command for listener in listeners}
    assert {"gcs_server", "raylet"} <= commands, f"the scan must see Ray's own servers: {commands}"
    assert _gcs_port() in {listener.port for listener in listeners}
    workers = set(trainer.pid().wait()) | set(rollout.pid().wait())
    assert len({listener.pid for listener in listeners} & workers) == len(workers)
    exposed = [str(listener) for listener in listeners if not listener.on_loopback]
    assert not exposed, f"listening beyond this machine: {exposed}"


def test_no_port_of_the_run_answers_at_the_machine_address(groups_up):
    address = machine_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    ports = sorted({listener.port for listener in listeners_of(descendants(os.getpid()))})
    assert ports
    answered = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.settimeout(2)
            code = probe.connect_ex((address, port))
            if code != errno.ECONNREFUSED:
                answered.append((port, errno.errorcode.get(code, code)))
    assert not answered, f"ports reachable at {address}: {answered}"


def _client(home: Path, token: str | None) -> subprocess.Popen:
    """A process of this machine's user with none of the run's settings: a fresh HOME (no
    ``~/.ray/auth_token``), ``token`` if given, and Ray's local-only switch so that it aims at
    loopback itself."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    home.mkdir()
    env.update(HOME=str(home), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    if token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    address = f"127.0.0.1:{_gcs_port()}"
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_client_without_the_runs_token_is_refused(cluster, tmp_path):
    token = os.environ["RAY_AUTH_TOKEN"]  # set for this run by the embedded Ray (LocalOnly)
    clients = {"no": _client(tmp_path / "a", None), "another": _client(tmp_path / "b", "0" * len(token))}
    admitted = _client(tmp_path / "c", token)
    outputs = {name: client.communicate(timeout=90) for name, client in clients.items()}
    for name, (out, err) in outputs.items():
        assert out.startswith("REFUSED"), f"a client with {name} token: {out}\n{err[-2000:]}"
        assert "Authentication token is missing or incorrect" in err
    out, err = admitted.communicate(timeout=90)
    assert out.strip() == "CONNECTED 2", err[-2000:]


def test_the_token_is_in_no_file_of_the_ray_session(groups_up):
    token = os.environ["RAY_AUTH_TOKEN"]
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    files = [path for path in session.rglob("*") if path.is_file() and not path.is_socket()]
    assert any(path.suffix in {".out", ".err", ".log"} for path in files)
    holding = [str(path) for path in files if token.encode() in path.read_bytes()]
    assert not holding
    assert not (Path.home() / ".ray" / "auth_token").exists() or (
        token not in (Path.home() / ".ray" / "auth_token").read_text()
    )


DRIVER = """\
import json, os, sys
import ray
from rlinfra import Cluster, ComponentPlacement, Worker
from rlinfra.runtime.rendezvous import bring_up, tear_down
from tests.listeners import listeners_of

class Peer(Worker):
    def joined(self):
        import torch
        import torch.distributed as dist

        value = torch.tensor([1.0])
        dist.all_reduce(value)
        return {"sum": value.item(), "pid": os.getpid(), "gloo": os.environ.get("GLOO_SOCKET_IFNAME")}

cfg = {"cluster": {"num_nodes": 2, "address": sys.argv[1],
                   "component_placement": {"peer": {"node_group": "node", "placement": "0-1"}}}}
cluster = Cluster(cluster_cfg=cfg["cluster"])
strategy = ComponentPlacement(cfg, cluster).get_strategy("peer")
group = Peer.create_group().launch(cluster, strategy, name="peer")
bring_up(group, timeout_s=30)
joined = group.joined().wait()
listening = listeners_of({answer["pid"] for answer in joined})
ray_ports = {actor["Address"]["Port"] for actor in ray._private.state.actors().values()}
print(json.dumps({"joined": joined, "master": group.master_address[0], "ray_ports": sorted(ray_ports),
                  "listeners": [[item.pid, str(item.address), item.port] for item in listening]}))
tear_down(group)
group.shutdown()
cluster.shutdown()
"""


def _ray_start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "ray"), "start", "--block", "--num-cpus=2", *args],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def test_on_a_cluster_given_by_address_the_rendezvous_binds_the_nodes_address(tmp_path):
    """Two ``ray start`` nodes at the machine's address (a real cluster as far as Ray knows):
    the rendezvous works, and its store and gloo listen on that address, not on every interface."""
    address = machine_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    token = os.environ["RAY_AUTH_TOKEN"] + "-other"  # a cluster of its own, with its own token
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, PYTHONPATH=os.getcwd())
    (port,) = free_ports(1)
    temp_dir = tempfile.mkdtemp(prefix="rla")  # Ray's socket paths must stay under 108 bytes
    gcs = f"{address}:{port}"
    head_args = [
        "--head", f"--node-ip-address={address}", f"--port={port}", "--include-dashboard=false",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
    ]  # fmt: skip
    nodes = [_ray_start(head_args, env, tmp_path / "head.log")]
    try:
        wait_for_port(address, port, timeout_s=60, process=nodes[0])
        nodes.append(
            _ray_start([f"--address={gcs}", f"--node-ip-address={address}"], env, tmp_path / "node.log")
        )
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, gcs], env=env, capture_output=True, text=True, timeout=150
        )
        assert driver.returncode == 0, driver.stderr[-3000:]
        report = json.loads(driver.stdout.strip().splitlines()[-1])
    finally:
        for node in nodes:
            stop_process_group(node)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert [answer["sum"] for answer in report["joined"]] == [2.0, 2.0]
    assert report["master"] == address
    interface = interface_of(address)
    assert [answer["gloo"] for answer in report["joined"]] == [interface] * 2
    # Ray's own server in each worker listens on every interface on a real cluster (Ray's choice,
    # guarded by the token); what rlinfra and torch open there binds the node's address.
    ours = [entry for entry in report["listeners"] if entry[2] not in report["ray_ports"]]
    assert len(ours) < len(report["listeners"]), "the scan must see Ray's own servers too"
    rank0 = report["joined"][0]["pid"]
    assert [entry for entry in ours if entry[0] == rank0], "rank 0 must serve the rendezvous store"
    assert {entry[1] for entry in ours} == {address}, report
