"""Probe and lifecycle-hook handlers: httpGet and tcpSocket from the host to the pod's IP (as a kubelet
probes), exec inside the container's namespaces, sleep.  Each returns (ok, message)."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """Where a container can be reached: its pod's IP, its main process (for exec) and its env."""

    pod_ip: str
    pid: int
    env: dict[str, str]
    ports: dict[str, int]  # named container ports


def _port(value: int | str, target: Target) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    if value not in target.ports:
        raise ValueError(f"port {value!r} names no container port")
    return target.ports[value]


def run_handler(handler: Obj, target: Target, timeout: float) -> tuple[bool, str]:
    try:
        if "httpGet" in handler:
            return _http_get(handler["httpGet"], target, timeout)
        if "tcpSocket" in handler:
            spec = handler["tcpSocket"]
            with socket.create_connection(
                (spec.get("host") or target.pod_ip, _port(spec["port"], target)), timeout
            ):
                return True, ""
        if "exec" in handler:
            return _exec(handler["exec"]["command"], target, timeout)
        if "sleep" in handler:
            time.sleep(float(handler["sleep"]["seconds"]))
            return True, ""
        return False, f"unsupported handler {sorted(handler)}"
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return False, str(exc) or type(exc).__name__


def _http_get(spec: Obj, target: Target, timeout: float) -> tuple[bool, str]:
    host, port = spec.get("host") or target.pod_ip, _port(spec["port"], target)
    if spec.get("scheme", "HTTP").upper() == "HTTPS":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host,
            port,
            timeout=timeout,
            context=ssl._create_unverified_context(),  # kubelets skip verification
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {h["name"]: h["value"] for h in spec.get("httpHeaders", [])}
        headers.setdefault("User-Agent", "kube-probe/1.34")
        conn.request("GET", spec.get("path", "/"), headers=headers)
        status = conn.getresponse().status
    finally:
        conn.close()
    ok = 200 <= status < 400
    return ok, "" if ok else f"HTTP probe failed with statuscode: {status}"


def _exec(command: list[str], target: Target, timeout: float) -> tuple[bool, str]:
    argv = ["nsenter", "-t", str(target.pid), "-n", "-m", "-u", "--", *command]
    try:
        result = subprocess.run(
            argv, env=target.env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return False, f"command timed out after {timeout:.0f}s"
    return result.returncode == 0, (result.stdout + result.stderr).strip()[-500:]
