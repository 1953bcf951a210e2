"""Latency the gateway adds, against calling the deployment directly and against a minimal
relay in front of it, side by side.

    .venv/bin/flywheel up -p sim && .venv/bin/python -m deploy.bench.gateway [--rates 10,25,50,100]
        [--tokens 16]       # tokens per streamed answer (4)
        [--prompt-kb 512]   # an agent-sized conversation instead of "hi": the deployment's
                            # context must hold it (flywheel up -p sim --set worker.max_model_len=262144)
        [--api responses|messages]  # the same conversation through that API's route in place
                                    # of the minimal relay: what its translation adds over chat
    .venv/bin/python -m deploy.bench.gateway --canned [--rates 100,200] [--alone-rates 100,500,1000] [--tokens 16]
        # no stack: a gateway of its own (default config, capture on) and the minimal relay in
        # front of deploy/bench/canned_upstream.py, which answers at once; then the gateway
        # alone, as fast as it answers, to check the ceiling its CPU per request projects

Open-loop load at each fixed rate (requests are sent on schedule whether or not earlier ones
finished), streaming, with trace capture on (the gateway's normal path: durable spool, then
Parquet). Requests rotate between the gateway, the minimal relay (``deploy/bench/relay.py``,
started here on the same frontend) and the deployment's frontend, so the three paths see the
same machine at the same moment. Reported: time to the first streamed token and to the end,
the CPU the gateway's and the relay's processes spent per request they served (/proc),
p50 / p99, each path's addition to the direct one, and the highest rate at which the
gateway's added p99 TTFT stays under 5 ms. Rates where the deployment itself is saturated
(direct TTFT p50 far above its unloaded value) say nothing about the gateway: read the
direct column first.

With ``--canned`` the deployment is a stand-in that streams the same answer at once, so the
gateway is what saturates: the gateway (its trace mover included) runs on core 0, the stand-in,
the relay and this load on core 1. Besides the rates, it prints the ceiling the gateway's CPU per
request projects (requests a second per core), the gateway's CPU per request with it alone at
fixed rates (``--alone-rates``, open loop: each path above gets a third of ``--rates``), and what
it actually answered with ``--saturate`` streams kept open against it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import httpx

from deploy.bench import pct
from deploy.bench.raw_client import RawConnection, connect, open_loop, post_bytes
from deploy.stack.config import load_config
from deploy.stack.processes import ProcessManager, cpu_seconds, group_pids
from traces.store import TraceStore
from serve.upstream_http import upstream_client

PATHS = ("gw", "relay", "direct")
ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def conversation(prompt_kb: int) -> list[dict]:
    """ "hi"; with ``prompt_kb``, an agent-like conversation of about that many KB (40 turns):
    the gateway reads, checks, forwards and stores all of it."""
    messages = [{"role": "user", "content": "hi"}]
    if prompt_kb:
        turn = "x" * (prompt_kb * 1024 // 40)
        messages = [{"role": ("user", "assistant")[i % 2], "content": f"turn {i}: {turn}"} for i in range(39)]
        messages.append({"role": "user", "content": "hi"})
    return messages


def request_body(api: str, messages: list[dict], tokens: int = 4) -> dict:
    """A streamed request of ``tokens`` tokens for ``messages`` in ``api``'s shape."""
    if api == "responses":
        return {"model": "tiny", "input": messages, "max_output_tokens": tokens, "stream": True}
    return {"model": "tiny", "messages": messages, "max_tokens": tokens, "stream": True}


async def one(client: httpx.AsyncClient, url: str, out: dict, key: str, body: dict) -> None:
    """One streamed request; its TTFT is the first data event (every API sends its first on the
    engine's first chunk)."""
    t0 = time.perf_counter()
    first = None
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                out[key + "_errors"] += 1
                return
            async for line in r.aiter_lines():
                if first is None and line.startswith("data: {"):
                    first = time.perf_counter() - t0
    except httpx.HTTPError:
        out[key + "_errors"] += 1
        return
    out[key + "_ttft"].append(first if first is not None else float("nan"))
    out[key + "_total"].append(time.perf_counter() - t0)


def group_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and everything in its process group (the
    gateway's trace mover is its child)."""
    return sum(cpu_seconds(p) for p in group_pids(os.getpgid(pid)))


async def run_rate(
    urls: dict[str, str], rate: float, seconds: float, bodies: dict[str, dict], pids: dict[str, int] | None = None
) -> dict:
    """``pids``: the gateway's and the relay's; their CPU per request they served is reported."""
    pids = pids or {}
    cpu_before = {p: group_cpu_s(pid) for p, pid in pids.items()}
    out = {f"{p}_{m}": [] for p in PATHS for m in ("ttft", "total")}
    out.update({f"{p}_errors": 0 for p in PATHS})
    # the gateway's own client: TCP_NODELAY and quick ACKs, so no path shows the kernel's
    # 40 ms delayed-ACK artefact and the comparison is of the servers only
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=500)
    async with upstream_client(httpx.Timeout(60), limits) as client:
        tasks, n = [], int(rate * seconds)
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            key = PATHS[i % len(PATHS)]
            tasks.append(asyncio.create_task(one(client, urls[key], out, key, bodies[key])))
        achieved = n / (time.perf_counter() - start)
        await asyncio.gather(*tasks)
    row = {"rate": rate, "achieved_send_rate": round(achieved, 1), "errors": sum(out[f"{p}_errors"] for p in PATHS)}
    row["answered_gw"] = len(out["gw_total"])
    for p, pid in pids.items():  # each path got every third request
        row[f"cpu_ms_per_request_{p}"] = round((group_cpu_s(pid) - cpu_before[p]) * 1000 / len(range(PATHS.index(p), n, 3)), 3)
    for metric in ("ttft", "total"):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            d = pct(out[f"direct_{metric}"], q) * 1000
            row[f"{metric}_{name}_direct_ms"] = round(d, 2)
            for p in ("gw", "relay"):
                row[f"{metric}_{name}_{p}_ms"] = round(pct(out[f"{p}_{metric}"], q) * 1000, 2)
                row[f"{metric}_{name}_{p}_added_ms"] = round(row[f"{metric}_{name}_{p}_ms"] - d, 2)
    return row


def finished(status: int, data: bytes) -> bool:
    """A streamed answer that ended as it should: a 200 that sent ``[DONE]``."""
    return status == 200 and b"data: [DONE]" in data


async def saturate(url: str, body: dict, streams: int, seconds: float, pid: int) -> dict:
    """``streams`` connections against one server alone (the gateway, or the relay), each
    sending its next request as soon as its last answer ended, for ``seconds``: what it
    answered a second (a 200 that sent ``[DONE]``), and the CPU of ``pid``'s process group."""
    request, tally = post_bytes(url, body), {"answered": 0, "errors": 0}
    cpu_before, start = group_cpu_s(pid), time.perf_counter()

    def answered(conn: RawConnection, status: int, headers: dict[str, str], data: bytes) -> None:
        tally["answered" if finished(status, data) else "errors"] += 1
        if status and time.perf_counter() < start + seconds:
            conn.send(request)
        else:
            conn.transport.close()

    conns = [await connect(url, answered) for _ in range(streams)]
    for conn in conns:
        conn.send(request)
    await asyncio.gather(*(c.closed for c in conns))
    wall, cpu = time.perf_counter() - start, group_cpu_s(pid) - cpu_before
    return {
        "streams": streams,
        "answered": tally["answered"],
        "answered_per_s": round(tally["answered"] / wall, 1),
        "errors": tally["errors"],
        "cpu_ms_per_request": round(cpu * 1000 / max(tally["answered"], 1), 3),
        "core_share": round(cpu / wall, 2),
    }


async def alone_at(url: str, body: dict, rate: float, seconds: float, pid: int) -> dict:
    """The gateway alone at a fixed ``rate`` (open loop, raw connections: httpx could not offer
    1,000 streamed requests a second from one core): what it answered and the CPU of ``pid``'s
    process group, the trace mover included, per answer."""
    tally = {"answered": 0, "errors": 0}

    def on_answer(conn: RawConnection, status: int, headers: dict[str, str], data: bytes) -> None:
        if status:
            tally["answered" if finished(status, data) else "errors"] += 1

    cpu_before, own_before, start = group_cpu_s(pid), cpu_seconds(pid), time.perf_counter()
    unanswered = await open_loop(url, post_bytes(url, body), rate, seconds, on_answer)
    wall, cpu, own = time.perf_counter() - start, group_cpu_s(pid) - cpu_before, cpu_seconds(pid) - own_before
    per_request = 1000 / max(tally["answered"], 1)
    return {
        "rate": rate,
        "answered": tally["answered"],
        "errors": tally["errors"] + unanswered,
        "cpu_ms_per_request": round(cpu * per_request, 3),
        "mover_cpu_ms_per_request": round((cpu - own) * per_request, 3),  # its child: a fixed cost per segment
        "core_share": round(cpu / wall, 2),
    }


def start_canned(tokens: int, port: int, workdir: str) -> tuple[dict[str, str], dict[str, subprocess.Popen]]:
    """The stand-in deployment (``port``), a gateway with a default config in front of it
    (``port + 1``, traces under ``workdir``) and the minimal relay (``port + 2``), each in a
    process group of its own; the gateway on core 0, the rest and this process on core 1."""
    from serve.config import GatewayConfig

    canned = f"http://127.0.0.1:{port}"
    gw = GatewayConfig(
        port=port + 1,
        instance="bench-canned",
        traces_dir=os.path.join(workdir, "traces"),
        deployments=[{"name": "canned", "url": canned}],
        models={"tiny": {"deployment": "canned", "upstream_model": "tiny"}},
    )
    config = os.path.join(workdir, "gateway.json")
    with open(config, "w") as f:
        f.write(gw.model_dump_json())
    argvs = {
        "canned": ["deploy.bench.canned_upstream", "--port", str(port), "--tokens", str(tokens)],
        "gw": ["serve", "--config", config],
        "relay": ["deploy.bench.relay", "--upstream", canned, "--port", str(port + 2)],
    }
    procs = {}
    for name, argv in argvs.items():
        procs[name] = subprocess.Popen([sys.executable, "-m", *argv], start_new_session=True)
        os.sched_setaffinity(procs[name].pid, {0} if name == "gw" else {1})  # before it starts threads
    os.sched_setaffinity(0, {1})
    urls = {
        "gw": gw.url + ROUTES["chat"],
        "relay": f"http://127.0.0.1:{port + 2}" + ROUTES["chat"],
        "direct": canned + ROUTES["chat"],
    }
    for probe in (canned + "/v1/models", gw.url + "/health", f"http://127.0.0.1:{port + 2}/docs"):
        for _ in range(300):
            try:
                httpx.get(probe, timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"{probe} did not answer in 30 s")
    return urls, procs


def stop_all(procs: dict[str, subprocess.Popen]) -> None:
    for proc in procs.values():
        proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def canned_main(args: argparse.Namespace) -> None:
    chat = request_body("chat", conversation(args.prompt_kb), args.tokens)
    bodies = {p: chat for p in PATHS}
    with tempfile.TemporaryDirectory(prefix="fw-bench-gw-") as workdir:
        urls, procs = start_canned(args.tokens, args.canned_port, workdir)
        try:
            pids = {"gw": procs["gw"].pid, "relay": procs["relay"].pid}
            warm = asyncio.run(run_rate(urls, 10, 2, bodies))
            rows = [asyncio.run(run_rate(urls, float(r), args.seconds, bodies, pids)) for r in args.rates.split(",")]
            alone = [
                asyncio.run(alone_at(urls["gw"], chat, float(r), args.seconds, pids["gw"])) for r in args.alone_rates.split(",")
            ]
            full = {"gw": asyncio.run(saturate(urls["gw"], chat, args.saturate, args.seconds, pids["gw"]))}
            for tid in os.listdir(f"/proc/{pids['relay']}/task"):  # the relay gets the gateway's core for its turn
                os.sched_setaffinity(int(tid), {0})
            full["relay"] = asyncio.run(saturate(urls["relay"], chat, args.saturate, args.seconds, pids["relay"]))
        finally:
            stop_all(procs)  # the gateway converts what its spool holds as it stops
        # capture was on: every answer the gateway sent [DONE] for is a row in Parquet
        answered = warm["answered_gw"] + sum(r["answered_gw"] for r in rows) + sum(a["answered"] for a in alone)
        answered += full["gw"]["answered"]
        stored = TraceStore(os.path.join(workdir, "traces")).count()
    print(
        json.dumps(
            {"rates": rows, "alone": alone, "saturated": full, "gateway_answers": answered, "trace_rows_stored": stored}, indent=2
        )
    )
    for r in rows:
        gw_ms, relay_ms = r["cpu_ms_per_request_gw"], r["cpu_ms_per_request_relay"]
        print(
            f"{r['rate']:.0f}/s ({r['errors']} errors): CPU ms per streamed request of {args.tokens} tokens: gateway "
            f"{gw_ms:.2f}, the minimal relay {relay_ms:.2f}; projected ceiling {1000 / gw_ms:.0f} requests/s per core"
        )
    for a in alone:
        print(
            f"the gateway alone at {a['rate']:.0f}/s: {a['answered']} answered ({a['errors']} errors) on "
            f"{a['core_share']:.2f} of a core, {a['cpu_ms_per_request']:.2f} ms CPU per streamed request of {args.tokens} tokens "
            f"({a['mover_cpu_ms_per_request']:.2f} of it the trace mover's)"
        )
    for p, name in (("gw", "the gateway"), ("relay", "the minimal relay")):
        f = full[p]
        print(
            f"{name} alone, {f['streams']} streams kept open: {f['answered_per_s']:.0f} requests/s answered "
            f"({f['errors']} errors) on {f['core_share']:.2f} of a core, {f['cpu_ms_per_request']:.2f} ms CPU each"
        )
    print(f"trace rows in Parquet: {stored} of the gateway's {answered} answers")


def translation_ms(api: str, messages: list[dict], n: int = 2000) -> float:
    """What ``api``'s translation costs one streamed request on the CPU, timed alone: its request
    parsed and made chat, and a 4-token chat stream read back and turned into its events, as
    ``serve/translate/chat.py`` does (median of ``n``)."""
    from serve import json_codec
    from serve.api.completions import parsed
    from serve.translate import messages as anthropic, messages_answer, responses, responses_answer

    raw = json.dumps(request_body(api, messages)).encode()
    chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
    chunks += [{"choices": [{"delta": {"content": f"tok{i} "}}]} for i in range(4)]
    chunks += [
        {"choices": [{"delta": {}, "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}},
    ]
    encoded = [json_codec.encode(c) for c in chunks]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        if api == "messages":
            req = parsed(anthropic.MessagesRequest, raw)
            anthropic.chat_body(req)
            stream = messages_answer.MessagesStream("tr-" + "0" * 32, "tiny", req)
        else:
            req = parsed(responses.ResponsesRequest, raw)
            responses.chat_body(req, [])
            stream = responses_answer.ResponsesStream("tr-" + "0" * 32, "tiny", req.model_dump(exclude_unset=True))
        for c in encoded:
            stream.chunk(json_codec.decode(c))
        stream.done()
        times.append(time.perf_counter() - t0)
    return pct(times, 0.5) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gateway", default="http://127.0.0.1:8000")
    ap.add_argument("--direct", default="http://127.0.0.1:8100", help="the deployment's frontend")
    ap.add_argument("--relay-port", type=int, default=8300)
    ap.add_argument("--rates", default="10,25,50,100")
    ap.add_argument("--seconds", type=float, default=9.0)
    ap.add_argument("--prompt-kb", type=int, default=0, help="send a ~N KB agent conversation instead of 'hi'")
    ap.add_argument("--api", choices=["chat", "responses", "messages"], default="chat", help="the third path: this API's route")
    ap.add_argument("--tokens", type=int, default=4, help="tokens per streamed answer")
    ap.add_argument("--profile", default="sim", help="the running stack whose gateway's CPU is measured")
    ap.add_argument(
        "--canned", action="store_true", help="no stack: a gateway of its own in front of a stand-in that answers at once"
    )
    ap.add_argument("--canned-port", type=int, default=8310, help="--canned: the stand-in's port (the gateway +1, the relay +2)")
    ap.add_argument("--saturate", type=int, default=32, help="--canned: streams kept open against the gateway alone")
    ap.add_argument(
        "--alone-rates", default="100,500,1000", help="--canned: fixed rates at which the gateway alone is loaded (open loop)"
    )
    args = ap.parse_args()
    if args.canned:
        canned_main(args)
        return
    messages = conversation(args.prompt_kb)
    chat = request_body("chat", messages, args.tokens)
    gateway_pid = ProcessManager(load_config(args.profile).run_dir).pid("gateway")
    if gateway_pid is None:
        sys.exit(f"no gateway of profile {args.profile!r} is running: flywheel up -p {args.profile}")
    pids = {"gw": gateway_pid}
    bodies = {"gw": chat, "relay": chat, "direct": chat}
    urls = {"gw": args.gateway + ROUTES["chat"], "direct": args.direct + ROUTES["chat"]}
    relay = None
    if args.api == "chat":
        relay_url = f"http://127.0.0.1:{args.relay_port}"
        relay = subprocess.Popen(
            [sys.executable, "-m", "deploy.bench.relay", "--upstream", args.direct, "--port", str(args.relay_port)],
            start_new_session=True,  # a process group of its own: its CPU is counted alone
        )
        urls["relay"] = relay_url + ROUTES["chat"]
        pids["relay"] = relay.pid
    else:  # the "relay" column is this API through the same gateway
        urls["relay"] = args.gateway + ROUTES[args.api]
        bodies["relay"] = request_body(args.api, messages, args.tokens)
    try:
        for _ in range(100 if relay else 0):
            try:
                httpx.get(relay_url + "/docs", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        asyncio.run(run_rate(urls, 10, 2, bodies))  # warm-up: connections, caches, first-request costs
        rows = [asyncio.run(run_rate(urls, float(r), args.seconds, bodies, pids)) for r in args.rates.split(",")]
    finally:
        if relay is not None:
            relay.terminate()
            relay.wait(10)
    print(json.dumps(rows, indent=2))
    print(f"\nprompt: {len(json.dumps(messages)) / 1024:.0f} KB")
    third = "by the minimal relay" if args.api == "chat" else f"by {args.api} (chat's path + translation)"
    print(f"TTFT (ms)  direct p50 / p99   added by the gateway p50 / p99   added {third} p50 / p99   errors")
    for r in rows:
        print(
            f"{r['rate']:>5.0f}/s   {r['ttft_p50_direct_ms']:>7.2f} / {r['ttft_p99_direct_ms']:<7.2f}"
            f"     {r['ttft_p50_gw_added_ms']:>7.2f} / {r['ttft_p99_gw_added_ms']:<7.2f}"
            f"                 {r['ttft_p50_relay_added_ms']:>7.2f} / {r['ttft_p99_relay_added_ms']:<7.2f}"
            f"                   {r['errors']}"
        )
    # a saturated deployment's queue swamps what the gateway adds (it even comes out negative):
    # only rates where the direct path is within 3x of its least-loaded p50 say anything
    floor = min(r["ttft_p50_direct_ms"] for r in rows)
    unsaturated = [r for r in rows if r["ttft_p50_direct_ms"] <= 3 * floor]
    for r in rows:
        if r not in unsaturated:
            print(f"{r['rate']:.0f}/s: the deployment is saturated (direct p50 {r['ttft_p50_direct_ms']:.0f} ms)")
    if args.api != "chat":
        for r in unsaturated:
            ttft, total = r["ttft_p50_relay_ms"] - r["ttft_p50_gw_ms"], r["total_p50_relay_ms"] - r["total_p50_gw_ms"]
            print(
                f"{r['rate']:.0f}/s: {args.api} over chat through the gateway, p50: TTFT {ttft:+.2f} ms, stream {total:+.2f} ms"
            )
        print(f"the translation alone, in process: {translation_ms(args.api, messages):.3f} ms a request (4-token stream)")
    for r in rows:
        relay_cpu = f", the minimal relay {r['cpu_ms_per_request_relay']:.2f}" if "cpu_ms_per_request_relay" in r else ""
        gateway_cpu = r["cpu_ms_per_request_gw"]
        print(f"{r['rate']:.0f}/s: CPU ms per streamed request of {args.tokens} tokens: gateway {gateway_cpu:.2f}{relay_cpu}")
    ok = [r["rate"] for r in unsaturated if r["ttft_p99_gw_added_ms"] <= 5 and r["errors"] == 0]
    print(
        f"highest unsaturated rate with the gateway's added p99 TTFT <= 5 ms: {max(ok):.0f}/s"
        if ok
        else "at no unsaturated rate measured did the gateway's added p99 TTFT stay <= 5 ms"
    )


if __name__ == "__main__":
    main()
