"""Steady traffic for swap tests: one request every ``1/rps`` seconds, each on its own thread
(so slow answers never throttle the rate), every answer or exception kept for counting."""

from __future__ import annotations

import threading
import time

import httpx


class SteadyLoad:
    def __init__(self, url: str, body: dict, rps: float = 20, headers: dict | None = None):
        self.url, self.body, self.period, self.headers = url, body, 1 / rps, headers or {}
        self.results: list = []
        self._stop = threading.Event()
        self._loader = threading.Thread(target=self._run)

    def _one(self) -> None:
        try:
            self.results.append(httpx.post(self.url, json=self.body, headers=self.headers, timeout=120))
        except httpx.HTTPError as exc:
            self.results.append(exc)

    def _run(self) -> None:
        workers = []
        while not self._stop.is_set():
            t = threading.Thread(target=self._one)
            t.start()
            workers.append(t)
            time.sleep(self.period)
        for t in workers:
            t.join()

    def __enter__(self) -> "SteadyLoad":
        self._loader.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._loader.join()

    def wait_for(self, n: int, timeout_s: float = 180) -> None:
        """Until ``n`` answers came back (counts, not rates: a slow machine just takes longer)."""
        deadline = time.monotonic() + timeout_s
        while len(self.results) < n:
            assert time.monotonic() < deadline, f"only {len(self.results)} of {n} requests answered"
            time.sleep(0.05)

    def failed(self) -> list:
        return [r for r in self.results if not isinstance(r, httpx.Response) or r.status_code != 200]


def wait_for_trace_rows(store, env_id: str, n: int, timeout_s: float = 30) -> None:
    """Until ``n`` rows with ``env_id`` are queryable (they reach Parquet within the flush age)."""
    deadline = time.monotonic() + timeout_s
    while store.sql(f"SELECT count(*) AS n FROM traces WHERE env_id = '{env_id}'").column("n")[0].as_py() < n:
        assert time.monotonic() < deadline, f"not every answered request of {env_id} has its trace row"
        time.sleep(0.3)
        store.refresh()
