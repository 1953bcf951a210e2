"""`python -m serve --config gateway.json`: run the gateway with a resolved config."""

from __future__ import annotations

import argparse
import gc
import sys
import logging
from pathlib import Path

import uvicorn

from serve.app import create_app
from serve.config import GatewayConfig
from serve.tools.grammar import load_compiler
from traces.spool import SpoolLocked


def main() -> None:
    parser = argparse.ArgumentParser(description="Flywheel gateway")
    parser.add_argument("--config", required=True, help="resolved GatewayConfig as JSON")
    args = parser.parse_args()
    config = GatewayConfig.model_validate_json(Path(args.config).read_text())
    logging.basicConfig(level=logging.INFO)
    # The trace writer's threads (spool fsync, Parquet conversion) hold the GIL in turns with
    # the event loop; at the default 5 ms a first token could wait that long behind them.
    sys.setswitchinterval(0.0005)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise
    try:
        app = create_app(config)  # replays what a previous process of this instance left
    except SpoolLocked as exc:
        raise SystemExit(f"gateway {config.instance_name!r} cannot start: {exc}") from None
    load_compiler()  # before serving: see load_compiler
    # What startup built (modules, torch, the models) lives as long as the process: frozen, the
    # collector's full passes stop walking it for every request's garbage. Measured while a
    # thread read a 20 MB body: the event loop's longest wait went from 56 ms to 25 ms.
    gc.collect()
    gc.freeze()
    # no proxy headers: clients reach the gateway directly, and a forwarded-for from them means nothing
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        timeout_keep_alive=config.keep_alive_s,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
    )


if __name__ == "__main__":
    main()
