"""The version rule of ``RunState``: a trainer counts its own versions, the run publishes them
above whatever was served before a restart, and a resume or a rewind keeps the offset."""

from __future__ import annotations

from rlinfra.driver.state import RunState


def test_a_fresh_trainer_publishes_its_own_count() -> None:
    state = RunState()
    assert state.published(0) == 0 and state.published(5) == 5


def test_a_restart_publishes_above_the_version_served_and_the_offset_never_falls() -> None:
    state = RunState()
    assert state.published(2, above=7) == 8  # the checkpoint's count 2, version 7 served
    assert state.published(3) == 9  # its next update goes on from there
    assert state.published(9, above=4) == 15  # a later restart never lowers the offset


def test_a_resume_and_a_rewind_keep_the_offset() -> None:
    state = RunState()
    state.published(2, above=7)
    saved = state.checkpointed()
    resumed = RunState()
    resumed.load(saved)
    assert resumed.published(3) == 9
    state.published(1, above=20)  # a restart from an older checkpoint, then the state rewinds to it
    state.rewind(saved)
    assert state.published(2) == 22


def test_a_job_state_that_keeps_its_own_fields_on_rewind_keeps_the_offset_too() -> None:
    class JobState(RunState):
        KEPT_ON_REWIND = ("training_s", "warm_accuracy")  # the base's offset not listed

    state = JobState()
    saved = state.checkpointed()
    state.published(1, above=9)
    state.rewind(saved)
    assert state.published(2) == 11
