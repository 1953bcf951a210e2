"""One team's worst (the heaviest SQL and request bodies the gateway accepts or refuses) must
not harm another team's requests: the other team's streams keep being answered. TTFT figures
are printed side by side (idle, then under attack); what is asserted is a count: no request of
the other team failed or waited past its timeout.

The attacker is another process, as it would be: in the test's own process its threads would
share the measuring client's GIL and the figures would be the test's, not the gateway's."""

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serve.keys import KeyStore

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 15.0
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "say something"}], "max_tokens": 8, "stream": True}


def ttft(client: httpx.Client, headers: dict) -> float | None:
    """Seconds to the first streamed token, or None if the request failed or timed out."""
    t0 = time.perf_counter()
    try:
        with client.stream("POST", "/v1/chat/completions", json=CHAT, headers=headers, timeout=TIMEOUT_S) as r:
            if r.status_code != 200:
                return None
            first = None
            for line in r.iter_lines():  # read to the end: the stream must finish too
                if first is None and line.startswith("data: {") and '"content"' in line:
                    first = time.perf_counter() - t0
            return first
    except httpx.HTTPError:
        return None


def attacks(n_tools: int = 120) -> list[tuple[str, str, dict | bytes]]:
    """(method, path, body): the heavy things one team can send, over and over."""
    cte = "WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM r WHERE i < 1499) "

    def tools(salt):
        return [
            {
                "type": "function",
                "function": {
                    "name": f"t{i}",
                    "parameters": {"type": "object", "title": f"{salt}-{i}", "properties": {"q": {"type": "string"}}},
                },
            }
            for i in range(n_tools)
        ]

    deep = b'{"model": "tiny", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    big = json.dumps({"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * 1000}] * 20_000}).encode()
    return [
        ("POST", "/v1/traces/query", {"sql": "SELECT length(repeat('x', 3000000000)) AS n"}),
        ("POST", "/v1/traces/query", {"sql": cte + "SELECT i, repeat('x', 1000000) AS s FROM r", "max_rows": 1_000_000}),
        ("POST", "/v1/chat/completions", lambda: {**CHAT, "stream": False, "max_tokens": 1, "tools": tools(time.monotonic_ns())}),
        ("POST", "/v1/chat/completions", deep),
        ("POST", "/v1/chat/completions", big),
    ]


def test_one_teams_worst_does_not_harm_another_teams_streams(sim_stack):
    gw = sim_stack.resolved_gateway()
    keys = KeyStore(gw.keys_file)
    victim = {"Authorization": f"Bearer {keys.create('steady')[1]}"}
    noisy = {"Authorization": f"Bearer {keys.create('noisy')[1]}"}
    base = f"http://{gw.host}:{gw.port}"
    n = 200
    with httpx.Client(base_url=base) as client:
        for _ in range(3):
            ttft(client, victim)  # warm
        idle = [ttft(client, victim) for _ in range(n)]

        attacker = subprocess.Popen(
            [sys.executable, __file__, base, noisy["Authorization"]],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        try:
            assert attacker.stdout.readline().strip() == "attacking"
            time.sleep(2)  # every attack under way
            loaded = [ttft(client, victim) for _ in range(n)]
        finally:
            attacker.send_signal(signal.SIGTERM)
            out, _ = attacker.communicate(timeout=180)
        attacker_statuses = {tuple(k): v for k, v in json.loads(out)}
        assert client.get("/health").status_code == 200

    def p(xs, q):
        xs = sorted(x * 1000 for x in xs if x is not None)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    print(
        f"\nvictim TTFT ms, idle: p50 {p(idle, 0.5):.1f} p99 {p(idle, 0.99):.1f}; "
        f"under attack: p50 {p(loaded, 0.5):.1f} p99 {p(loaded, 0.99):.1f} "
        f"(p99 ratio {p(loaded, 0.99) / p(idle, 0.99):.2f}); attacker: {attacker_statuses}"
    )
    failed = sum(x is None for x in idle + loaded)
    assert failed == 0, f"{failed} of {2 * n} requests of the other team failed or waited past {TIMEOUT_S} s"
    assert not any(isinstance(s, int) and s == 500 for (_, _, s) in attacker_statuses), attacker_statuses
    assert statistics.mean(x for x in loaded if x is not None) > 0


def attack_until_stopped(base: str, authorization: str) -> None:
    """The noisy team: every attack in its own thread, over and over, until SIGTERM; then the
    count of each (path, kind, status) as JSON on stdout."""
    stop, statuses = threading.Event(), {}
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def attack(kind: int) -> None:
        method, path, body = attacks()[kind]
        with httpx.Client(base_url=base, timeout=120) as c:
            while not stop.is_set():
                payload = body() if callable(body) else body
                kw = {"content": payload} if isinstance(payload, bytes) else {"json": payload}
                try:
                    status = c.request(
                        method, path, headers={"Authorization": authorization, "Content-Type": "application/json"}, **kw
                    ).status_code
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                statuses[(path, kind, status)] = statuses.get((path, kind, status), 0) + 1

    threads = [threading.Thread(target=attack, args=(k,)) for k in range(len(attacks()))]
    for t in threads:
        t.start()
    print("attacking", flush=True)
    while not stop.wait(0.1):
        pass
    for t in threads:
        t.join(180)
    print(json.dumps([[list(k), v] for k, v in statuses.items()]))


if __name__ == "__main__":
    attack_until_stopped(sys.argv[1], sys.argv[2])
