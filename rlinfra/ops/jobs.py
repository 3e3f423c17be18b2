"""Submitting jobs to a running Ray cluster through Ray's Jobs API, and following them to the end.

A thin, typed wrapper over ``ray.job_submission.JobSubmissionClient`` (it needs ``ray[default]``,
the ``jobs`` extra) that adds what plain Ray leaves to the caller: a deadline on every request,
wait and log follow; one ``JobsError`` naming the address and what to check instead of a
``requests`` traceback; no credential-like env vars in the runtime_env (Ray records it in plain
text; ``credential_reason``); Ray's auth token presented by the client itself; and the cluster's
resources (``require``) read from the dashboard's state API, through the same client, address and
token. The address is the *dashboard* address; an explicit one wins over the environment, which
is why ``_client_class`` builds Ray's client without its ``RAY_ADDRESS`` step.
See docs/operations.md and docs/design.md#decisions.
"""

import asyncio
import importlib.util
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlinfra.config import to_plain
from rlinfra.placement.env_vars import URL_WITH_PASSWORD, credential_reason
from rlinfra.runtime.deadline import Deadline
from rlinfra.runtime.ledger import resource_diff

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_TIMEOUT_S = 30.0
# Connecting should be quick on any network that works; a long connect wait only delays the error.
CONNECT_TIMEOUT_S = 10.0
TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
# The most nodes the state API returns in one answer (Ray's RAY_MAX_LIMIT_FROM_API_SERVER default).
_NODE_LIMIT = 10_000

_RESOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")
_SUPPORTED_RUNTIME_ENV_KEYS = ("env_vars", "working_dir")

SECRETS_HINT = (
    "Ray records a job's runtime_env in plain text (job info, `ray job list`, the dashboard, logs); "
    "pass secrets through rlinfra's secrets channel instead (cluster.secrets: "
    "{NAME: {from_env: NAME}}, read in workers with self.secret('NAME'))"
)


class JobsError(RuntimeError):
    """A Jobs API call that cannot be made or failed, or a job request rlinfra refuses."""


def refuse_secrets(env_vars: Mapping[Any, Any], where: str) -> None:
    """Raise ``JobsError`` naming the first credential-looking variable (never its value)."""
    for name, value in env_vars.items():
        reason = credential_reason(str(name), str(value))
        if reason:
            raise JobsError(f"{where} {name}: refused, {reason}. {SECRETS_HINT}.")


def parse_assignments(items: Iterable[str], flag: str) -> dict[str, str]:
    """``["A=1", "B=x=y"]`` → ``{"A": "1", "B": "x=y"}``; a ``JobsError`` naming ``flag`` otherwise."""
    parsed: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise JobsError(f"{flag} {item!r}: expected NAME=VALUE")
        parsed[name.strip()] = value
    return parsed


def parse_requirements(items: Iterable[str]) -> dict[str, float]:
    """``--require`` values: ``["GPU=16", "CPU=128"]`` → ``{"GPU": 16.0, "CPU": 128.0}`` (Ray
    resource names, numbers ≥ 0)."""
    required: dict[str, float] = {}
    for name, text in parse_assignments(items, "--require").items():
        try:
            amount = float(text)
        except ValueError:
            amount = math.nan
        if not _RESOURCE_NAME.fullmatch(name) or not math.isfinite(amount) or amount < 0:
            raise JobsError(f"--require {name}={text}: expected NAME=NUMBER with a number ≥ 0, e.g. GPU=16")
        required[name] = amount
    return required


def build_runtime_env(
    env_vars: Mapping[str, Any] | None = None,
    working_dir: str | os.PathLike[str] | None = None,
    config_runtime_env: Any = None,
) -> dict[str, Any]:
    """The runtime_env to send with a job: the config's ``runtime_env`` section (``env_vars`` and
    ``working_dir`` only), overridden by ``env_vars`` and ``working_dir``. Refuses credentials.

    Only these two keys are supported because every other runtime_env field (``pip`` index URLs,
    ``conda`` channels, ``py_modules``) can carry credentials too and would need its own check.
    """
    section = to_plain(config_runtime_env) if config_runtime_env is not None else {}
    if not isinstance(section, Mapping):
        raise JobsError(f"config runtime_env: expected a mapping, got {type(section).__name__}")
    unknown = sorted(set(section) - set(_SUPPORTED_RUNTIME_ENV_KEYS))
    if unknown:
        raise JobsError(
            f"config runtime_env.{unknown[0]}: not supported by rlinfra job submit "
            f"(supported: {', '.join(_SUPPORTED_RUNTIME_ENV_KEYS)})"
        )
    from_config = section.get("env_vars") or {}
    if not isinstance(from_config, Mapping):
        raise JobsError(f"config runtime_env.env_vars: expected a mapping, got {type(from_config).__name__}")
    merged = {str(name): _env_value(value) for name, value in from_config.items()}
    refuse_secrets(merged, "config runtime_env.env_vars:")
    flags = {str(name): _env_value(value) for name, value in (env_vars or {}).items()}
    refuse_secrets(flags, "--env")
    merged.update(flags)
    runtime_env: dict[str, Any] = {"env_vars": merged} if merged else {}
    directory = working_dir if working_dir is not None else section.get("working_dir")
    if directory is not None:
        path = Path(directory).expanduser()
        if not path.is_dir():
            raise JobsError(f"working_dir {directory}: not a directory")
        runtime_env["working_dir"] = str(path.resolve())
    return runtime_env


def resolve_address(address: str | None = None, cluster_cfg: Any = None) -> tuple[str, str]:
    """``(dashboard URL, where it came from)``: ``address``, ``cluster.address``, the environment
    (``RAY_API_SERVER_ADDRESS``, ``RAY_ADDRESS``), else the local default."""
    cluster = to_plain(cluster_cfg) if cluster_cfg is not None else {}
    candidates = (
        (address, "--address"),
        (cluster.get("address") if isinstance(cluster, Mapping) else None, "cluster.address"),
        (os.environ.get("RAY_API_SERVER_ADDRESS"), "RAY_API_SERVER_ADDRESS"),
        (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"),
        (DEFAULT_ADDRESS, "the default"),
    )
    value, source = next((str(value), source) for value, source in candidates if value)
    value = value.strip().rstrip("/")
    if value.startswith("ray://"):
        raise JobsError(
            f"{value} (from {source}) is a Ray Client address; the Jobs API needs the dashboard "
            "address, e.g. http://HEAD:8265"
        )
    if "://" not in value:
        value = "http://" + value
    return value, source


def auth_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The Ray token this client presents: ``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``,
    else ``~/.ray/auth_token`` (Ray's own order); None with ``RAY_AUTH_MODE=disabled`` or none found."""
    env = os.environ if environ is None else environ
    if env.get("RAY_AUTH_MODE", "").strip().lower() == "disabled":
        return None
    if env.get("RAY_AUTH_TOKEN", "").strip():
        return env["RAY_AUTH_TOKEN"].strip()
    named = env.get("RAY_AUTH_TOKEN_PATH")
    path = Path(named).expanduser() if named else Path(env.get("HOME") or Path.home()) / ".ray" / "auth_token"
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError as error:
        if not named:  # no token file of one's own is the usual case, not an error
            return None
        raise JobsError(
            f"RAY_AUTH_TOKEN_PATH={named}: cannot read the token: {error.strerror or error}"
        ) from None


class JobsClient:
    """A connection to one cluster's Jobs API; every request has a deadline of ``timeout_s``.

    ``token`` overrides the token found by ``auth_token()``. Constructing the client checks the
    connection (one request), so a wrong address fails here, with a ``JobsError``.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        cluster_cfg: Any = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        token: str | None = None,
    ) -> None:
        self.address, self.source = resolve_address(address, cluster_cfg)
        self.timeout_s = timeout_s
        token = token if token is not None else auth_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client_class = _client_class()
        with self._calling("connect"):
            self._client = client_class(self.address, headers, (min(CONNECT_TIMEOUT_S, timeout_s), timeout_s))

    def cluster_resources(self) -> dict[str, float]:
        """Total resources of the alive nodes, as ``ray.cluster_resources()`` reports them."""
        with self._calling("read the cluster's resources"):
            response = self._client._do_request(
                "GET",
                "/api/v0/nodes",
                params={"detail": "1", "limit": str(_NODE_LIMIT), "timeout": str(int(self.timeout_s))},
            )
            if response.status_code != 200:
                raise JobsError(
                    f"cannot read the cluster's resources from {self.address}: HTTP "
                    f"{response.status_code} {response.text[:200]}"
                )
            result = response.json()["data"]["result"]
        if result.get("num_after_truncation", 0) < result.get("total", 0):
            raise JobsError(f"the cluster at {self.address} has over {_NODE_LIMIT} nodes; cannot sum them")
        alive = [node.get("resources_total") or {} for node in result["result"] if node["state"] == "ALIVE"]
        return {name: sum(float(node.get(name, 0.0)) for node in alive) for name in set().union(*alive)}

    def require(self, expected: Mapping[str, float]) -> None:
        """Raise ``JobsError`` with the diff unless the cluster's totals match ``expected``.

        Exact, like ``Cluster.require``: a cluster with more GPUs than planned is as likely a
        wrong cluster as one with fewer.
        """
        if not expected:
            return
        diff = resource_diff(expected, self.cluster_resources())
        if diff:
            raise JobsError(
                f"the cluster at {self.address} does not have the resources this job requires; "
                f"nothing was submitted:\n{diff}"
            )

    def submit(
        self,
        entrypoint: str,
        runtime_env: Mapping[str, Any] | None = None,
        submission_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> str:
        """Submit ``entrypoint`` (a shell command run on the head) and return its submission id.

        ``runtime_env`` is checked again for credentials here, so no caller can bypass the check;
        so are ``metadata`` values, which Ray shows next to it.
        """
        refuse_secrets((runtime_env or {}).get("env_vars") or {}, "runtime_env env_vars:")
        refuse_secrets(metadata or {}, "job metadata")
        if URL_WITH_PASSWORD.search(entrypoint):
            raise JobsError(f"the entrypoint holds a URL with a user:password part. {SECRETS_HINT}.")
        with self._calling("submit the job"):
            return self._client.submit_job(
                entrypoint=entrypoint,
                runtime_env=dict(runtime_env) if runtime_env else None,
                submission_id=submission_id,
                metadata=dict(metadata) if metadata else None,
            )

    def status(self, job_id: str) -> str:
        """The job's status: PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED."""
        with self._calling("read the job", job_id):
            return str(self._client.get_job_status(job_id))  # Ray's JobStatus prints as its value

    def tail(self, job_id: str, write: Callable[[str], None], timeout_s: float | None = None) -> str:
        """Stream the job's logs to ``write`` until the job ends, or ``timeout_s`` passes; return
        the status then (not terminal only when time ran out)."""
        deadline = Deadline.after(timeout_s)  # None: follow until the job ends

        async def follow() -> None:
            async for chunk in self._client.tail_job_logs(job_id):
                write(chunk)

        with self._calling("follow the job's logs", job_id):
            self.status(job_id)  # an unknown id fails here, clearly, not as a websocket error
            try:
                asyncio.run(asyncio.wait_for(follow(), None if timeout_s is None else deadline.left()))
            except asyncio.TimeoutError:  # caught here: _calling would take it for a network error
                return self.status(job_id)
        # The log stream closes when the job ends; the status can lag it by a moment.
        return self.wait(job_id, timeout_s=min(10.0, deadline.left()))

    def wait(self, job_id: str, timeout_s: float, poll_s: float = 0.5) -> str:
        """Poll until the job reaches a terminal status or ``timeout_s`` passes; the last status."""
        deadline = Deadline.after(timeout_s)
        status = self.status(job_id)
        while status not in TERMINAL_STATUSES and not deadline.expired:
            time.sleep(min(poll_s, deadline.left()))
            status = self.status(job_id)
        return status

    @contextmanager
    def _calling(self, action: str, job_id: str | None = None) -> Iterator[None]:
        """Turn what Ray's client raises into one ``JobsError`` that says what to check."""
        import requests
        from ray.exceptions import AuthenticationError

        where = f"the Ray Jobs API at {self.address} (from {self.source})"
        try:
            yield
        except JobsError:
            raise
        except AuthenticationError as error:
            refused = "was refused" if "invalid" in str(error).lower() else "is missing"
            raise JobsError(
                f"cannot {action}: {where} uses token authentication and the token {refused}. "
                "Put the cluster's token in RAY_AUTH_TOKEN, in a file named by RAY_AUTH_TOKEN_PATH, "
                "or in ~/.ray/auth_token (`ray get-auth-token` on the head prints it)."
            ) from None
        except requests.Timeout:
            raise JobsError(
                f"cannot {action}: {where} did not answer within {self.timeout_s:g} s; check that the "
                "head is running and not overloaded"
            ) from None
        except (requests.ConnectionError, ConnectionError) as error:
            raise JobsError(
                f"cannot {action}: cannot reach {where} ({_first_line(error)}). Check that the Ray head "
                "is running with the dashboard (ray[default]) and that this is the dashboard address "
                "(http://HEAD:8265), not the GCS address (HEAD:6379); set --address, cluster.address "
                "or RAY_ADDRESS."
            ) from None
        except (RuntimeError, ValueError, TypeError, OSError, requests.RequestException) as error:
            text = str(error)
            if job_id is not None and ("does not exist" in text or "404" in text):
                raise JobsError(f"no job {job_id!r} at {self.address}; `ray job list` lists them") from None
            hint = " Is it the dashboard address (http://HEAD:8265)?" if action == "connect" else ""
            raise JobsError(f"cannot {action}: {where} answered: {_first_line(error)}{hint}") from None

    def __repr__(self) -> str:
        return f"JobsClient({self.address!r})"


def _client_class() -> type:
    """``JobSubmissionClient`` with a deadline on every request and without Ray's silent
    replacement of the given address by ``RAY_ADDRESS`` (see the module docstring)."""
    if importlib.util.find_spec("aiohttp") is None:
        raise JobsError(
            "the Jobs API needs ray[default] (the Ray dashboard client); install it with "
            "`pip install 'rlinfra[jobs]'` or `pip install 'ray[default]'`"
        )
    import ray
    from ray.dashboard.modules.dashboard_sdk import SubmissionClient
    from ray.job_submission import JobSubmissionClient

    class DeadlineJobSubmissionClient(JobSubmissionClient):
        def __init__(self, address: str, headers: dict[str, str], timeout: tuple[float, float]) -> None:
            self._rlinfra_timeout = timeout
            self._client_ray_version = ray.__version__
            SubmissionClient.__init__(self, address=address, headers=headers)
            # Ray adds a token of its own when this process has token auth enabled (after any
            # ray.init with auth), which may be another cluster's: send exactly our headers.
            self._headers = dict(headers)
            self._check_connection_and_version(
                min_version="2.0",
                version_error_message="The Jobs API client needs a cluster running Ray 2.0 or newer.",
            )

        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", self._rlinfra_timeout)
            return super()._do_request(method, endpoint, **kwargs)

    return DeadlineJobSubmissionClient


def _env_value(value: Any) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
