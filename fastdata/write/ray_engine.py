"""``--engine ray``: one Ray task per shard (a pure function of its :class:`ShardTask`, safe to retry); the driver
journals each finished shard, checks it can see it (a node-local DST is an error), writes the manifest."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from fastdata.errors import FastdataError, UsageError, WriteError
from fastdata.format import ShardInfo
from fastdata.write import _fault
from fastdata.write.shard_task import ShardTask, publisher_for, write_shard

__all__ = ["RETRIES", "RayEngine", "import_ray", "ray_write_shard"]

log = logging.getLogger(__name__)
RETRIES = 3  # Ray re-runs a shard task this many times after its worker dies or an I/O error
_WAIT_S = 0.2
_DRAIN_S = 60.0  # after a failure: how long to wait for running shards to finish (they are kept)


def ray_write_shard(task: ShardTask) -> tuple[ShardInfo, bool, str]:
    """Runs in a Ray worker: write one shard; returns its manifest entry, whether it was kept, the host."""
    info, kept = write_shard(task)
    return info, kept, socket.gethostname()


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("%(engine=ray) needs Ray: pip install 'fastdata[ray]'") from None
    return ray


@dataclass
class RayEngine:
    """Shard tasks on a Ray cluster: ``address`` (else ``RAY_ADDRESS``; else a local Ray started here
    with ``workers`` or all usable CPUs). ``workers`` also caps the shard tasks in flight."""

    address: str | None = None
    workers: int | None = None

    def run(self, tasks: list[ShardTask], progress: Any, finished: Any) -> None:
        if not tasks:
            return
        ray = import_ray()
        started = self._connect(ray)
        try:
            self._run(ray, tasks, progress, finished)
        finally:
            if started:
                ray.shutdown()

    def _connect(self, ray: Any) -> bool:
        """Connect to (or start) Ray; True when this call started it (and so stops it)."""
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if address not in (None, "auto", current):
                raise UsageError(f"%(ray_address={address}): this process is already connected to the Ray cluster at "
                                 f"{current}; drop %(ray_address), or run the conversion from another process")
            return False
        try:
            if address:
                ray.init(address=address, logging_level=logging.WARNING)
            else:
                from fastdata.world import usable_cpus

                # Ray's workers run at nice 15 by default; shard writers run at the caller's priority.
                ray.init(num_cpus=self.workers or usable_cpus(), include_dashboard=False,
                         logging_level=logging.WARNING, log_to_driver=False, _system_config={"worker_niceness": 0})
        except (ConnectionError, ValueError, RuntimeError) as e:
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            raise UsageError(f"cannot start or reach {where}: {str(e).splitlines()[0] if str(e) else e!r}; check "
                             "%(ray_address) / RAY_ADDRESS (or leave both unset for a local Ray)") from None
        return True

    def _run(self, ray: Any, tasks: list[ShardTask], progress: Any, finished: Any) -> None:
        env = {k: os.environ[k] for k in (_fault.ENV, _fault.READY_ENV) if k in os.environ}
        opts: dict[str, Any] = {"num_cpus": 1, "max_retries": RETRIES, "retry_exceptions": [WriteError]}
        if env:  # the crash tests' fault hook follows the shard into the Ray worker
            opts["runtime_env"] = {"env_vars": env}
        remote = ray.remote(ray_write_shard).options(**opts)
        limit = self.workers or max(1, 2 * int(ray.cluster_resources().get("CPU", 1)))
        todo = list(reversed(tasks))
        pending: dict[Any, ShardTask] = {}
        error: BaseException | None = None
        try:
            while todo or pending:
                while todo and error is None and len(pending) < limit:
                    t = todo.pop()
                    pending[remote.remote(t)] = t
                if not pending:
                    break
                # after a failure, running shards may end (they are kept for --resume), but not forever
                draining = error is not None
                ready, _ = ray.wait(list(pending), num_returns=len(pending) if draining else 1,
                                    timeout=_DRAIN_S if draining else _WAIT_S)
                for ref in ready:
                    t = pending.pop(ref)
                    try:
                        info, kept, host = ray.get(ref)
                        _check_visible(t, info, host)
                    except BaseException as e:  # noqa: BLE001 - every failure is reported with its shard
                        if isinstance(e, KeyboardInterrupt):
                            raise
                        if error is None:  # later ones were cancelled, or failed too: the first is reported
                            error = _shard_error(ray, t, e)
                            todo.clear()
                            _cancel(ray, pending, force=False)
                        continue
                    if progress is not None:
                        progress.update(t.count, t.in_bytes)
                    finished(t, info, kept)
                if draining:
                    _cancel(ray, pending, force=True)
                    pending.clear()
        except BaseException:
            _cancel(ray, pending, force=True)
            raise
        if error is not None:
            raise error


def _cancel(ray: Any, pending: dict[Any, ShardTask], force: bool) -> None:
    for ref in pending:
        try:
            ray.cancel(ref, force=force)
        except Exception:  # noqa: BLE001 - already finished, or the cluster is gone
            pass


def _check_visible(task: ShardTask, info: ShardInfo, host: str) -> None:
    """The driver must see the shard a worker reported: in a folder every node shares, or in the
    bucket the worker uploaded to (same endpoint and credentials)."""
    pub = publisher_for(task.dst, task.remote)
    size = pub.size(info.file)
    if size == info.bytes:
        return
    local = task.remote is None
    seen = f"no such {'file' if local else 'object'}" if size is None else f"{size} bytes, not {info.bytes}"
    need = ("DST must be a folder every Ray node shares under the same path (NFS, Lustre, ...)" if local else
            "the workers must reach the same bucket and endpoint as the driver (same storage options and credentials)")
    raise FastdataError(f"{pub.where(info.file)}: {'written' if local else 'uploaded'} by a Ray worker on {host}, "
                        f"but this driver ({socket.gethostname()}) {'sees' if local else 'finds'} {seen}: {need}")


def _shard_error(ray: Any, task: ShardTask, e: BaseException) -> BaseException:
    """A one-line error naming the shard and the reason, the original type kept for fastdata errors."""
    where = f"shard {task.name} (samples {task.start}..{task.start + task.count - 1})"
    cause = e
    if isinstance(e, ray.exceptions.RayTaskError):
        cause = getattr(e, "cause", None) or e
    if isinstance(cause, FastdataError):
        return type(cause)(f"{where}: {cause}")
    if isinstance(cause, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
        return FastdataError(f"{where}: the Ray worker writing it died {RETRIES + 1} times (killed, or out of memory?)")
    if isinstance(cause, ray.exceptions.TaskCancelledError):
        return FastdataError(f"{where}: the Ray task was cancelled")
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return FastdataError(f"{where}: failed on Ray: {type(cause).__name__}: {first}")
