"""The one-node embedded Ray (no ``simulate``, no ``address``): on loopback with a token made for
the run, and the user's own Ray settings back in place once it is shut down; and what a
``simulate`` config does where ``RAY_ADDRESS`` names a cluster."""

from __future__ import annotations

import os

import pytest
import ray

from rlinfra import Cluster
from rlinfra.runtime.cluster import check_simulated_shape
from rlinfra.runtime.discovery import RayNode
from rlinfra.runtime.errors import ClusterError
from tests.listeners import descendants, listeners_of

pytestmark = [pytest.mark.timeout(120), pytest.mark.ray]

USERS_TOKEN = "token-of-the-users-own-cluster"


def test_the_local_ray_listens_on_loopback_with_a_fresh_token(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", USERS_TOKEN)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    cluster = Cluster(cluster_cfg={"num_nodes": 1})
    try:
        assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
        assert os.environ["RAY_AUTH_MODE"] == "token"
        token = os.environ["RAY_AUTH_TOKEN"]
        assert token != USERS_TOKEN and len(token) == 64
        listeners = listeners_of(descendants(os.getpid()))
        assert {"gcs_server", "raylet"} <= {listener.command for listener in listeners}
        assert [str(listener) for listener in listeners if not listener.on_loopback] == []
    finally:
        cluster.shutdown()
    assert os.environ["RAY_AUTH_TOKEN"] == USERS_TOKEN
    assert "RAY_AUTH_MODE" not in os.environ and "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    second = Cluster(cluster_cfg={"num_nodes": 1})  # a token of its own again
    try:
        assert os.environ["RAY_AUTH_TOKEN"] not in (USERS_TOKEN, token)
    finally:
        second.shutdown()


def test_auth_disabled_by_the_user_is_refused_for_the_embedded_ray(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ClusterError, match="RAY_AUTH_MODE=disabled: the embedded Ray always requires"):
        Cluster(cluster_cfg={"num_nodes": 1})
    assert not ray.is_initialized()


def test_a_simulate_config_under_ray_address_attaches_and_must_match(monkeypatch):
    """Inside an allocation rlinfra's Slurm script started (``RAY_ADDRESS`` set), a ``simulate``
    config uses that cluster, which must have the simulated shape; what only shapes a simulated
    cluster is refused there, before connecting. (Attaching itself: the PPO job on real Slurm.)"""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # never reached: refused first
    with pytest.raises(ClusterError, match=r"cluster\.simulate_cpus shapes a simulated cluster"):
        Cluster(cluster_cfg={"num_nodes": 2, "simulate": "2x4", "simulate_cpus": 8})
    nodes = [RayNode(rank, f"n{rank}", {"GPU": gpus}, {}) for rank, gpus in ((0, 4), (1, 2))]
    with pytest.raises(ClusterError, match=r"cluster.simulate is \[4, 4\] .* has \[4, 2\]"):
        check_simulated_shape(nodes, (4, 4))
    check_simulated_shape(nodes, (4, 2))
