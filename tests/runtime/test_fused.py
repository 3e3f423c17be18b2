"""Several roles fused into one worker process, each called by its own name."""

from __future__ import annotations

import os

import pytest

from rlinfra import ComponentPlacement, Worker, WorkerGroupError, fuse

CFG = {"cluster": {"num_nodes": 1, "simulate": "1x4", "component_placement": {"policy": "0-3"}}}
pytestmark = [pytest.mark.timeout(180), pytest.mark.cluster(CFG)]


class ActorRole(Worker):
    def __init__(self, lr: float) -> None:
        self.lr = lr

    def train(self, step: int) -> tuple:
        return ("actor", self._rank, self.lr * step, os.getpid(), repr(self))


class RefRole(Worker):
    def __init__(self, path: str) -> None:
        self.path = path

    def score(self, bad_rank: int = -1) -> tuple:
        if self._rank == bad_rank:
            raise ValueError("reference model missing")
        return ("ref", self._rank, self.path, os.getpid(), os.environ["CUDA_VISIBLE_DEVICES"])


class BrokenRole(Worker):
    def __init__(self) -> None:
        raise RuntimeError("no weights")


def test_roles_share_one_process_per_rank_and_are_called_by_name(cluster):
    placement = ComponentPlacement(CFG, cluster)
    policy = (
        fuse(actor=ActorRole, ref=RefRole)
        .create_group(actor={"lr": 0.5}, ref=("/models/ref",))
        .launch(cluster, placement.get_strategy("policy"), name="policy")
    )
    try:
        trained = policy.role("actor").train(2).wait()
        scored = policy.role("ref").score().wait()
        assert [t[:3] for t in trained] == [("actor", r, 1.0) for r in range(4)]
        assert [t[4] for t in trained] == [f"policy/actor:{r}" for r in range(4)]
        assert [s[:3] for s in scored] == [("ref", r, "/models/ref") for r in range(4)]
        assert [t[3] for t in trained] == [s[3] for s in scored]  # same process per rank
        assert [s[4] for s in scored] == ["0", "1", "2", "3"]
        assert policy.execute_on(1).role("ref").score().wait()[0][1] == 1

        with pytest.raises(WorkerGroupError) as caught:
            policy.role("ref").score(bad_rank=2).wait()
        assert caught.value.group == "policy/ref"
        assert caught.value.failed_ranks == [2]
        assert "worker group 'policy/ref'" in str(caught.value)
        with pytest.raises(AttributeError, match="RefRole has no method 'train'"):
            policy.role("ref").train(1)
        with pytest.raises(AttributeError, match="no role 'critic'"):
            policy.role("critic")
    finally:
        policy.shutdown()


def test_a_failing_role_constructor_is_named(cluster):
    placement = ComponentPlacement(CFG, cluster)
    with pytest.raises(WorkerGroupError) as caught:
        fuse(actor=ActorRole, broken=BrokenRole).create_group(actor={"lr": 1.0}).launch(
            cluster, placement.get_strategy("policy"), name="policy"
        )
    text = str(caught.value)
    assert "RuntimeError: no weights" in text
    assert "role 'broken'" in text


def test_fuse_rejects_non_workers():
    with pytest.raises(TypeError, match="must be a Worker subclass"):
        fuse(actor=object)
    with pytest.raises(ValueError, match="at least one role"):
        fuse()
