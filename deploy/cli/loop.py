"""`flywheel loop` and `flywheel demo`: start the stack if it is not up, hand the loop a gateway
URL and a team key, and stop what was started here afterwards.

The loop's settings are the ``[loop]`` table of the configuration; the flags below are shorthands
for its keys (``--turns 5`` is ``--set loop.turns=5``), so their defaults live in one place,
``loop/config.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from deploy.cli.common import ProfileOpt, SetOpt, _config, console
from deploy.stack.config import StackConfig, _parse_value
from deploy.stack.serverless import serving_deployment
from loop.config import LoopConfig
from loop.report import Reporter
from loop.target import LoopTarget


def team_key(cfg: StackConfig, team: str = "demo") -> str:
    """A key for ``team``, created once per home, so the loop's traces are attributed."""
    from serve.keys import KeyStore
    from serve.secret_files import write_private

    path = cfg.run_dir / f"{team}.key"
    if not path.exists():
        _, key = KeyStore(cfg.resolved_gateway().keys_file).create(team, f"flywheel {team}")
        write_private(path, key)
    return path.read_text().strip()


def loop_target(cfg: StackConfig, key: str, report: Reporter) -> LoopTarget:
    """What the loop is handed, for this stack and a live team key of it; the base's warm-up is
    made here (once per recipe), so the loop only trains from it."""
    from deploy.models.warm_model import WarmupRecipe, warm_up
    from serve.keys import KeyStore

    gw = cfg.resolved_gateway()
    owner = KeyStore(gw.keys_file).lookup(key) if gw.keys_file else None
    if owner is None or owner.revoked:
        raise ValueError("the loop's key is not a live team key of this stack")
    recipe = WarmupRecipe()
    warm = cfg.home_path / "models" / f"tiny-warm-{recipe.key()[:8]}"
    with report.phase("base: the tiny model's warm-up (once per recipe)"):
        warm_up(cfg.model_path, warm, recipe, progress=report.progress("warm-up"))
    return LoopTarget(
        gateway_url=gw.url,
        key=key,
        team=owner.team,
        key_id=owner.id,
        admin_key=gw.admin_key,
        alias=cfg.worker.served_model_name,
        deployment=serving_deployment(cfg),
        base_model=cfg.model_path,
        warm_base=warm,
        warm_version=f"warm-{recipe.key()[:8]}",
        home=cfg.home_path,
        traces=cfg.traces_path,
        registry=Path(gw.checkpoints_file),
    )


def run_loop(
    cfg: StackConfig, lc: LoopConfig | None = None, resume: str | None = None, keep_up: bool = False, as_json: bool = False
) -> dict:
    """Run (or resume) a loop with ``lc`` (default: the config's ``[loop]`` table); returns the
    per-turn record (also in the run's state.json)."""
    from deploy.stack.launcher import down, status, up
    from envs.vf_run import flat_alias
    from loop.phases import Loop
    from loop.state import LoopState

    lc = lc or cfg.loop
    state = LoopState.open(cfg.home_path, resume, lc) if resume else None
    flat_alias((state.config if state else lc).env)  # a taskset that does not import fails here, first
    report = Reporter(quiet=as_json)
    t0 = time.monotonic()
    started_here = False
    with report.phase("stack"):
        if not all(r["healthy"] for r in status(cfg)):
            up(cfg)
            started_here = True
    try:
        state = state or LoopState.open(cfg.home_path, None, lc)
        target = loop_target(cfg, team_key(cfg), report)
        turns = Loop(target, state, report).run()
        plot = cfg.home_path / f"loop-{state.run_id}.png"
        report.plot(turns, plot, state.config)
        result = {
            "run_id": state.run_id,
            "env": state.config.env,
            "algo": state.config.algo,
            "turns": turns,
            "plot": str(plot),
            "wall_s": round(time.monotonic() - t0, 1),
            "improved": turns[-1]["eval"]["exact_solve"] > turns[0]["eval"]["exact_solve"]
            or turns[-1]["eval"]["reward_mean"] > turns[0]["eval"]["reward_mean"],
            "ui": {
                "url": f"{target.gateway_url}/ui/checkpoints",
                "key_file": str(cfg.run_dir / "demo.key"),
                "stack_stays_up": keep_up or not started_here,
            },
        }
        state.data["result"] = result
        state.save()
        report.final(result)
        return result
    finally:
        if started_here and not keep_up:
            down(cfg)


def run_demo(
    cfg: StackConfig,
    keep_up: bool = False,
    turns: int | None = None,
    seed: int | None = None,
    full: bool = False,
    as_json: bool = False,
) -> dict:
    """`flywheel loop` on the built-in task (``envs.vf_wordops``: ``Apply tail to: w1 w2 w3``
    wants the last word, a name the warmed base never saw). ``ok`` is True when the exact-solve
    rate after the last turn beats the base model's. With ``full``, each turn is rejection
    sampling fine-tuning every weight, reloaded in place."""
    lc = _with(cfg.loop, env="envs.vf_wordops", env_args={}, turns=turns, seed=seed, algo="rs" if full else "grpo", full=full)
    result = run_loop(cfg, lc, keep_up=keep_up, as_json=as_json)
    evals = [t["eval"] for t in result["turns"]]
    result["ok"] = evals[-1]["exact_solve"] > evals[0]["exact_solve"]
    return result


def _check_from_traces(cfg: StackConfig, query: str) -> None:
    """A query that is not one SELECT of a team's views, or lacks its columns: one line, and no
    run is started."""
    from loop.production import check_query
    from traces.guard import QueryRefused
    from traces.store import TraceStore

    try:  # any team's sandbox has the views and columns a team's query sees
        check_query(TraceStore(cfg.traces_path, team="demo"), query)
    except QueryRefused as exc:
        console.print(f"[red]--from-traces:[/] {exc}")
        sys.exit(2)


def _with(lc: LoopConfig, **flags) -> LoopConfig:
    """``lc`` with the flags that were given (not None), validated as the config is."""
    return LoopConfig.model_validate({**lc.model_dump(), **{k: v for k, v in flags.items() if v is not None}})


def demo(
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
    turns: Optional[int] = typer.Option(None, help="turns of the loop to run [default: loop.turns, 3]"),
    seed: Optional[int] = typer.Option(None, help="sampling and training seed [default: loop.seed, 0]"),
    keep_up: bool = typer.Option(False, help="leave the stack running afterwards"),
    full: bool = typer.Option(False, "--full", help="rejection sampling that fine-tunes every weight and reloads them in place"),
):
    """`flywheel loop` on the built-in task: the exact-solve rate per turn, printed and plotted."""
    result = run_demo(_config(profile, set_), keep_up=keep_up, turns=turns, seed=seed, full=full)
    sys.exit(0 if result["ok"] else 1)


def loop(
    profile: str = ProfileOpt,
    set_: Optional[list[str]] = SetOpt,
    env: Optional[str] = typer.Option(
        None, help="verifiers taskset: MODULE or MODULE:Taskset (importable from PYTHONPATH) [loop.env]"
    ),
    env_arg: Optional[list[str]] = typer.Option(None, "--env-arg", help="taskset config KEY=VALUE [loop.env_args]"),
    turns: Optional[int] = typer.Option(None, help="turns of the loop [loop.turns]"),
    algo: Optional[str] = typer.Option(
        None, help="grpo (policy gradient on the engine's logprobs) or rs (rejection sampling: SFT on exact solves) [loop.algo]"
    ),
    train_tasks: Optional[int] = typer.Option(None, help="tasks rolled out each turn, the first ones [loop.train_tasks]"),
    eval_tasks: Optional[int] = typer.Option(None, help="tasks after those, held back for the greedy eval [loop.eval_tasks]"),
    samples: Optional[int] = typer.Option(None, help="rollouts per task, the GRPO group [loop.samples]"),
    max_tokens: Optional[int] = typer.Option(None, help="max tokens per model turn [loop.max_tokens]"),
    steps: Optional[int] = typer.Option(None, help="optimiser steps per turn [loop.steps]"),
    solve_at: Optional[float] = typer.Option(None, help="reward that counts as an exact solve [loop.solve_at]"),
    seed: Optional[int] = typer.Option(None, help="[loop.seed]"),
    from_traces: Optional[str] = typer.Option(
        None,
        help="train on production traffic instead of rollouts: a SELECT over your team's views returning "
        "trace_id and reward, e.g. \"SELECT trace_id, reward FROM rewards WHERE name = 'reward'\" [loop.from_traces]",
    ),
    min_rows: Optional[int] = typer.Option(None, help="--from-traces: rewarded rows a turn waits for [loop.min_rows]"),
    deploy: Optional[str] = typer.Option(
        None,
        help="direct (the alias moves), canary (loop.canary.*: share, min_samples...) or dedicated (a deployment "
        "of its own for the team) [loop.deploy]",
    ),
    resume: Optional[str] = typer.Option(None, help="a run id (or 'last') to resume from its last completed phase"),
    keep_up: bool = typer.Option(False, help="leave a stack this command started running"),
    as_json: bool = typer.Option(False, "--json", help="print the result as one JSON document"),
):
    """The loop on any verifiers taskset: rollouts -> rewards -> export -> train -> hot-swap -> eval."""
    from envs.vf_run import NotEnoughTasks

    args = None
    if env_arg is not None:
        args = {}
        for item in env_arg:
            key, sep, value = item.partition("=")
            if not sep:
                raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--env-arg")
            args[key] = _parse_value(value)
    cfg = _config(profile, set_)
    try:
        lc = (
            None
            if resume
            else _with(
                cfg.loop,
                env=env,
                env_args=args,
                turns=turns,
                algo=algo,
                train_tasks=train_tasks,
                eval_tasks=eval_tasks,
                samples=samples,
                max_tokens=max_tokens,
                steps=steps,
                solve_at=solve_at,
                seed=seed,
                from_traces=from_traces,
                min_rows=min_rows,
                deploy=deploy,
            )
        )
    except ValidationError as exc:
        bad = "; ".join(f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}" for e in exc.errors())
        raise typer.BadParameter(bad) from None
    if lc and lc.from_traces:
        _check_from_traces(cfg, lc.from_traces)
    try:
        result = run_loop(cfg, lc, resume=resume, keep_up=keep_up, as_json=as_json)
    except (FileNotFoundError, ImportError, NotEnoughTasks) as exc:  # say so, no traceback
        console.print(f"[red]error:[/] {exc}")
        sys.exit(2)
    sys.exit(0 if result["improved"] else 1)
