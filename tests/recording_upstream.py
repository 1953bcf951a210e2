"""A deployment for gateway unit tests: answers every completion on loopback with a fixed unary
answer (a chat completion or a text completion, by path) and keeps each request it was sent."""

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
CHAT = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "tiny",
    "usage": USAGE,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
}
TEXT = {
    "id": "c2",
    "object": "text_completion",
    "created": 0,
    "model": "tiny",
    "usage": USAGE,
    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
}


@dataclass
class Received:
    headers: dict[str, str]  # names in lower case
    body: bytes


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
        if self.server.hold_marker and self.server.hold_marker in body:
            self.server.release.wait(30)
        if self.server.model_gone == 404:
            return self._json(404, b'{"message":"Model not found","type":"Not Found","code":404}')
        if self.server.model_gone == 503:
            not_ready = b"Model `tiny` is not ready to serve requests yet. Please retry shortly."
            return self._json(503, b'{"message":"' + not_ready + b'","type":"Service Unavailable","code":503}')
        if self.server.dead_pin and "x-dynamo-session-id" in self.headers:
            return self._json(500, b'{"message":"Failed to generate completions: no endpoints available to route work"}')
        answer = {**(CHAT if self.path.endswith("/chat/completions") else TEXT), **self.server.extra}
        self._json(200, json.dumps(answer).encode())

    def do_GET(self):  # noqa: N802 - http.server's name; a deployment lists its models
        self._json(200, json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode())

    def _json(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class RecordingUpstream:
    """Started on a free loopback port; ``seen`` lists what it received, in order; keys put in
    ``extra`` are added to every answer; ``hold(marker)`` keeps requests containing ``marker``
    unanswered until ``release`` is set; ``dead_pin``: a session's request is answered 500, as
    Dynamo answers one pinned to a dead worker that is still registered; ``model_gone``: every
    completion is answered that status (``lose_the_model``)."""

    def __init__(self):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.seen = self.seen = []
        self._server.extra = self.extra = {}
        self._server.hold_marker = None  # bytes: a request containing them waits for ``release``
        self._server.release = self.release = threading.Event()
        self._server.dead_pin = False
        self._server.model_gone = None
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def pin_to_a_dead_worker(self) -> None:
        self._server.dead_pin = True

    def lose_the_model(self, status: int = 404) -> None:
        """Answer every completion ``status``: 404 as Dynamo's frontend does once no worker lists
        the model, 503 as it does while a P/D graph lists its decode worker but not its prefill one."""
        self._server.model_gone = status

    def hold(self, marker: bytes) -> None:
        self._server.hold_marker = marker

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
