"""Files that hold secrets (the admin key, API key hashes, a resolved gateway config): private
to their owner from the first byte, and replaced atomically."""

from __future__ import annotations

import os
from pathlib import Path

from traces.files import temp_beside


def write_private(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600; no moment exists at which another user could
    read it (the temporary file is created 0600, then renamed over ``path``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing temp file keeps its old mode otherwise
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
