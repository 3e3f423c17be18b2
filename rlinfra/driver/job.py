"""What a job supplies to ``Run``: ``Job``, with its config ``JobConfig``.

A job's target is the driver's too: ``Job.target_key`` names the record key it is set on and
``Job.target()`` its value, so ``Run`` stops there (``stop_at_target``), measures the training
time to it (from the metrics, across resumes), draws the curve and says how the run ended.
"""

from collections.abc import Mapping
from typing import Any

from rich.console import Console

from rlinfra.config import Section, parse_config
from rlinfra.runtime.group import WorkerGroup

from .entry import job_main
from .result import RunResult
from .run import Run
from .settings import RunSettings
from .state import RunState


class JobConfig(Section):
    """A job's config: the ``run`` section, and the job's own sections in a subclass."""

    run: RunSettings


class Job:
    """A job: its config (``Config``, parsed from the YAML in ``__init__`` into ``config``, with
    ``settings`` = its ``run`` section), its ``state`` (a ``RunState``; a job with counters of
    its own sets a subclass after ``super().__init__``) and its driver, ``loop``, which reads top
    to bottom: launch the groups, then ``for step in run.steps(total)``. The other methods are
    hooks with defaults.

    After a trainer restart (a lost trainer rank) ``loop`` runs again from the top: every launch
    returns the group already running (the trainer restarted from its checkpoint), and the steps
    go on from that checkpoint. ``Job.run(cfg)`` runs it; ``Job.main`` is what ``rlinfra run``
    calls."""

    title = "RL"  # the progress bar's label, the curve's title
    components: tuple[str, ...] = ()  # what the YAML must place, in the order placement.json shows
    unit = "iteration"  # what the job calls one iteration, in messages
    target_key = ""  # the record key the target is set on ("": no target)
    stop_at_target = True
    usage_errors: tuple[type[BaseException], ...] = ()  # the job's own user mistakes: exit 2
    Config: type[JobConfig] = JobConfig

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.config: Any = parse_config(self.Config, cfg)
        self.settings: RunSettings = self.config.run
        self.state = RunState()

    @classmethod
    def run(cls, cfg: Mapping[str, Any], **options: Any) -> RunResult:
        """Place, launch and loop: ``Run``'s ``options`` (``resume``, ``cluster``, ``console``,
        ``on_iteration``, ``between_batches``)."""
        job = cls(cfg)
        job.prepare(options.setdefault("console", Console()))
        return Run(job, cfg, **options).execute()

    @classmethod
    def main(cls, cfg: Mapping[str, Any], *, resume: bool = False) -> int:
        """What ``rlinfra run`` calls: run, report, the exit status."""
        return job_main(cls.run, cfg, resume=resume, usage_errors=cls.usage_errors)

    def prepare(self, console: Console) -> None:
        """Before Ray starts: e.g. make or fetch a checkpoint the groups load."""

    def check(self, run: Run) -> None:
        """Refuse a shape the job cannot run (e.g. batches that do not split over the workers),
        once the layout is reserved and before any worker starts."""

    def loop(self, run: Run) -> None:
        """The driver: launch the groups, then one update per ``run.steps(total)``."""
        raise NotImplementedError

    def target(self) -> float | None:
        """The value of ``target_key`` to reach (None: none, or not known yet)."""
        return None

    def curve(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The points of ``target_key`` over ``iteration`` and ``time_s`` (default: the records)."""
        return records

    def trainer_state(self, run: Run, group: WorkerGroup) -> bytes:
        """What a checkpoint keeps of the trained ``group`` (rank 0's ``checkpoint()``)."""
        return bytes(run.call_trainer(lambda: group.execute_on(0).checkpoint().wait()[0]))

    def line(self, record: dict[str, Any]) -> str | None:
        """A console line per iteration (None: none)."""
        return None

    def outcome(self, result: RunResult) -> dict[str, Any]:
        """The job's own entries of ``summary.json``."""
        return {}

    def report(self, result: RunResult) -> list[str]:
        """The job's own closing lines, under the driver's."""
        return []
