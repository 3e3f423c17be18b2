"""Fixtures shared by the test modules that run a real Ray.

A module that defines ``CFG`` (a full config with a ``cluster`` section, usually ``simulate``-d)
gets a private Ray cluster for the whole module (``cluster``, shut down at the module's end) and
its ``ComponentPlacement`` (``placement``): starting Ray costs seconds, so modules share one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlinfra import Cluster, ComponentPlacement


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    with Cluster(cluster_cfg=request.module.CFG["cluster"]) as live:
        yield live


@pytest.fixture(scope="module")
def placement(request: pytest.FixtureRequest, cluster: Cluster) -> ComponentPlacement:
    return ComponentPlacement(request.module.CFG, cluster)
