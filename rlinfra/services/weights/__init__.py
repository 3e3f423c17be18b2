"""Weight updates behind a version barrier: prepare → pause → swap → verify → resume.

Here: the roles and the barrier, and the errors generation itself can meet (``serving``). The
errors of the update steps (``WeightsPauseError``, ``WeightsSwapError``, ``WeightsVerifyError``,
``EngineStagingError``) are raised inside the workers and reach the driver within a
``WeightSyncError``; they stay in their modules.
"""

from rlinfra.services.weights.admission import WeightsNotAdmittedError
from rlinfra.services.weights.barrier import UpdateReport, WeightSync, WeightSyncError
from rlinfra.services.weights.buffers import WeightsView
from rlinfra.services.weights.engine import EngineReceiver
from rlinfra.services.weights.gate import WeightsPausedError
from rlinfra.services.weights.roles import WeightReceiver, WeightSender
from rlinfra.services.weights.staleness import filter_stale

__all__ = [
    "EngineReceiver",
    "UpdateReport",
    "WeightReceiver",
    "WeightSender",
    "WeightSync",
    "WeightSyncError",
    "WeightsNotAdmittedError",
    "WeightsPausedError",
    "WeightsView",
    "filter_stale",
]
