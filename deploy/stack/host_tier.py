"""The local host-DRAM KV tier's processes: a Mooncake master, its HTTP metadata server, and what
the workers need to join the store, all on loopback.

Mooncake 0.3.x ignores two bind addresses, so both are handled here. The master's embedded HTTP
metadata server binds 0.0.0.0 whatever ``--http_metadata_server_host`` says, so the metadata
server runs as its own process (Mooncake's ``mooncake_http_metadata_server``, which honours
``--host``). The transfer engine inside each worker binds its handshake daemon and TCP acceptor
to the any-address with no setting at all, so the workers run with a small ``bind()`` shim
(deploy/stack/native/loopback_bind.c, compiled into the run dir on first use) that binds loopback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from deploy.stack.config import StackConfig, mooncake_store_config
from deploy.stack.processes import Component

SHIM_SOURCE = Path(__file__).with_name("native") / "loopback_bind.c"


def host_tier_components(cfg: StackConfig) -> list[Component]:
    t, bin_dir = cfg.host_tier, Path(sys.executable).parent
    return [
        Component(
            name="mooncake-metadata",
            ports=[t.metadata_port],
            argv=[
                str(bin_dir / "mooncake_http_metadata_server"),
                "--host",
                "127.0.0.1",
                "--port",
                str(t.metadata_port),
                "--log-level",
                "WARNING",
            ],
        ),
        Component(
            name="mooncake-master",
            ports=[t.rpc_port, t.metrics_port],
            argv=[
                str(bin_dir / "mooncake_master"),
                "--rpc_address=127.0.0.1",
                f"--rpc_port={t.rpc_port}",
                "--metrics_host=127.0.0.1",
                f"--metrics_port={t.metrics_port}",
            ],
            health_url=f"http://127.0.0.1:{t.metrics_port}/metrics",
        ),
    ]


def worker_env(cfg: StackConfig) -> dict[str, str]:
    """What a worker's environment needs to lend memory to the store, bound to loopback."""
    t, path = cfg.host_tier, cfg.run_dir / "mooncake.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            mooncake_store_config("127.0.0.1", t.rpc_port, t.metadata_port, "tcp", f"{t.segment_mb}MB", f"{t.local_buffer_mb}MB")
        )
    )
    return {"MOONCAKE_CONFIG_PATH": str(path), "LD_PRELOAD": str(loopback_shim(cfg.run_dir))}


def loopback_shim(run_dir: Path) -> Path:
    """The compiled bind() shim (built again when its source is newer)."""
    out = run_dir / "loopback_bind.so"
    if out.exists() and out.stat().st_mtime >= SHIM_SOURCE.stat().st_mtime:
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError(
            "the host tier needs a C compiler (apt-get install gcc) to build "
            f"{SHIM_SOURCE.name}, which keeps Mooncake's listeners on loopback"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(SHIM_SOURCE), "-ldl"], check=True)
    tmp.replace(out)
    return out
