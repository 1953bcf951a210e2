"""The `flywheel` command line: one module per command group, composed here."""

from __future__ import annotations

import typer

from deploy.cli import stack
from deploy.cli import traces
from deploy.cli.batch import batch_app
from deploy.cli.checkpoint import ckpt_app
from deploy.cli.deployments import deployments_app
from deploy.cli.keys import keys_app
from deploy.cli.loop import demo, loop

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Serve a model, capture every trajectory, train on it, hot-swap it back."
)
for command in (stack.up, stack.manifests, stack.down, stack.status, traces.sql, demo, loop):
    app.command()(command)
app.command("export")(traces.export_cmd)
app.add_typer(stack.model_app, name="model")
app.add_typer(keys_app, name="keys")
app.add_typer(traces.traces_app, name="traces")
app.add_typer(ckpt_app, name="checkpoint")
app.add_typer(batch_app, name="batch")
app.add_typer(deployments_app, name="deployments")


if __name__ == "__main__":
    app()
