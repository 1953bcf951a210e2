"""Run a verifiers environment against the gateway and post its rewards to the trace store.

    python -m envs.vf_run envs.vf_wordops --base-url http://127.0.0.1:8000 --model tiny -n 8 -r 2

Each rollout's ``X-Session-ID`` is its verifiers trace id, so every turn it sent is a trace row
with that ``gen_ai_conversation_id``; the rollout's reward is posted (``POST /v1/feedback``) for
each of those rows. Everything goes over HTTP, like any client.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
import time
import types
from dataclasses import dataclass

import httpx

KEY_VAR = "FW_ROLLOUT_KEY"  # verifiers drops names containing "API_KEY"; FLYWHEEL_* is config


def flat_alias(module: str) -> str:
    """verifiers resolves plugin ids as top-level module names that export one Taskset (or
    Harness) in ``__all__``; expose ``pkg.module`` (or ``pkg.module:Class``, for a module with
    several) under a flat name it can import."""
    name, _, cls = module.partition(":")
    flat = (name + ("__" + cls if cls else "")).replace(".", "_").lower()  # as verifiers imports it
    if flat not in sys.modules:
        target = importlib.import_module(name)
        if cls:
            if not hasattr(target, cls):
                raise ImportError(f"{name} has no {cls!r}")
            view = types.ModuleType(flat)
            view.__dict__.update({k: v for k, v in vars(target).items() if not k.startswith("__")})
            view.__all__ = [cls]
            target = view
        sys.modules[flat] = target
    return flat


@dataclass
class EpisodeResult:
    example_id: str
    session_id: str
    reward: float
    reply: str
    ok: bool
    failure: str = ""  # why the episode did not finish: its stop condition and last error, if any


async def _episodes(
    taskset: str,
    base_url: str,
    model: str,
    n: int,
    rollouts: int,
    max_tokens: int,
    temperature: float,
    max_turns: int,
    env_id: str,
    offset: int = 0,
    taskset_args: dict | None = None,
) -> list[EpisodeResult]:
    import verifiers.v1 as vf

    env = vf.load_environment(
        vf.SingleAgentEnvConfig(
            taskset={"id": flat_alias(taskset), **(taskset_args or {})},
            agent={"runtime": vf.SubprocessConfig(), "harness": {"id": flat_alias("envs.vf_harness")}, "max_turns": max_turns},
        )
    )
    sampling = vf.SamplingConfig(temperature=temperature, max_tokens=max_tokens)
    tasks = list(env.taskset.take(offset + n))[offset:]
    if len(tasks) < n:
        have = offset + len(tasks)
        raise NotEnoughTasks(
            f"{taskset} has {have} tasks and tasks {offset + 1}-{offset + n} were asked for: "
            f"pass --train-tasks and --eval-tasks that add up to at most {have}"
        )
    # verifiers' TaskData.id is optional: a task without one is named by its place in the taskset
    ids = [str(t.data.id) if t.data.id is not None else f"task-{offset + i}" for i, t in enumerate(tasks)]

    def context(example_id: str, k: int) -> "vf.ModelContext":
        # one client config per rollout, so each trace row says which example and rollout it was
        return vf.ModelContext(
            model=model,
            sampling=sampling,
            client=vf.EvalClientConfig(
                base_url=f"{base_url}/v1",
                api_key_var=KEY_VAR,
                headers={"X-Env-ID": env_id, "X-Example-ID": example_id, "X-Rollout-ID": f"{env_id}/{example_id}/{k}"},
            ),
        )

    runs = [(t, example_id, k) for t, example_id in zip(tasks, ids) for k in range(rollouts)]
    async with env.serving():  # gather keeps the order of ``runs``
        episodes = await asyncio.gather(*(env.run_episode(t, context(example_id, k)) for t, example_id, k in runs))
    out = []
    for ep, (_, example_id, _) in zip(episodes, runs):
        tr = ep.traces[0]
        failure, last = "", tr.last_error
        if not ep.ok:
            failure = str(tr.stop_condition)
            if last:
                failure += f": {last.type} {last.status_code or ''} {last.message}"
        out.append(
            EpisodeResult(
                example_id=example_id,
                session_id=tr.id,
                reward=float(tr.reward or 0.0),
                reply=tr.last_reply or "",
                ok=ep.ok,
                failure=failure[:500],
            )
        )
    return out


class NotEnoughTasks(ValueError):
    """The taskset has fewer tasks than the run asked for."""


def trace_ids(
    base_url: str, key: str, sessions: list[str], expect_at_least: int, timeout_s: float = 20.0
) -> dict[str, list[str]]:
    """Session id -> the gateway trace ids of its turns (waits for them to reach Parquet)."""
    quoted = ", ".join("'" + s.replace("'", "''") + "'" for s in sessions)
    sql = f"SELECT gen_ai_conversation_id, trace_id FROM traces WHERE gen_ai_conversation_id IN ({quoted})"
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.post(
            f"{base_url}/v1/traces/query",
            json={"sql": sql, "max_rows": 1_000_000},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        r.raise_for_status()
        rows = r.json()["rows"]
        if len(rows) >= expect_at_least or time.monotonic() > deadline:
            out: dict[str, list[str]] = {}
            for session, trace in rows:
                out.setdefault(session, []).append(trace)
            return out
        time.sleep(0.3)


def play(
    taskset: str,
    base_url: str,
    key: str,
    model: str,
    n: int = 8,
    rollouts: int = 1,
    max_tokens: int = 16,
    temperature: float = 1.0,
    max_turns: int = 4,
    env_id: str | None = None,
    offset: int = 0,
    taskset_args: dict | None = None,
) -> list[EpisodeResult]:
    """Run ``rollouts`` episodes of each of tasks ``offset .. offset + n`` through the gateway as
    ``key``'s team; their rewards are scored, not posted. ``taskset_args`` are the taskset's
    config fields (``seed``, ``n``, its own)."""
    os.environ[KEY_VAR] = key
    env_id = env_id or taskset
    return asyncio.run(
        _episodes(taskset, base_url, model, n, rollouts, max_tokens, temperature, max_turns, env_id, offset, taskset_args)
    )


def reward_feedback(base_url: str, key: str, results: list[EpisodeResult], source: str) -> list[list[dict]]:
    """Each episode's reward as feedback items, one per trace of its session (waits for the
    traces to be queryable), grouped by episode."""
    traces = trace_ids(base_url, key, [r.session_id for r in results], len(results))
    return [[{"trace_id": t, "reward": r.reward, "source": source} for t in traces.get(r.session_id, [])] for r in results]


def post_feedback(base_url: str, key: str, feedback: list[dict]) -> None:
    if feedback:
        httpx.post(
            f"{base_url}/v1/feedback", json={"feedback": feedback}, headers={"Authorization": f"Bearer {key}"}, timeout=60
        ).raise_for_status()


def run_env(taskset: str, base_url: str, key: str, model: str, **kw) -> list[EpisodeResult]:
    """:func:`play`, then post each rollout's reward against every trace of its session."""
    results = play(taskset, base_url, key, model, **kw)
    env_id = kw.get("env_id") or taskset
    post_feedback(base_url, key, [f for episode in reward_feedback(base_url, key, results, f"env:{env_id}") for f in episode])
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("taskset", help="e.g. envs.vf_wordops, envs.vf_calc or pkg.module:Taskset")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--key", default=os.environ.get(KEY_VAR, ""), help=f"a team key (or ${KEY_VAR})")
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("-r", "--rollouts", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    results = run_env(
        args.taskset, args.base_url, args.key, args.model, n=args.n, rollouts=args.rollouts, max_tokens=args.max_tokens
    )
    for r in results:
        print(f"{r.example_id}\t{r.reward:.3f}\t{r.reply[:60]!r}")
    print(f"mean reward {sum(r.reward for r in results) / max(len(results), 1):.3f} over {len(results)} rollouts")


if __name__ == "__main__":
    main()
