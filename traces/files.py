"""How the store puts anything on disk: private to the gateway's user (files 0600, folders 0700:
traces hold every team's prompts, like the spool and the secrets), and durable once a call
returns (the file fsync'd, and the folder that names it, so a crash cannot lose the name)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

FILE_MODE, DIR_MODE = 0o600, 0o700


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a create, rename or unlink is durable only once its
    directory is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_dirs(path: Path) -> Path:
    """``path`` and its missing parents, made 0700, each new one's name fsync'd in its parent."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:  # another writer made it meanwhile
            continue
        fsync_path(d.parent)
    return path


def seal(tmp: Path, final: Path) -> None:
    """A finished temporary file becomes ``final``: private, on disk, then renamed, then named."""
    os.chmod(tmp, FILE_MODE)
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_path(final.parent)


def temp_beside(path: Path, suffix: str = ".tmp") -> Path:
    """A temporary name next to ``path``, this thread's own. One per process was not enough:
    two threads replacing the same file at once (20 requests waking a deployment, each refreshing
    the shared table) wrote the same temporary file, and the second rename found it gone: a 500."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}{suffix}")


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` (all of it, or its old contents after a crash), mode 0600."""
    tmp = temp_beside(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)  # an existing temp file keeps its old mode otherwise
    _write_all(fd, data)
    os.replace(tmp, path)
    fsync_path(path.parent)


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` and fsync; a file this creates is 0600 and its name is fsync'd too."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    created = os.fstat(fd).st_size == 0
    _write_all(fd, data)
    if created:
        fsync_path(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    """Write, fsync and close ``fd`` (closed even if a write fails)."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
