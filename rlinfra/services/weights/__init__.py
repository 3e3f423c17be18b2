"""Weight updates behind a version barrier: prepare → pause → swap → verify → resume."""

from rlinfra.services.weights.admission import WeightsNotAdmittedError
from rlinfra.services.weights.barrier import UpdateReport, WeightSync, WeightSyncError
from rlinfra.services.weights.buffers import WeightsSwapError, WeightsVerifyError, WeightsView
from rlinfra.services.weights.engine import EngineReceiver, EngineStagingError
from rlinfra.services.weights.gate import WeightsPausedError, WeightsPauseError
from rlinfra.services.weights.roles import WeightReceiver, WeightSender
from rlinfra.services.weights.staleness import filter_stale

__all__ = [
    "EngineReceiver",
    "EngineStagingError",
    "UpdateReport",
    "WeightReceiver",
    "WeightSender",
    "WeightSync",
    "WeightSyncError",
    "WeightsNotAdmittedError",
    "WeightsPauseError",
    "WeightsPausedError",
    "WeightsSwapError",
    "WeightsVerifyError",
    "WeightsView",
    "filter_stale",
]
