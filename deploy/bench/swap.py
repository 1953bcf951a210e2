"""What a weight swap costs the traffic around it: a LoRA load, an in-place full reload and a
blue-green deploy, side by side in one run on the running stack.

    .venv/bin/flywheel up && .venv/bin/python -m deploy.bench.swap [--rate 10 --seconds 6]

For each kind: open-loop chat requests at ``--rate`` for ``--seconds`` before the swap, during it
and ``--seconds`` after; prints the swap's duration, p50/p99 latency of the requests sent in each
phase, and failed requests (any non-200). The alias goes back to the base model after each kind
(after blue-green, by a blue-green deploy of the base model back to the profile's graph). The
blue-green checkpoint is registered in the stack's own registry and kept under ``<home>/bench/``:
the gateway makes the deployment it runs on from that registry.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from deploy.bench import pct
from deploy.stack.bluegreen import BlueGreen
from deploy.stack.config import load_config
from feedback.hotswap import HotSwap
from feedback.registry import BASE, Registry
from feedback.train import TrainConfig, train_full, train_lora

ROWS = [{"prompt_token_ids": list(range(10, 40)), "completion_token_ids": [500, 501, 502, 503]}] * 8
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "Reverse the word: bench"}], "max_tokens": 8, "temperature": 0}


async def around(gateway: str, rate: float, seconds: float, swap) -> dict:
    """Traffic before, during and after ``swap()`` (run in a thread); latencies by phase."""
    sent: list[tuple[float, float | None]] = []  # (send time, latency or None for a failure)
    window: dict[str, float] = {}

    async def one(client: httpx.AsyncClient) -> None:
        t0 = time.monotonic()
        try:
            ok = (await client.post(f"{gateway}/v1/chat/completions", json=BODY)).status_code == 200
        except httpx.HTTPError:
            ok = False
        sent.append((t0, time.monotonic() - t0 if ok else None))

    async def swapping() -> None:
        await asyncio.sleep(seconds)
        window["start"] = time.monotonic()
        try:
            await asyncio.to_thread(swap)
        finally:  # a failed swap ends the traffic too (and is raised by the gather below)
            window["end"] = time.monotonic()

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=500)) as client:
        swapper, tasks, start = asyncio.create_task(swapping()), [], time.monotonic()
        i = 0
        while not ("end" in window and time.monotonic() > window["end"] + seconds):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client)))
            i += 1
        await asyncio.gather(swapper, *tasks)

    def phase(t: float) -> str:
        return "before" if t < window["start"] else "during" if t <= window["end"] else "after"

    out = {"swap_s": round(window["end"] - window["start"], 3), "sent": len(sent), "failed": sum(lat is None for _, lat in sent)}
    for name in ("before", "during", "after"):
        lats = [lat for t, lat in sent if phase(t) == name and lat is not None]
        out[name] = {"n": len(lats), "p50_ms": round(pct(lats, 0.5) * 1e3, 1), "p99_ms": round(pct(lats, 0.99) * 1e3, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="local")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config key=value, as for up")
    ap.add_argument("--rate", type=float, default=10)
    ap.add_argument("--seconds", type=float, default=6, help="of traffic before and after each swap")
    args = ap.parse_args()
    cfg = load_config(args.profile, args.overrides)
    gw = cfg.resolved_gateway()
    gateway = gw.url
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory(prefix="swap-bench-") as tmp:
        registry = Registry(Path(tmp) / "checkpoints.json")  # the bench's versions stay out of yours
        swap = HotSwap(gateway, gw.admin_key, registry, gw.deployments[0].name, cfg.worker.served_model_name, cfg.model_path)
        made = {
            "lora": train_lora(cfg.model_path, ROWS, Path(tmp) / "lora", TrainConfig(steps=5)),
            "full": train_full(cfg.model_path, ROWS, Path(tmp) / "full", TrainConfig(steps=5, lr=1e-3)),
        }
        report = {"rate": args.rate, "seconds_each_side": args.seconds}
        swap.reset("tiny")
        for kind, path in made.items():
            version = f"bench-{kind}-{stamp}"
            registry.register(version, kind, path, str(cfg.model_path))
            report[kind] = asyncio.run(around(gateway, args.rate, args.seconds, lambda v=version: swap.deploy("tiny", v)))
            swap.reset("tiny")
            if kind == "lora":  # its directory goes with this run: leave no alias naming it
                swap.unload_adapter("tiny", version)
        version = f"bench-blue-green-{stamp}"
        kept = cfg.home_path / "bench" / version
        kept.parent.mkdir(parents=True, exist_ok=True)
        stacks = Registry(gw.checkpoints_file)
        stacks.register(version, "full", shutil.move(made["full"], kept), str(cfg.model_path))
        bg = HotSwap(gateway, gw.admin_key, stacks, gw.deployments[0].name, cfg.worker.served_model_name, cfg.model_path)
        report["blue-green"] = asyncio.run(
            around(gateway, args.rate, args.seconds, lambda: bg.blue_green("tiny", version, BlueGreen(cfg), record=False))
        )
        bg.blue_green("tiny", BASE, BlueGreen(cfg), record=False)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
