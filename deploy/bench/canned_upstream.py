"""A deployment stand-in for ``deploy/bench/gateway.py --canned``: it answers every chat request
at once with the same stream of ``--tokens`` chunks, shaped as Dynamo's frontend streams them
(text, logprobs, ``nvext.completion_token_ids``, a last chunk with usage), so a gateway in
front of it is what saturates, not a model. Not a model and not a server for anything else:
it reads the request only to find where it ends.

    .venv/bin/python -m deploy.bench.canned_upstream --port 8310 --tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal


def canned_events(tokens: int, model: str = "tiny") -> list[bytes]:
    """The SSE events of one streamed answer: a role chunk, ``tokens`` token chunks, a finish
    chunk with usage, ``[DONE]``."""
    base = {"id": "chatcmpl-canned", "object": "chat.completion.chunk", "created": 1764930000, "model": model}
    chunks = [dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    for i in range(tokens):
        text = f" w{i}"
        logprobs = {"content": [{"token": text, "logprob": -0.25, "bytes": list(text.encode()), "top_logprobs": []}]}
        chunks.append(
            dict(
                base,
                choices=[{"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}],
                nvext={"completion_token_ids": [1000 + i]},
            )
        )
    usage = {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": 9 + tokens}
    chunks.append(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "length"}], usage=usage))
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def stream_answer(events: list[bytes]) -> bytes:
    """One keep-alive HTTP/1.1 response of ``events`` in chunked transfer, one chunk per event,
    as a streaming server writes them."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


def json_answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


class Canned(asyncio.Protocol):
    """Requests on one connection, answered in order; a request ends with its content-length."""

    def __init__(self, stream_answer: bytes, models_answer: bytes) -> None:
        self.stream_answer, self.models_answer, self.buffer = stream_answer, models_answer, b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(self.models_answer if head.startswith(b"get ") else self.stream_answer)


async def serve(port: int, tokens: int) -> None:
    answer = stream_answer(canned_events(tokens))
    models = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "canned"}]}).encode()
    server = await asyncio.get_running_loop().create_server(lambda: Canned(answer, json_answer(models)), "127.0.0.1", port)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8310)
    ap.add_argument("--tokens", type=int, default=16, help="token chunks in every answer")
    args = ap.parse_args()
    asyncio.run(serve(args.port, args.tokens))


if __name__ == "__main__":
    main()
