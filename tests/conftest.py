import pytest

from deploy.models.tiny_model import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny model, made once per test session."""
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port: int) -> bool:
    """Whether a gateway on this loopback port answers its /health with 200 now."""
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class RedisServer:
    """A real redis-server on loopback, stopped and restarted by PID (for outage tests)."""

    def __init__(self, tmp_path):
        self.port, self.dir, self.proc = free_port(), tmp_path, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        import shutil
        import subprocess
        import time

        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server; .ci/run does)")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def hang(self):
        """An outage that keeps the data: the server stops answering (SIGSTOP) until ``wake``."""
        import signal

        self.proc.send_signal(signal.SIGSTOP)

    def wake(self):
        import signal

        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        if self.proc:
            self.wake()  # a hung server cannot act on SIGTERM
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def recording_upstream():
    """A loopback deployment that answers every completion and keeps what it was sent."""
    from tests.recording_upstream import RecordingUpstream

    deployment = RecordingUpstream()
    yield deployment
    deployment.stop()
