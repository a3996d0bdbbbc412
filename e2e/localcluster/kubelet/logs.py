"""Container logs: one file per container start under the pod's directory (kept after the pod is gone),
and the kubelet's HTTPS /containerLogs endpoint, so `kubectl logs` works through the apiserver."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse


def pod_dir(root: Path, namespace: str, pod: str) -> Path | None:
    """The newest directory of pod `namespace/pod` (a re-created pod of the same name gets a new one)."""
    dirs = sorted((root / "pods").glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime)
    return dirs[-1] if dirs else None


def log_file(
    root: Path, namespace: str, pod: str, container: str | None, previous: bool = False
) -> Path | None:
    found = pod_dir(root, namespace, pod)
    if found is None:
        return None
    logs = found / "logs"
    if container is None:
        names = sorted(p.name for p in logs.iterdir()) if logs.exists() else []
        if not names:
            return None
        container = names[0]
    runs = sorted((logs / container).glob("*.log"), key=lambda p: int(p.stem))
    wanted = runs[-2:-1] if previous else runs[-1:]
    return wanted[0] if wanted else None


def tail_lines(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def serve(
    root: Path,
    address: str,
    port: int,
    cert: str,
    key: str,
    ca: str,
    running: Callable[[str, str, str], bool],
    stop: threading.Event,
) -> ThreadingHTTPServer:
    """Serve /containerLogs/{namespace}/{pod}/{container} to clients with a certificate from the cluster CA
    (the apiserver); `running(ns, pod, container)` tells a follower when the container has ended."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "the process kubelet serves only /containerLogs")
                return
            _, namespace, pod, container = parts
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            file = log_file(root, namespace, pod, container, previous=query.get("previous") == "true")
            if file is None:
                self.send_error(404, f"no logs for container {container!r} of pod {namespace}/{pod}")
                return
            data = file.read_bytes()
            if "tailLines" in query:
                data = tail_lines(data, int(query["tailLines"]))
            if "limitBytes" in query:
                data = data[: int(query["limitBytes"])]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(data)
            if query.get("follow") == "true":
                self._follow(file, namespace, pod, container)

        def _follow(self, file: Path, namespace: str, pod: str, container: str) -> None:
            with file.open("rb") as f:
                f.seek(0, 2)
                while not stop.is_set():
                    chunk = f.read(65536)
                    if chunk:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    elif not running(namespace, pod, container):
                        return
                    else:
                        time.sleep(0.2)

        def log_message(self, format: str, *args: object) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="log-server", daemon=True).start()
    return server
