"""Fixtures: a redis-server of our own on a free port (never a shared one), names unique per test."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (.ci/run installs it)")
        self.port = free_port()
        self.dir = tempfile.TemporaryDirectory()
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir.name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}")
                time.sleep(0.01)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self.dir.cleanup()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    server = RedisServer()
    yield server.url
    server.stop()


@pytest.fixture
def name() -> str:
    """A semaphore or bucket name no other test uses."""
    return f"t-{uuid.uuid4().hex[:12]}"
