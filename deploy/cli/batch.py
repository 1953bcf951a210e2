"""`flywheel batch`: submit a JSONL batch to the gateway's Batch API and follow it.

The commands speak the OpenAI API through the official SDK, so they work against any of our
gateways (or OpenAI itself): ``--url`` and ``--api-key`` (or ``OPENAI_API_KEY``) say where and
as whom; the default is the profile's local gateway.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from deploy.cli.common import ProfileOpt, SetOpt, _config, console

batch_app = typer.Typer(no_args_is_help=True, help="Batch jobs over the OpenAI Batch API (JSONL files).")
FINAL = ("completed", "failed", "cancelled", "expired")
UrlOpt = typer.Option(None, "--url", help="the gateway's base URL (default: the profile's gateway)")
KeyOpt = typer.Option(None, "--api-key", envvar="OPENAI_API_KEY", help="a team key")


def _client(profile: str, overrides, url: Optional[str], api_key: Optional[str]):
    from openai import OpenAI

    if url is None:
        gw = _config(profile, overrides).resolved_gateway()
        url = gw.url
    return OpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key or "none", max_retries=5)


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/] {getattr(exc, 'message', None) or exc}")
    raise typer.Exit(1)


def _follow(client, batch) -> object:
    """A progress bar of lines done and failed, with tokens/s, until the batch ends."""
    t0 = time.monotonic()
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}  {task.fields[rate]} tok/s"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(batch.id, total=batch.request_counts.total, failed=0, rate="-")
        while batch.status not in FINAL:
            time.sleep(0.5)
            batch = client.batches.retrieve(batch.id)
            c = batch.request_counts
            tokens = batch.usage.total_tokens if getattr(batch, "usage", None) else 0
            bar.update(
                task,
                completed=c.completed + c.failed,
                failed=c.failed,
                rate=f"{tokens / max(time.monotonic() - t0, 1e-9):,.0f}",
                description=f"{batch.id} {batch.status}",
            )
    return batch


def _summary(batch) -> None:
    c = batch.request_counts
    console.print(
        f"{batch.id}: [bold]{batch.status}[/], {c.completed} of {c.total} answered, {c.failed} failed; "
        f"output {batch.output_file_id or '-'}, errors {batch.error_file_id or '-'}"
    )


@batch_app.command("submit")
def submit(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="JSONL: custom_id, method, url, body"),
    endpoint: str = typer.Option("/v1/chat/completions", help="or /v1/completions"),
    window: str = typer.Option("24h", "--completion-window"),
    wait: bool = typer.Option(False, "--wait", help="follow it with a progress bar until it ends"),
    url: Optional[str] = UrlOpt,
    api_key: Optional[str] = KeyOpt,
    profile: str = ProfileOpt,
    overrides: Optional[list[str]] = SetOpt,
):
    """Upload FILE and start a batch over it; --wait follows it to the end."""
    client = _client(profile, overrides, url, api_key)
    try:
        with file.open("rb") as f:
            uploaded = client.files.create(file=(file.name, f), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window=window)
        console.print(
            f"submitted {batch.id} ({batch.request_counts.total} lines, {batch.request_counts.failed} refused at validation)"
        )
        if wait:
            batch = _follow(client, batch)
    except Exception as exc:  # the SDK's errors carry the gateway's message
        _fail(exc)
    _summary(batch)
    if batch.status != "completed" and wait:
        raise typer.Exit(1)


@batch_app.command("status")
def status(
    batch_id: str,
    wait: bool = typer.Option(False, "--wait"),
    url: Optional[str] = UrlOpt,
    api_key: Optional[str] = KeyOpt,
    profile: str = ProfileOpt,
    overrides: Optional[list[str]] = SetOpt,
):
    """One batch: status and counts (--wait: follow it)."""
    client = _client(profile, overrides, url, api_key)
    try:
        batch = client.batches.retrieve(batch_id)
        if wait:
            batch = _follow(client, batch)
    except Exception as exc:
        _fail(exc)
    _summary(batch)


@batch_app.command("list")
def list_batches(
    url: Optional[str] = UrlOpt,
    api_key: Optional[str] = KeyOpt,
    profile: str = ProfileOpt,
    overrides: Optional[list[str]] = SetOpt,
):
    """The team's batches, newest first."""
    client = _client(profile, overrides, url, api_key)
    table = Table()
    table.add_column("id", no_wrap=True)  # ids are for copying: never cut
    for name in ("status", "endpoint", "done", "failed", "total", "created"):
        table.add_column(name)
    try:
        for b in client.batches.list(limit=100):
            c = b.request_counts
            table.add_row(
                b.id,
                b.status,
                b.endpoint,
                str(c.completed),
                str(c.failed),
                str(c.total),
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b.created_at)),
            )
    except Exception as exc:
        _fail(exc)
    console.print(table)


@batch_app.command("cancel")
def cancel(
    batch_id: str,
    url: Optional[str] = UrlOpt,
    api_key: Optional[str] = KeyOpt,
    profile: str = ProfileOpt,
    overrides: Optional[list[str]] = SetOpt,
):
    """Stop starting lines; the batch ends 'cancelled' once those in flight are answered."""
    client = _client(profile, overrides, url, api_key)
    try:
        _summary(client.batches.cancel(batch_id))
    except Exception as exc:
        _fail(exc)


@batch_app.command("results")
def results(
    batch_id: str,
    errors: bool = typer.Option(False, "--errors", help="the error file instead"),
    url: Optional[str] = UrlOpt,
    api_key: Optional[str] = KeyOpt,
    profile: str = ProfileOpt,
    overrides: Optional[list[str]] = SetOpt,
):
    """Print the output (or error) file's JSONL on stdout."""
    client = _client(profile, overrides, url, api_key)
    try:
        batch = client.batches.retrieve(batch_id)
        file_id = batch.error_file_id if errors else batch.output_file_id
        if file_id is None:
            typer.echo(f"{batch_id} has no {'error' if errors else 'output'} file (status {batch.status})", err=True)
            raise typer.Exit(1 if batch.status not in FINAL else 0)
        for line in client.files.content(file_id).text.splitlines():
            print(json.dumps(json.loads(line)))
    except typer.Exit:
        raise
    except Exception as exc:
        _fail(exc)
