"""Simulators in worker processes: one message per worker per call, restart on crash.

Each worker process holds ``envs_per_worker`` simulator objects, built lazily by ``factory`` inside
the worker (so GL contexts are only ever created there, never in a process that forks). Workers are
started with an explicit start method (default ``forkserver``: safe when the parent holds CUDA or GL
state). Workers never re-import the parent's ``__main__`` (everything they run lives in vla-gym's
modules), so scripts fed on standard input (``python - <<EOF``), notebooks and scripts without an
``if __name__ == "__main__":`` guard all work.

Every call has a deadline (``timeout_s``, chosen by the env for what the call does: seconds for a
chunk step, minutes for a scene build): a worker that has not answered by then (hung, or stopped) is
killed and restarted like one that crashed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from nets.errors import BadInput
from nets.processes import without_main_module


class WorkerError(RuntimeError):
    """A simulator raised inside a worker (the worker itself is still alive)."""


def _limit_native_threads(environ: dict[str, str]) -> None:
    """Apply ``OMP_NUM_THREADS`` to the thread pools already loaded: numpy's BLAS started with this
    module's imports, before ``environ`` was set, and its idle threads compete with the other
    workers for the cores (about 15% of LIBERO's throughput on 2 cores)."""
    threads = environ.get("OMP_NUM_THREADS")
    if threads is None:
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an optional speed-up
        return
    threadpool_limits(int(threads))
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))


def _worker_main(conn: Any, factory: Callable[[], Any], num_slots: int, environ: dict[str, str]) -> None:
    os.environ.update(environ)
    _limit_native_threads(environ)
    sims: list[Any] = [None] * num_slots
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            method, items = msg
            try:
                out = []
                for slot, args in items:
                    if sims[slot] is None:
                        sims[slot] = factory()
                    out.append(getattr(sims[slot], method)(*args))
                conn.send(("ok", out))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        for sim in sims:
            if sim is not None:
                try:
                    sim.close()
                except Exception:
                    pass


class WorkerPool:
    """``num_envs`` simulators spread over ``ceil(num_envs / envs_per_worker)`` processes."""

    def __init__(
        self,
        factory: Callable[[], Any],
        num_envs: int,
        *,
        envs_per_worker: int = 1,
        context: str = "forkserver",
        worker_environ: Callable[[int, int], dict[str, str]] | None = None,
        name: str = "sim",
    ) -> None:
        if envs_per_worker < 1:
            raise BadInput(f"envs_per_worker must be >= 1, got {envs_per_worker}")
        self.factory = factory
        self.num_envs = num_envs
        self.envs_per_worker = envs_per_worker
        self.num_workers = -(-num_envs // envs_per_worker)
        self.name = name
        self._ctx = mp.get_context(context)
        self._environ = worker_environ or (lambda rank, size: {})
        self._procs: list[Any] = [None] * self.num_workers
        self._conns: list[Any] = [None] * self.num_workers
        self.restarts = 0
        self.lost: set[int] = set()  # envs whose simulator was lost in a restart; must be reset
        for w in range(self.num_workers):
            self._start(w)

    def _slots(self, worker: int) -> range:
        return range(worker * self.envs_per_worker, min((worker + 1) * self.envs_per_worker, self.num_envs))

    def _start(self, worker: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main,
            args=(child, self.factory, len(self._slots(worker)), self._environ(worker, self.num_workers)),
            name=f"{self.name}-worker-{worker}",
            daemon=True,
        )
        with without_main_module():
            proc.start()
        child.close()
        self._procs[worker], self._conns[worker] = proc, parent

    def _restart(self, worker: int, why: str) -> None:
        proc = self._procs[worker]
        if proc is not None and proc.is_alive():
            proc.kill()
        if proc is not None:
            proc.join(timeout=10)
        self._conns[worker].close()
        warnings.warn(
            f"{self.name} worker {worker} (envs {list(self._slots(worker))}) died ({why}); restarted it, "
            "and its envs will be reset",
            RuntimeWarning,
            stacklevel=3,
        )
        self.restarts += 1
        self.lost.update(self._slots(worker))
        self._start(worker)

    def call(
        self, method: str, env_ids: Sequence[int], args: Sequence[tuple], timeout_s: float
    ) -> tuple[list[Any], np.ndarray]:
        """Call ``sim.method(*args[i])`` on the simulator of each ``env_ids[i]``.

        Returns the results (None where the worker crashed) and a bool mask of crashed envs. A
        crashed worker, or one with no answer ``timeout_s`` seconds after the call was sent (the
        workers run in parallel: one deadline for all), is restarted; all of its envs are added to
        ``self.lost``.
        """
        by_worker: dict[int, list[tuple[int, int, tuple]]] = {}
        for pos, (env, a) in enumerate(zip(env_ids, args, strict=True)):
            by_worker.setdefault(int(env) // self.envs_per_worker, []).append((pos, int(env), a))
        results: list[Any] = [None] * len(env_ids)
        crashed = np.zeros(len(env_ids), bool)
        failed: dict[int, str] = {}
        for w, items in by_worker.items():
            try:
                self._conns[w].send((method, [(env % self.envs_per_worker, a) for _, env, a in items]))
            except (BrokenPipeError, ConnectionResetError, OSError) as e:
                failed[w] = f"send failed: {e!r}"
        error = None
        deadline = time.monotonic() + timeout_s
        for w, items in by_worker.items():
            if w not in failed:
                try:
                    if not self._conns[w].poll(max(0.0, deadline - time.monotonic())):
                        raise TimeoutError(f"no answer to {method}() in {timeout_s:g} s (hung or stopped)")
                    status, payload = self._conns[w].recv()
                except (EOFError, ConnectionResetError, OSError, TimeoutError) as e:
                    failed[w] = f"{type(e).__name__}: {e}, exit code {self._procs[w].exitcode}"
                else:
                    if status == "error":
                        error = error or f"{self.name} worker {w} raised in {method}():\n{payload}"
                    else:
                        for (pos, _, _), out in zip(items, payload, strict=True):
                            results[pos] = out
            if w in failed:
                self._restart(w, failed[w])
                for pos, _, _ in items:
                    crashed[pos] = True
        if error:
            raise WorkerError(error)
        return results, crashed

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def close(self) -> None:
        for conn in self._conns:
            if conn is None:
                continue
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for w, proc in enumerate(self._procs):
            if proc is None:
                continue
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
            self._conns[w].close()
        self._procs = [None] * self.num_workers
        self._conns = [None] * self.num_workers
