"""Arize Phoenix's server as the OTLP tests run it (with Phoenix's own venv's Python): its
OTLP/gRPC listener off. Phoenix binds gRPC on every address ([::]) with no setting to change
that, and test servers bind only 127.0.0.1; our exporter sends OTLP/HTTP, which Phoenix serves
on ``PHOENIX_HOST``:``PHOENIX_PORT`` like its UI."""

import sys

from phoenix.server import grpc_server
from phoenix.server.main import main


async def _no_grpc_listener(self) -> None:
    return None  # __aexit__ then has no server to stop


grpc_server.GrpcServer.__aenter__ = _no_grpc_listener

if __name__ == "__main__":
    sys.argv = ["phoenix", "serve"]
    sys.exit(main())
