"""The kubelet process: one NodeAgent per configured Node, the Services watch that feeds pods' /etc/hosts,
the log endpoint, and a clean stop on SIGTERM (every pod's processes ended, every sandbox removed)."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from .api import path, run_informer
from .logs import serve
from .node import NodeAgent

log = logging.getLogger(__name__)
Obj = dict[str, Any]


class Kubelet:
    def __init__(self, cfg: Obj) -> None:
        self.cfg = cfg
        self.stopping = threading.Event()
        self.nodes = [NodeAgent(cfg, spec, self) for spec in cfg["nodes"]]
        self._services: dict[tuple[str, str], str] = {}
        self._services_lock = threading.Lock()
        ip = cfg["kubernetes_service_ip"]
        # what a kubelet injects for the `kubernetes` Service, so in-cluster clients find the apiserver
        self.service_env = {
            "KUBERNETES_SERVICE_HOST": ip,
            "KUBERNETES_SERVICE_PORT": "443",
            "KUBERNETES_SERVICE_PORT_HTTPS": "443",
            "KUBERNETES_PORT": f"tcp://{ip}:443",
            "KUBERNETES_PORT_443_TCP": f"tcp://{ip}:443",
            "KUBERNETES_PORT_443_TCP_PROTO": "tcp",
            "KUBERNETES_PORT_443_TCP_PORT": "443",
            "KUBERNETES_PORT_443_TCP_ADDR": ip,
        }

    def run(self) -> None:
        root = Path(self.cfg["root_dir"])
        (root / "procs").mkdir(parents=True, exist_ok=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        serve(
            root,
            self.cfg["bridge_ip"],
            self.cfg["port"],
            self.cfg["serving_cert"],
            self.cfg["serving_key"],
            self.cfg["ca"],
            self._running,
            self.stopping,
        )
        threading.Thread(
            target=run_informer,
            name="services",
            daemon=True,
            args=(
                self.nodes[0].api,
                path("api", "v1", "services"),
                {},
                self._services_listed,
                self._service_event,
                self.stopping,
            ),
        ).start()
        for node in self.nodes:
            threading.Thread(target=node.start, name=f"node-{node.name}", daemon=True).start()
        while not self.stopping.wait(1.0):
            pass
        log.info("stopping: ending every pod")
        workers = [w for n in self.nodes for w in n.all_workers()]
        for w in workers:
            w.wake.set()
        for w in workers:
            w.join(timeout=10)

    def _running(self, namespace: str, pod: str, container: str) -> bool:
        for node in self.nodes:
            for w in node.all_workers():
                meta = w.pod["metadata"]
                if (meta["namespace"], meta["name"]) == (namespace, pod):
                    return any(c.name == container and c.state == "running" for c in w.init + w.main)
        return False

    # --- Services, for the pods' /etc/hosts ---------------------------------------------------

    def services(self) -> list[tuple[str, str, str]]:
        with self._services_lock:
            return [(name, ns, ip) for (ns, name), ip in sorted(self._services.items())]

    def _services_listed(self, items: list[Obj]) -> None:
        with self._services_lock:
            self._services = {}
        for svc in items:
            self._service_event("ADDED", svc, refresh=False)
        self._refresh_hosts()

    def _service_event(self, kind: str, svc: Obj, refresh: bool = True) -> None:
        key = (svc["metadata"]["namespace"], svc["metadata"]["name"])
        ip = svc.get("spec", {}).get("clusterIP")
        with self._services_lock:
            if kind == "DELETED" or not ip or ip == "None":
                self._services.pop(key, None)
            else:
                self._services[key] = ip
        if refresh:
            self._refresh_hosts()

    def _refresh_hosts(self) -> None:
        for node in self.nodes:
            for w in node.all_workers():
                w.write_hosts()


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    cfg = json.loads(Path(argv[0]).read_text())
    Kubelet(cfg).run()


if __name__ == "__main__":
    main(sys.argv[1:])
