"""A client's idle connection outlives the client's own idle expiry at the gateway.

httpx (and so the openai SDK) lets an idle connection go after 5 s; a gateway that closed it at
5 s too (uvicorn's default) met clients reusing it in their last moments with a closed socket
(deploy/bench/keepalive.py: 9-10 of 300 such reuses failed). The gateway's keep-alive is
`keep_alive_s` (75 s): a connection idle past 5 s still serves."""

import socket
import subprocess
import sys
import time


from serve.config import GatewayConfig
from tests.conftest import free_port, healthy

IDLE_S = 6.0  # past the 5 s at which both uvicorn's default and httpx's expiry end a connection
REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def _answer(conn: socket.socket) -> bytes:
    """One response's head and body (the health answer is small and has a Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data  # the gateway closed the connection
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_connection_idle_past_the_clients_expiry_still_serves(tmp_path):
    port = free_port()
    config = GatewayConfig(port=port, traces_dir=str(tmp_path / "traces"), instance="gw-keep-alive")
    assert config.keep_alive_s > IDLE_S
    (tmp_path / "gateway.json").write_text(config.model_dump_json())
    log = open(tmp_path / "gateway.log", "w")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "serve", "--config", str(tmp_path / "gateway.json")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        while not healthy(port):
            assert gateway.poll() is None, (tmp_path / "gateway.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(REQUEST)
            assert _answer(conn).startswith(b"HTTP/1.1 200")
            time.sleep(IDLE_S)  # the idle time is what is tested
            try:
                conn.sendall(REQUEST)
                second = _answer(conn)
            except OSError as exc:  # a reset: the gateway had closed it
                second = repr(exc).encode()
        assert second.startswith(b"HTTP/1.1 200"), f"the idle connection was closed: {second!r}"
    finally:
        gateway.terminate()
        gateway.wait(30)
        log.close()
