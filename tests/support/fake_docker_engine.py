"""A Docker Engine API stand-in on a unix socket that records what `docker create` would start.

The docker CLI parses `--env-file` itself and sends the result as the container's `Env` in
`POST /containers/create`; answering the ping and that one call is all the CLI needs, so the
real parser runs with no daemon.
"""

from __future__ import annotations

import json
import os
import socketserver
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

API_VERSION = "1.47"


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    created: list[list[str]]


class _Engine(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Api-Version", API_VERSION)
        self.send_header("Ostype", "linux")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self._reply(200)

    def do_GET(self) -> None:  # noqa: N802
        self._reply(200, b"OK")

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "/containers/create" in self.path:
            self.server.created.append(json.loads(body).get("Env") or [])
            self._reply(201, b'{"Id":"0123456789ab","Warnings":[]}')
        else:
            self._reply(404, b'{"message":"not served by the stand-in"}')


@contextmanager
def fake_engine() -> Iterator[tuple[str, list[list[str]]]]:
    """(DOCKER_HOST for the CLI, the Env list of each container created), while inside."""
    with tempfile.TemporaryDirectory() as folder:
        server = _Server(str(Path(folder) / "docker.sock"), _Engine)
        server.created = []
        thread = threading.Thread(target=server.serve_forever, name="fake-docker-engine", daemon=True)
        thread.start()
        try:
            yield f"unix://{server.server_address}", server.created
        finally:
            server.shutdown()
            server.server_close()
            thread.join()


def docker_env_file(docker: str, env_file: Path, timeout_s: float) -> list[str]:
    """The container environment `docker create --env-file ENV_FILE` asks for: NAME=value entries, in order."""
    with fake_engine() as (host, created):
        done = subprocess.run(
            [docker, "create", "--env-file", str(env_file), "stand-in-image"],
            capture_output=True, text=True, timeout=timeout_s,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(env_file.parent), "DOCKER_HOST": host},
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"docker create failed ({done.returncode}): {done.stderr.strip()}")
        [environment] = created
        return environment
