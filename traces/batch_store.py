"""Durable state of the Batch API, kept beside the traces: uploaded files, batches, their
results, and which replica runs which lines.

Everything is plain files under ``<traces>/_batches/`` (the store's views read only
``date=*/``), so a batch outlives any gateway process and every replica on the host sees it:

- ``files/<id>.json`` and ``files/<id>.data``: a file's metadata (its team included) and bytes;
- ``batches/<id>/batch.json``: the batch object and its team;
- ``batches/<id>/lines.jsonl``: the input lines that passed validation, written once;
- ``batches/<id>/results-<owner>.jsonl``: each owner's answered lines, appended and fsync'd;
  a line is done once its result is here (a torn last line, from a crash, is ignored);
- ``batches/<id>/claims.json``: chunk of lines -> owner and lease expiry, or ``"done"``;
- ``active/<id>``: an empty marker per batch that may still have work, so the schedulers'
  frequent look for work reads the batches that can have some, not the whole history.

Whole files are replaced by write-tmp, fsync, rename, fsync-directory; read-modify-write of a
batch or its claims holds an exclusive ``flock`` on the batch's ``.lock``, so replicas never
lease one chunk twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from traces.files import append_durably, private_dirs, write_atomic
from traces.spool import fsync_path

BATCH_DIR = "_batches"
DONE = "done"
ACTIVE = ("in_progress", "finalizing", "cancelling")  # statuses with work left: listed in active/
_ORPHAN_S = 60.0  # a marker whose batch.json never appeared (a crash inside create) is dropped after this


def _read_jsonl(path: Path) -> list[dict]:
    return _read_jsonl_bytes(path.read_bytes())


def _read_jsonl_bytes(data: bytes) -> list[dict]:
    """Intact lines only: a crash can leave a torn last line, which nobody was told was stored."""
    out = []
    for raw in data.split(b"\n"):
        if raw.strip():
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError:
                break
    return out


def new_id(prefix: str) -> str:
    """OpenAI's id styles: ``file-…``, ``batch_…``, ``batch_req_…``."""
    return prefix + secrets.token_hex(12)


def _instance(owner: str) -> str:
    return owner.split("/", 1)[0]


class FileStore:
    """Uploaded files and the files batches produce; each belongs to one team."""

    def __init__(self, traces_dir: str | Path, ttl_s: float | None = None):
        """``ttl_s``: a file is deleted this long after it was made (None: kept until deleted)."""
        self.dir = private_dirs(Path(traces_dir) / BATCH_DIR / "files")
        self.ttl_s = ttl_s

    def put(self, team: str, filename: str, purpose: str, data: bytes) -> dict:
        now = int(time.time())
        meta = {
            "id": new_id("file-"),
            "object": "file",
            "bytes": len(data),
            "created_at": now,
            "expires_at": None if self.ttl_s is None else now + int(self.ttl_s),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "team": team,
        }
        write_atomic(self.dir / f"{meta['id']}.data", data)
        write_atomic(self.dir / f"{meta['id']}.json", json.dumps(meta).encode())
        return meta

    def get(self, file_id: str) -> dict | None:
        path = self.dir / f"{file_id}.json"
        if "/" in file_id or not path.is_file():
            return None
        return json.loads(path.read_text())

    def content(self, file_id: str) -> bytes:
        return (self.dir / f"{file_id}.data").read_bytes()

    def list(self) -> list[dict]:
        metas = [json.loads(p.read_text()) for p in self.dir.glob("*.json")]
        return sorted(metas, key=lambda m: (m["created_at"], m["id"]), reverse=True)

    def expire(self, now: float | None = None) -> list[str]:
        """Delete the files whose time is up; returns their ids."""
        now = time.time() if now is None else now
        gone = [m["id"] for m in self.list() if m.get("expires_at") is not None and m["expires_at"] <= now]
        for file_id in gone:
            self.delete(file_id)
        return gone

    def delete(self, file_id: str) -> None:
        (self.dir / f"{file_id}.json").unlink(missing_ok=True)  # metadata first: then it is gone
        (self.dir / f"{file_id}.data").unlink(missing_ok=True)
        fsync_path(self.dir)


class BatchStore:
    def __init__(self, traces_dir: str | Path):
        self.dir = private_dirs(Path(traces_dir) / BATCH_DIR / "batches")
        self.active_dir = self.dir.parent / "active"
        if not self.active_dir.is_dir():
            self._build_active_index()
        self._seen: dict[str, dict[str, tuple[int, dict]]] = {}  # batch -> results file -> (read to, results)
        self._results_lock = threading.Lock()

    def _path(self, batch_id: str) -> Path:
        return self.dir / batch_id

    def _build_active_index(self) -> None:
        """Markers for a store written before the index existed; built aside and renamed into
        place, so a crash halfway leaves no partial index behind."""
        tmp = self.active_dir.with_name(f".active.{os.getpid()}.tmp")
        tmp.mkdir(mode=0o700, exist_ok=True)
        for batch in self.list():
            if batch["status"] in ACTIVE:
                (tmp / batch["id"]).touch(mode=0o600)
        try:
            os.rename(tmp, self.active_dir)
        except OSError:  # another replica built it first
            shutil.rmtree(tmp, ignore_errors=True)

    # -- batches ------------------------------------------------------------------------------

    def create(self, batch: dict, lines: list[dict], rejected: list[dict]) -> None:
        """A new batch: its validated lines, and the lines refused at validation as results
        already (they count as failed and go to the error file)."""
        d = self._path(batch["id"])
        d.mkdir(mode=0o700)
        fsync_path(d.parent)
        (self.active_dir / batch["id"]).touch(mode=0o600)  # before batch.json: no batch exists unlisted
        write_atomic(d / "lines.jsonl", b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        if rejected:
            self.append_results(batch["id"], "validation", rejected)
        write_atomic(d / "batch.json", json.dumps(batch).encode())  # last: the batch exists now

    def get(self, batch_id: str) -> dict | None:
        path = self._path(batch_id) / "batch.json"
        if "/" in batch_id or not path.is_file():
            return None
        return json.loads(path.read_text())

    def list(self) -> list[dict]:
        batches = [json.loads(p.read_text()) for p in self.dir.glob("*/batch.json")]
        return sorted(batches, key=lambda b: (b["created_at"], b["id"]), reverse=True)

    def active(self) -> list[dict]:
        """The batches that may still have work (oldest first); markers of ended batches are
        dropped here, so the index heals itself whoever ended the batch."""
        out, now = [], time.time()
        for marker in self.active_dir.iterdir():
            batch = self.get(marker.name)
            if batch is None:
                try:
                    stale = now - marker.stat().st_mtime > _ORPHAN_S
                except FileNotFoundError:  # another replica dropped it just now
                    continue
            else:
                stale = batch["status"] not in ACTIVE
                if not stale:
                    out.append(batch)
            if stale:
                marker.unlink(missing_ok=True)
        return sorted(out, key=lambda b: (b["created_at"], b["id"]))

    def update(self, batch_id: str, change: Callable[[dict], bool]) -> dict:
        """Apply ``change`` to the batch under its lock; it returns whether to write."""
        with self._locked(batch_id):
            batch = self.get(batch_id)
            if change(batch):
                write_atomic(self._path(batch_id) / "batch.json", json.dumps(batch).encode())
            return batch

    def lines(self, batch_id: str) -> list[dict]:
        return _read_jsonl(self._path(batch_id) / "lines.jsonl")

    # -- results ------------------------------------------------------------------------------

    def append_results(self, batch_id: str, owner: str, results: list[dict]) -> None:
        """Durable on return. Each result carries ``n`` (its input line) and ``ok``."""
        append_durably(
            self._path(batch_id) / f"results-{owner.replace('/', '.')}.jsonl",
            b"".join(json.dumps(r).encode() + b"\n" for r in results),
        )

    def results(self, batch_id: str) -> dict[int, dict]:
        """Input line -> its result, over every owner's file (the first answer of a line wins).
        Files only grow, so each call reads just the bytes appended since the last one."""
        with self._results_lock:
            return self._results(batch_id)

    def forget(self, batch_id: str) -> None:
        """Drop the cached results of a batch that has ended."""
        with self._results_lock:
            self._seen.pop(batch_id, None)

    def _results(self, batch_id: str) -> dict[int, dict]:
        seen = self._seen.setdefault(batch_id, {})
        for path in sorted(self._path(batch_id).glob("results-*.jsonl")):
            offset, got = seen.get(path.name, (0, {}))
            with open(path, "rb") as f:
                f.seek(offset)
                tail = f.read()
            whole = tail[: tail.rfind(b"\n") + 1]  # a line still being written waits for the next call
            for r in _read_jsonl_bytes(whole):
                got.setdefault(r["n"], r)
            seen[path.name] = (offset + len(whole), got)
        out: dict[int, dict] = {}
        for name in sorted(seen):
            for n, r in seen[name][1].items():
                out.setdefault(n, r)
        return out

    # -- leases on chunks of lines ------------------------------------------------------------

    def claim(self, batch_id: str, owner: str, n_chunks: int, ttl_s: float) -> tuple[list[int], list[int]]:
        """Lease up to ``n_chunks`` chunks no live owner holds. Returns (chunks leased, those
        among them that a lapsed owner held: their lines may have run, so check before running)."""
        with self._locked(batch_id):
            claims = self._claims(batch_id)
            now, got, taken_over = time.time(), [], []
            for chunk, c in enumerate(claims["chunks"]):
                if len(got) >= n_chunks:
                    break
                # a live lease is skipped, ours too (its chunk is running), except one of our own
                # instance's earlier lifetime: an owner is "instance/lifetime", and an instance
                # runs once at a time, so that one died
                live = (
                    isinstance(c, dict)
                    and c["expires"] > now
                    and (c["owner"] == owner or _instance(c["owner"]) != _instance(owner))
                )
                if c == DONE or live:
                    continue
                if c is not None:  # a lapsed lease, ours too: its lines may have run
                    taken_over.append(chunk)
                claims["chunks"][chunk] = {"owner": owner, "expires": now + ttl_s}
                got.append(chunk)
            if got:
                self._save_claims(batch_id, claims)
            return got, taken_over

    def renew(self, batch_id: str, owner: str, chunks: list[int], ttl_s: float) -> None:
        self._set_claims(batch_id, owner, chunks, lambda: {"owner": owner, "expires": time.time() + ttl_s})

    def release(self, batch_id: str, owner: str, chunks: list[int], done: bool) -> None:
        """Done: every line of the chunk has its result. Otherwise hand the chunk back."""
        self._set_claims(batch_id, owner, chunks, lambda: DONE if done else None)

    def live_leases(self, batch_id: str) -> int:
        with self._locked(batch_id):
            now = time.time()
            return sum(1 for c in self._claims(batch_id)["chunks"] if isinstance(c, dict) and c["expires"] > now)

    def chunks_left(self, batch_id: str) -> int:
        with self._locked(batch_id):
            return sum(1 for c in self._claims(batch_id)["chunks"] if c != DONE)

    def _set_claims(self, batch_id: str, owner: str, chunks: list[int], value: Callable[[], object]) -> None:
        with self._locked(batch_id):
            claims = self._claims(batch_id)
            for chunk in chunks:
                c = claims["chunks"][chunk]
                if isinstance(c, dict) and c["owner"] == owner:  # a chunk taken over is not ours now
                    claims["chunks"][chunk] = value()
            self._save_claims(batch_id, claims)

    def _claims(self, batch_id: str) -> dict:
        path = self._path(batch_id) / "claims.json"
        if path.is_file():
            return json.loads(path.read_text())
        batch = self.get(batch_id)
        return {"chunks": [None] * batch["_chunks"]}

    def _save_claims(self, batch_id: str, claims: dict) -> None:
        # not fsync'd: a lost lease only means a chunk is looked at again, and results decide
        path = self._path(batch_id) / "claims.json"
        tmp = path.with_name(f".claims.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(claims))
        os.replace(tmp, path)

    @contextmanager
    def _locked(self, batch_id: str):
        with open(self._path(batch_id) / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
