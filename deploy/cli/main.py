"""The `flywheel` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from deploy.cli.admin import ckpt_app, keys_app, traces_app
from deploy.cli.batch import batch_app
from deploy.cli.common import ProfileOpt, SetOpt, _config, console

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Serve a model, capture every trajectory, train on it, hot-swap it back.")
model_app = typer.Typer(no_args_is_help=True, help="Make models.")
app.add_typer(model_app, name="model")
app.add_typer(keys_app, name="keys")
app.add_typer(traces_app, name="traces")
app.add_typer(ckpt_app, name="checkpoint")
app.add_typer(batch_app, name="batch")


@app.command()
def up(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
       dry_run: bool = typer.Option(False, help="print the resolved config and exit")):
    """Start the local stack (Dynamo frontend, vLLM workers, gateway) and wait until healthy."""
    from deploy.stack.launcher import up as start
    from deploy.stack.processes import StartError

    cfg = _config(profile, set_)
    if dry_run:
        print(cfg.model_dump_json(indent=2))
        return
    try:
        timings = start(cfg)
    except StartError as exc:
        console.print(f"[red]start-up failed:[/] {exc}")
        raise typer.Exit(1)
    gw = cfg.resolved_gateway()
    console.print(f"stack up in {sum(timings.values()):.0f} s: "
                  f"[bold]{gw.url}/v1[/] (models: {', '.join(gw.models)})")


@app.command()
def manifests(profile: str = typer.Option("gb200-nvl72", "--profile", "-p", help="a profile with a [cluster] section"),
              set_: Optional[list[str]] = SetOpt,
              out: Optional[Path] = typer.Option(None, help="write here instead of standard output"),
              check: bool = typer.Option(True, help="validate offline (Kubernetes schemas, the Dynamo "
                                                    "graph schema, Dynamo's and vLLM's own argument parsers)")):
    """Render the Kubernetes manifests (Dynamo operator graph, Mooncake, IMEX domain) for a cluster profile."""
    from deploy.cluster.manifests import render, to_yaml

    cfg = _config(profile, set_)
    try:
        docs = render(cfg)
    except ValueError as exc:
        console.print(f"[red]cannot render {profile}:[/] {exc}")
        raise typer.Exit(2)
    if check:
        from deploy.cluster.manifest_check import K8S_VERSION, validate
        errors = validate(docs)
        for line in errors:
            console.print(f"[red]invalid:[/] {line}")
        if errors:
            raise typer.Exit(1)
        console.print(f"{len(docs)} documents valid (Kubernetes {K8S_VERSION} schemas, strict)")
    text = to_yaml(docs, cfg)
    if out is None:
        print(text, end="")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        console.print(f"wrote {out}")


@app.command()
def down(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt):
    """Stop exactly the processes `flywheel up` started (by PID file)."""
    from deploy.stack.launcher import down as stop

    stopped = stop(_config(profile, set_))
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@app.command()
def status(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
           as_json: bool = typer.Option(False, "--json", help="machine-readable output")):
    """Each component's URL, PID, health, restarts by the supervisor and last exit reason."""
    from deploy.stack.launcher import status as stack_status

    rows = stack_status(_config(profile, set_))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("component", "pid", "url", "health", "restarts", "last exit")
    for r in rows:
        health = "[green]healthy[/]" if r["healthy"] else ("[yellow]starting[/]" if r["pid"] else "[red]down[/]")
        table.add_row(r["name"], str(r["pid"] or "-"), r["url"] or "-", health, str(r["restarts"]),
                      r["last_exit"] or "-")
    console.print(table)


@app.command()
def sql(query: str = typer.Argument(..., help="DuckDB SQL over the views traces, traces_full, "
                                               "sessions, usage_by_team"),
        profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
        traces_dir: Optional[Path] = typer.Option(None, help="defaults to the profile's trace dir"),
        fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json | parquet"),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="write here instead of stdout"),
        max_rows: int = typer.Option(50, help="rows to print as a table")):
    """Run SQL over the captured traces: print a table, or write CSV / JSON / Parquet."""
    import duckdb

    from traces.store import TraceStore

    if fmt not in ("table", "csv", "json", "parquet"):
        console.print(f"[red]unknown format {fmt!r}[/] (table, csv, json, parquet)")
        raise typer.Exit(2)
    if fmt == "parquet" and out is None:
        console.print("[red]--format parquet needs --out FILE[/]")
        raise typer.Exit(2)
    root = traces_dir or _config(profile, set_).traces_path
    store = TraceStore(root)
    try:
        if fmt == "table":
            console.print(arrow_table(store.sql(query), max_rows))
        else:  # DuckDB writes the file itself, so lists and timestamps keep their types
            import tempfile
            # (not /dev/stdout: DuckDB would truncate a redirected stdout file)
            with tempfile.TemporaryDirectory() as tmp:
                target = out or Path(tmp) / f"result.{fmt}"
                store.con.execute(f"COPY ({query.strip().rstrip(';')}) TO "
                                  f"'{str(target).replace(chr(39), chr(39) * 2)}' (FORMAT {fmt})")
                if out is None:
                    sys.stdout.buffer.write(target.read_bytes())
    except duckdb.Error as exc:
        console.print(f"[red]SQL error:[/] {exc}")
        raise typer.Exit(1)


def arrow_table(result, max_rows: int = 50) -> Table:
    table = Table(*result.column_names, caption=f"{result.num_rows} row(s)")
    for row in result.slice(0, max_rows).to_pylist():
        table.add_row(*[_cell(v) for v in row.values()])
    return table


def _cell(v) -> str:
    text = "NULL" if v is None else str(v)
    return text if len(text) <= 60 else text[:57] + "..."


@model_app.command("tiny")
def model_tiny(out_dir: Path, seed: int = typer.Option(0, help="weights seed")):
    """Make the tiny GLM-style Qwen2 model (tokenizer trained here, random weights)."""
    from deploy.models.tiny_model import make_tiny_model

    path = make_tiny_model(out_dir, seed=seed)
    console.print(f"tiny model written to {path}")


@app.command()
def demo(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
         turns: int = typer.Option(3, help="turns of the loop to run"),
         seed: int = typer.Option(0, help="sampling and training seed"),
         keep_up: bool = typer.Option(False, help="leave the stack running afterwards"),
         full: bool = typer.Option(False, "--full", help="rejection sampling that fine-tunes every "
                                                         "weight and reloads them in place")):
    """`flywheel loop` on the built-in task: the exact-solve rate per turn, printed and plotted."""
    from deploy.demo import run_demo

    result = run_demo(_config(profile, set_), keep_up=keep_up, turns=turns, seed=seed, full=full)
    sys.exit(0 if result["ok"] else 1)


@app.command()
def loop(profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
         env: str = typer.Option("envs.vf_wordops", help="verifiers taskset: MODULE or MODULE:Taskset "
                                                          "(importable from PYTHONPATH)"),
         env_arg: Optional[list[str]] = typer.Option(None, "--env-arg", help="taskset config KEY=VALUE"),
         turns: int = typer.Option(3, help="turns of the loop"),
         algo: str = typer.Option("grpo", help="grpo (policy gradient on the engine's logprobs) "
                                               "or rs (rejection sampling: SFT on exact solves)"),
         train_tasks: int = typer.Option(32, help="tasks rolled out each turn (the first ones)"),
         eval_tasks: int = typer.Option(64, help="tasks after those, held back for the greedy eval"),
         samples: int = typer.Option(8, help="rollouts per task (the GRPO group)"),
         max_tokens: int = typer.Option(8, help="max tokens per model turn"),
         steps: int = typer.Option(40, help="optimiser steps per turn"),
         solve_at: float = typer.Option(1.0, help="reward that counts as an exact solve"),
         seed: int = typer.Option(0),
         resume: Optional[str] = typer.Option(None, help="a run id (or 'last') to resume from its "
                                                        "last completed phase"),
         keep_up: bool = typer.Option(False, help="leave a stack this command started running"),
         as_json: bool = typer.Option(False, "--json", help="print the result as one JSON document")):
    """The loop on any verifiers taskset: rollouts -> rewards -> export -> train -> hot-swap -> eval."""
    from deploy.stack.config import _parse_value
    from deploy.loop import run_loop
    from deploy.loop_state import LoopConfig
    from envs.vf_run import NotEnoughTasks

    if algo not in ("rs", "grpo"):
        raise typer.BadParameter("choose rs or grpo", param_hint="--algo")
    args = {}
    for item in env_arg or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--env-arg")
        args[key] = _parse_value(value)
    lc = None if resume else LoopConfig(env=env, env_args=args, turns=turns, algo=algo, train_tasks=train_tasks,
                                        eval_tasks=eval_tasks, samples=samples, max_tokens=max_tokens,
                                        steps=steps, solve_at=solve_at, seed=seed)
    try:
        result = run_loop(_config(profile, set_), lc, resume=resume, keep_up=keep_up, as_json=as_json)
    except (FileNotFoundError, ImportError, NotEnoughTasks) as exc:  # say so, no traceback
        console.print(f"[red]error:[/] {exc}")
        sys.exit(2)
    sys.exit(0 if result["improved"] else 1)


@app.command("export")
def export_cmd(kind: str = typer.Argument(..., help="sft | rl | preference"),
               out: Path = typer.Option(..., "--out", "-o", help="dataset directory to write"),
               sql: str = typer.Option(None, help="SELECT over traces picking the trajectories "
                                                  "(default: every successful trace)"),
               reward_name: str = typer.Option("reward", help="which reward joins as `reward`"),
               profile: str = ProfileOpt, set_: Optional[list[str]] = SetOpt,
               traces_dir: Optional[Path] = typer.Option(None)):
    """Export traces as a Hugging Face dataset (save_to_disk + Parquet + manifest.json)."""
    from feedback.export import DEFAULT_SQL, export
    from traces.store import TraceStore

    store = TraceStore(traces_dir or _config(profile, set_).traces_path)
    try:
        manifest = export(store, kind, out, sql or DEFAULT_SQL, reward_name)
    except ValueError as exc:
        console.print(f"[red]export failed:[/] {exc}")
        raise typer.Exit(1)
    console.print(f"{manifest['rows']} {kind} rows -> {out} (content sha256 {manifest['content_hash'][:16]})")



if __name__ == "__main__":
    app()
