"""Weight updates behind a version barrier: prepare → pause → swap → verify → resume.

Here: the roles and the barrier, and the errors generation itself can meet (``serving``). The
errors of the update steps (``WeightsPauseError``, ``WeightsSwapError``, ``WeightsVerifyError``,
``EngineStagingError``) are raised inside the workers and reach the driver within a
``WeightSyncError``; they stay in their modules.
"""

# Re-exported (``name as name``): what ``rlinfra`` and the driver import from here.
from rlinfra.services.weights.admission import WeightsNotAdmittedError as WeightsNotAdmittedError
from rlinfra.services.weights.barrier import UpdateReport as UpdateReport
from rlinfra.services.weights.barrier import WeightSync as WeightSync
from rlinfra.services.weights.barrier import WeightSyncError as WeightSyncError
from rlinfra.services.weights.buffers import WeightsView as WeightsView
from rlinfra.services.weights.engine import EngineReceiver as EngineReceiver
from rlinfra.services.weights.gate import WeightsPausedError as WeightsPausedError
from rlinfra.services.weights.roles import WeightReceiver as WeightReceiver
from rlinfra.services.weights.roles import WeightSender as WeightSender
from rlinfra.services.weights.staleness import filter_stale as filter_stale
