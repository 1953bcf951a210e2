"""The batch scheduler: runs batch lines through the gateway's own request path, at low priority.

Every replica runs one. It leases chunks of a batch's lines (``traces.batch_store``), runs each
line through :class:`serve.forward.Forwarder` exactly as a client request (same admission,
deployments, failover, metering, capture; the trace row carries ``batch_id`` and
``custom_id``) and appends the answers, group-committed, to its results file. A line's trace id
is ``tr-<batch>-<line>``: after a crash, a line whose trace is stored but whose result was not
yet written is answered from its trace instead of being run again, so no line runs twice to
completion and none is lost. Lines start through :class:`serve.batch.lanes.Lanes`, fewer at a
time while interactive requests for their model are being served. A line that finds no free
capacity (batch lines never queue, see :mod:`serve.admission`) waits ``retry_s`` and tries again.
When every chunk is done, one replica writes the output and error files; a cancel stops new
lines at once and ends the batch once the lines in flight are answered.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from serve.batch.finish import finalize, traced_lines
from serve.batch.lanes import Lanes
from serve.batch.lines import ENDPOINTS, output_line
from serve.capture import RequestContext
from serve.config import GatewayConfig
from serve.errors import APIError, BudgetUncheckable, CapacityExceeded, TraceStoreBehind
from serve.forward import Forwarder
from serve.keys import KeyStore
from traces.batch_store import BatchStore, FileStore
from traces.spool import new_lifetime

log = logging.getLogger(__name__)


class BatchRunner:
    def __init__(
        self, config: GatewayConfig, store: BatchStore, files: FileStore, forwarder: Forwarder, keys: KeyStore | None = None
    ):
        self.cfg, self.traces_dir, self.keys = config.batch, config.traces_dir, keys
        self._next_expiry = 0.0
        self.store, self.files, self.forwarder = store, files, forwarder
        self.owner = f"{config.instance_name}/{new_lifetime()}"
        self.lanes = Lanes(forwarder.admission.interactive, self.cfg.concurrency, self.cfg.busy_concurrency)
        self.cancelled: set[str] = set()
        self.chunk_tasks: dict[tuple[str, int], asyncio.Task] = {}
        self._sync_failing = False
        self._lines: dict[str, list[dict]] = {}

    def cancel(self, batch_id: str) -> None:
        """Stop starting this batch's lines now (the store's status tells other replicas)."""
        self.cancelled.add(batch_id)

    async def run(self) -> None:
        while True:
            try:
                await self._tick()
            except Exception:  # one bad pass must not end the scheduler
                log.exception("batch scheduler pass failed")
            await asyncio.sleep(self.cfg.poll_s)

    async def _tick(self) -> None:
        try:
            await asyncio.to_thread(self.lanes.signal.sync, self.lanes.models())
            self._sync_failing = False
        except Exception:  # other replicas' marks are a hint: go on with the last ones seen
            if not self._sync_failing:
                log.warning("could not share interactive marks; scheduling with the last seen", exc_info=True)
            self._sync_failing = True
        self.chunk_tasks = {k: t for k, t in self.chunk_tasks.items() if not t.done()}
        if time.monotonic() >= self._next_expiry:  # files past their time (a team's disk is bounded)
            self._next_expiry = time.monotonic() + 60
            await asyncio.to_thread(self.files.expire)
        active = await asyncio.to_thread(self.store.active)
        ids = {b["id"] for b in active}
        self._lines = {bid: lines for bid, lines in self._lines.items() if bid in ids}
        for batch in active:
            if batch["status"] == "in_progress" and time.time() >= batch["expires_at"]:
                await asyncio.to_thread(self._expire, batch)
            if batch["status"] == "in_progress" and self._key_revoked(batch):
                await asyncio.to_thread(self._stop_revoked, batch)
            if batch["status"] != "in_progress" or batch["id"] in self.cancelled:
                self.cancelled.add(batch["id"])
                if not self._running(batch["id"]):
                    await asyncio.to_thread(finalize, self.store, self.files, batch["id"], self.cfg.lease_ttl_s)
                continue
            await self._lease_more(batch)
            if not self._running(batch["id"]) and await asyncio.to_thread(self.store.chunks_left, batch["id"]) == 0:
                await asyncio.to_thread(finalize, self.store, self.files, batch["id"], self.cfg.lease_ttl_s)

    def _running(self, batch_id: str) -> bool:
        return any(b == batch_id and not t.done() for (b, _), t in self.chunk_tasks.items())

    async def _lease_more(self, batch: dict) -> None:
        # lease only what this replica can start soon, so other replicas find work too
        want = math.ceil(self.cfg.concurrency / self.cfg.chunk_lines) + 1 - len(self.chunk_tasks)
        if want <= 0:
            return
        chunks, taken_over = await asyncio.to_thread(self.store.claim, batch["id"], self.owner, want, self.cfg.lease_ttl_s)
        for chunk in chunks:
            task = asyncio.create_task(self._run_chunk(batch, chunk, chunk in taken_over))
            self.chunk_tasks[(batch["id"], chunk)] = task

    async def stop(self) -> None:
        """On shutdown: stop every chunk, writing the results already answered (see
        ``_run_chunk``: a chunk that did not finish is left to be taken over)."""
        tasks = [t for t in self.chunk_tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_chunk(self, batch: dict, chunk: int, taken_over: bool) -> None:
        """Runs the chunk's lines that have no result. A chunk that finished is released (done,
        or handed back if some lines were cancelled). One that did not (shutdown, a bug) first
        writes the results it has, then is left leased until its lease lapses: its next owner
        (this instance after a restart, at once; another replica after ``lease_ttl_s``, by when
        this one's traces are in Parquet) takes it over and answers from the traces every line
        that was answered here, so none runs twice. Handing it back as free made its next owner
        run every line again: duplicate traces and a double charge."""
        bid, size = batch["id"], self.cfg.chunk_lines
        done_all = finished = False
        pending: list[dict] = []  # answered, not yet in the results file
        tasks: list[asyncio.Task] = []
        renewer = asyncio.create_task(self._renew(bid, chunk))
        try:
            if bid not in self._lines:
                self._lines[bid] = await asyncio.to_thread(self.store.lines, bid)
            lines = self._lines[bid][chunk * size : (chunk + 1) * size]
            stored = await asyncio.to_thread(self.store.results, bid)
            todo = [line for line in lines if line["n"] not in stored]
            if taken_over and todo:  # the last owner died: what it stored as traces is answered
                recovered = await asyncio.to_thread(
                    traced_lines, self.traces_dir, bid, batch["endpoint"], [line["n"] for line in todo]
                )
                if recovered:
                    await asyncio.to_thread(self.store.append_results, bid, self.owner, recovered)
                    got = {r["n"] for r in recovered}
                    todo = [line for line in todo if line["n"] not in got]
            for line in todo:
                await self.lanes.acquire(line["body"]["model"])
                if bid in self.cancelled:
                    self.lanes.release(line["body"]["model"])
                    break
                tasks.append(asyncio.create_task(self._run_line(batch, line, pending)))
            n_answered = sum(await asyncio.gather(*tasks))
            flushed, pending[:] = pending[:], []
            if flushed:
                await asyncio.to_thread(self.store.append_results, bid, self.owner, flushed)
            done_all, finished = n_answered == len(todo), True
        except Exception:
            log.exception("batch %s chunk %d failed; it is taken over once its lease lapses", bid, chunk)
        finally:
            renewer.cancel()
            if finished:
                await asyncio.to_thread(self.store.release, bid, self.owner, [chunk], done_all)
            else:
                await self._abandon(bid, chunk, tasks, pending)

    async def _abandon(self, bid: str, chunk: int, tasks: list[asyncio.Task], pending: list[dict]) -> None:
        """A chunk that did not finish: its lines in flight stop (they had no answer, so they
        run again), what was answered is written even now (its traces back it up if not), and
        the lease is left to lapse."""
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if pending:
            try:
                await asyncio.shield(asyncio.to_thread(self.store.append_results, bid, self.owner, pending[:]))
            except BaseException:
                log.warning(
                    "batch %s chunk %d: %d answered lines left to be recovered from their traces", bid, chunk, len(pending)
                )

    async def _run_line(self, batch: dict, line: dict, pending: list[dict]) -> bool:
        """Whether the line was answered (not cancelled before it started)."""
        try:
            result = await self._answer(batch, line)
            if result is None:
                return False
            pending.append(result)
            if len(pending) >= 16:  # group commit; a crash before it loses nothing (traced_lines)
                flushed = pending[:]
                pending.clear()
                await asyncio.to_thread(self.store.append_results, batch["id"], self.owner, flushed)
            return True
        finally:
            self.lanes.release(line["body"]["model"])

    async def _answer(self, batch: dict, line: dict) -> dict | None:
        """The line's result, or None if it was cancelled before it started."""
        bid, n = batch["id"], line["n"]
        operation, _ = ENDPOINTS[batch["endpoint"]]
        body = dict(line["body"])
        while bid not in self.cancelled:
            ctx = self._context(batch, line, operation, body)
            try:
                data, _ = await self.forwarder.forward(operation, body, ctx)
                return {
                    "n": n,
                    "ok": True,
                    "usage": data.get("usage"),
                    "line": output_line(line["custom_id"], 200, data, request_id=ctx.trace_id),
                }
            except (CapacityExceeded, TraceStoreBehind, BudgetUncheckable):
                await asyncio.sleep(self.cfg.retry_s)
                continue
            except APIError as err:
                return {
                    "n": n,
                    "ok": False,
                    "line": output_line(
                        line["custom_id"],
                        err.status,
                        err.body(),
                        {"code": err.code or err.type, "message": err.message},
                        request_id=ctx.trace_id,
                    ),
                }
            except Exception as exc:  # a bug on our side: the line fails, the batch goes on
                log.exception("batch %s line %d", bid, n)
                return {
                    "n": n,
                    "ok": False,
                    "line": output_line(
                        line["custom_id"], 500, None, {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
                    ),
                }
        return None

    def _context(self, batch: dict, line: dict, operation: str, body: dict) -> RequestContext:
        return RequestContext.for_route(
            self.forwarder.routes.get(body["model"]),
            f"tr-{batch['id']}-{line['n']}",
            operation,
            body,
            team=batch["team"],
            api_key_id=batch.get("_api_key_id"),
            batch_id=batch["id"],
            custom_id=line["custom_id"],
        )

    async def _renew(self, batch_id: str, chunk: int) -> None:
        while True:
            await asyncio.sleep(self.cfg.lease_ttl_s / 3)
            await asyncio.to_thread(self.store.renew, batch_id, self.owner, [chunk], self.cfg.lease_ttl_s)

    def _key_revoked(self, batch: dict) -> bool:
        """Whether the key that created the batch was revoked since (a revoked key's work stops)."""
        key_id = batch.get("_api_key_id")
        if self.keys is None or not key_id or key_id == "admin":
            return False
        record = self.keys.by_id(key_id)
        return record is None or record.revoked

    def _stop_revoked(self, batch: dict) -> None:
        log.warning("batch %s: its key %s was revoked; cancelling it", batch["id"], batch.get("_api_key_id"))
        self._stop(batch, "_revoked")

    def _expire(self, batch: dict) -> None:
        self._stop(batch, "_expired")

    def _stop(self, batch: dict, why: str) -> None:
        """An in-progress batch starts cancelling, marked with ``why``."""

        def change(b: dict) -> bool:
            if b["status"] != "in_progress":
                return False
            b.update({"status": "cancelling", why: True, "cancelling_at": int(time.time())})
            return True

        batch.update(self.store.update(batch["id"], change))
