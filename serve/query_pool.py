"""Trace-store reads in worker processes, so no SQL a tenant writes can stall or kill the gateway.

DuckDB's ``memory_limit`` bounds its buffer pool, not the strings an expression builds: measured
here, ``SELECT repeat('x', 3000000000)`` took the process to 5.8 GB and a projection of 1,500
rows of 1 MB strings to 1.5 GB, whatever the limit said. In a thread of the gateway either is an
out-of-memory kill of every team's requests. So each query runs in a worker process whose data
segment is capped (``RLIMIT_DATA``: DuckDB then raises its own out-of-memory error, measured
above), with a deadline that covers opening the snapshot, the query and serialising the answer;
a worker past it is killed by PID and replaced. Answers come back as bytes of at most
``max_result_bytes``.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import resource
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

from serve.config import QueryConfig


class QueryDeadline(Exception):
    """The query (snapshot, SQL and answer together) ran past its deadline; its worker was killed."""


class QueryTooLarge(Exception):
    """The query needed more memory than a worker may use, or its answer more bytes than allowed."""


class QueryWorkerLost(Exception):
    """The worker died before it answered (killed from outside, or a crash in DuckDB)."""


@dataclass
class _Worker:
    process: subprocess.Popen
    conn: Connection


def serve_jobs(conn: Connection, data_bytes: int, max_result_bytes: int, niceness: int = 0) -> None:
    """A worker's life (``python -m serve.query_pool FD DATA_BYTES MAX_RESULT_BYTES NICENESS``):
    answer jobs until the gateway closes its end of the socket."""
    resource.setrlimit(resource.RLIMIT_DATA, (data_bytes, data_bytes))
    os.nice(niceness)
    while True:
        try:
            fn, args = conn.recv()
        except EOFError:
            return
        try:
            answer = pickle.dumps(("ok", fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            answer = pickle.dumps(("err", QueryTooLarge("the query needed more memory than a query may use")))
        except Exception as exc:  # the caller decides what each kind of failure means
            try:
                answer = pickle.dumps(("err", exc))
            except Exception:  # an exception that does not pickle still says what it was
                answer = pickle.dumps(("err", RuntimeError(f"{type(exc).__name__}: {exc}")))
        if len(answer) > max_result_bytes:
            answer = pickle.dumps(
                ("err", QueryTooLarge(f"the answer is {len(answer):,} bytes, over the {max_result_bytes:,} a query may return"))
            )
        conn.send_bytes(answer)


class QueryPool:
    """Up to ``config.workers`` worker processes, started on first use. ``run`` waits for a free
    one; the wait counts toward the deadline."""

    def __init__(self, config: QueryConfig, timeout_s: float, spill_root: str | None = None):
        self.config, self.timeout_s, self.spill_root = config, timeout_s, spill_root
        self._idle: list[_Worker] = []
        self._free: asyncio.Semaphore | None = None
        self._closed = False
        self._remove_dead_spills()

    def _remove_dead_spills(self) -> None:
        """A worker spills into a folder named by its PID; a gateway killed outright leaves its
        workers' folders behind (measured: hundreds, empty, after many test runs). Those of
        processes no longer running go; a running one's stays, whoever started it."""
        if not self.spill_root or not Path(self.spill_root).is_dir():
            return
        for folder in Path(self.spill_root).iterdir():
            if folder.name.isdigit() and not Path("/proc", folder.name).exists():
                shutil.rmtree(folder, ignore_errors=True)

    def _remove_spill(self, worker: _Worker) -> None:
        if self.spill_root:
            shutil.rmtree(Path(self.spill_root, str(worker.process.pid)), ignore_errors=True)

    async def run(self, fn: Callable[..., Any], *args) -> Any:
        """``fn(*args)`` in a worker (``fn`` a module-level function, args picklable), its
        return value or its exception. Raises :class:`QueryDeadline`, :class:`QueryTooLarge` or
        :class:`QueryWorkerLost` for what the worker itself could not say."""
        if self._free is None:
            self._free = asyncio.Semaphore(self.config.workers)
        deadline = time.monotonic() + self.timeout_s
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._free.acquire()
        except TimeoutError:
            raise QueryDeadline(f"no query worker was free within {self.timeout_s:.0f} s") from None
        worker = None
        try:
            worker = self._idle.pop() if self._idle else await asyncio.to_thread(self._start)
            # DuckDB's own interrupt fires at the deadline; this one is for what runs outside it
            async with asyncio.timeout(max(deadline - time.monotonic(), 0) + self.config.grace_s):
                status, value = await asyncio.to_thread(self._call, worker, fn, args)
        except TimeoutError:
            self._kill(worker)
            worker = None
            raise QueryDeadline(f"the query ran past its {self.timeout_s:.0f} s deadline") from None
        except (EOFError, OSError):
            self._kill(worker)
            worker = None
            raise QueryWorkerLost("the query's worker process died before it answered") from None
        except BaseException:  # cancelled (the client went away): the worker may still be busy
            self._kill(worker)
            worker = None
            raise
        finally:
            if worker is not None and not self._closed:
                self._idle.append(worker)
            elif worker is not None:
                self._kill(worker)
            self._free.release()
        if status == "err":
            raise value
        return value

    def _call(self, worker: _Worker, fn, args):
        worker.conn.send((fn, args))
        return pickle.loads(worker.conn.recv_bytes(self.config.max_result_bytes + (1 << 16)))

    def _start(self) -> _Worker:
        # A plain subprocess, not multiprocessing's: that one re-imports the parent's __main__
        ours, theirs = socket.socketpair()
        with ours, theirs:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "serve.query_pool",
                    str(theirs.fileno()),
                    str(self.config.memory_mb << 20),
                    str(self.config.max_result_bytes),
                    str(self.config.niceness),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )
            return _Worker(process, Connection(os.dup(ours.fileno())))

    def _kill(self, worker: _Worker | None) -> None:
        """Kill by PID, and remove what it spilled. The pipe is left to the thread that may
        still be reading it (it reads EOF now); closing it under that thread could hand its
        descriptor to another file."""
        if worker is None:
            return
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait(timeout=5)
        self._remove_spill(worker)

    def close(self) -> None:
        """Stop every idle worker; a busy one is stopped when its query returns."""
        self._closed = True
        while self._idle:
            worker = self._idle.pop()
            worker.conn.close()  # the worker reads EOF and exits
            try:
                worker.process.wait(timeout=5)
                self._remove_spill(worker)
            except subprocess.TimeoutExpired:
                self._kill(worker)


if __name__ == "__main__":
    from serve.query_pool import serve_jobs as run  # by its own name: its exceptions must unpickle

    fd, data_bytes, max_result_bytes, niceness = map(int, sys.argv[1:5])
    run(Connection(fd), data_bytes, max_result_bytes, niceness)
