"""The floor of the obvious design, for ``deploy/bench/gateway.py`` to measure the gateway
against: a FastAPI + httpx pass-through with nothing on the path (no auth, admission, parsing,
capture), bytes relayed as they come through ``StreamingResponse``.

    .venv/bin/python -m deploy.bench.relay --upstream http://127.0.0.1:8100 --port 8300
"""

from __future__ import annotations

import argparse

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from serve.upstream_http import upstream_client


def relay_app(upstream: str) -> FastAPI:
    app = FastAPI()
    # the gateway's own upstream client (quick ACKs), so the two differ only in what they do
    client = upstream_client(httpx.Timeout(60), httpx.Limits(max_connections=1024, max_keepalive_connections=256))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        up = await client.send(
            client.build_request(
                "POST",
                f"{upstream}/v1/chat/completions",
                content=await request.body(),
                headers={"content-type": "application/json"},
            ),
            stream=True,
        )

        async def body():
            try:
                async for chunk in up.aiter_raw():
                    yield chunk
            finally:
                await up.aclose()

        return StreamingResponse(body(), status_code=up.status_code, media_type=up.headers.get("content-type"))

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", default="http://127.0.0.1:8100")
    ap.add_argument("--port", type=int, default=8300)
    args = ap.parse_args()
    uvicorn.run(relay_app(args.upstream), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
