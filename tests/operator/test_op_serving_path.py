"""What the Service selects while the routing changes, and when Ready and the old objects' deletion wait."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from op_fixtures import example, spec_of

from kubeinfer_operator.serving_path import (
    PathState,
    ProbeResult,
    Serving,
    choose_path,
    current_path,
    desired_path,
    desired_routing,
    may_prune,
    probe_needed,
    routing_of,
    url_answers,
)
from kubeinfer_operator.status import Observation, RevisionView, ready_condition
from kubeinfer_operator.url_probe import probe_url

ROUTER_SERVICE = {"spec": {"selector": {"app.kubernetes.io/name": "kubeinfer-router"}}}
REPLICA_SERVICE = {"spec": {"selector": {"app.kubernetes.io/name": "kubeinfer-runtime"}}}


def _spec(rollout: dict | None) -> object:
    manifest = example("tiny-cpu.yaml")
    if rollout:
        manifest = {**manifest, "spec": {**manifest["spec"], "rollout": rollout}}
    return spec_of(manifest)


def test_each_strategy_has_its_path_and_routing() -> None:
    canary = {"strategy": "Canary", "steps": [{"weight": 20, "pause": "1m"}]}
    gateway = {**canary, "trafficRouting": {"gatewayAPI": {"parentRefs": [{"name": "gw"}]}}}
    cases = [
        (None, "replicas", "none"),
        (canary, "router", "router"),
        (gateway, "replicas", "gateway"),
    ]
    for rollout, path, routing in cases:
        spec = _spec(rollout)
        assert (desired_path(spec), desired_routing(spec)) == (path, routing), rollout  # type: ignore[arg-type]
    assert current_path(ROUTER_SERVICE) == "router" and current_path(REPLICA_SERVICE) == "replicas"
    assert current_path(None) is None


def test_traffic_objects_are_told_apart_by_routing() -> None:
    assert routing_of("Deployment", "chat-router", "chat") == "router"
    assert routing_of("ConfigMap", "chat-router", "chat") == "router"
    assert routing_of("HTTPRoute", "chat", "chat") == "gateway"
    assert routing_of("Service", "chat-canary", "chat") == "gateway"
    assert routing_of("Service", "chat", "chat") is None  # the front Service stays whatever the routing
    assert routing_of("Deployment", "chat-1a2b3c4d5e", "chat") is None


def test_the_service_moves_to_the_new_path_only_once_it_has_ready_pods() -> None:
    # Gateway/RollingUpdate -> router: the router pods are starting.
    held = choose_path("replicas", "router", {"router": 0, "replicas": 2})
    assert (held.selected, held.switching, held.ready_pods) == ("replicas", True, 2)
    moved = choose_path("replicas", "router", {"router": 1, "replicas": 2})
    assert (moved.selected, moved.switching, moved.ready_pods) == ("router", False, 1)
    # A new service has nothing to lose: it selects its path at once.
    assert choose_path(None, "router", {}).selected == "router"


def test_ready_waits_for_the_url_to_answer_from_the_selected_path() -> None:
    router = PathState("router", "router", 2)
    answered = ProbeResult(("router", "router", "router"))
    stale_answer = ProbeResult(("runtime", "router", "router"))  # a proxy still sends to the old path
    refused = ProbeResult((None, None, None), "ConnectError: refused")
    assert url_answers(router, answered, probing=True)
    assert not url_answers(router, stale_answer, probing=True)
    assert not url_answers(router, refused, probing=True)
    assert url_answers(router, None, probing=False)  # outside the cluster: Ready pods are the answer
    assert not url_answers(PathState("router", "router", 0), None, probing=False)


def test_old_objects_go_only_after_the_url_answers_from_the_new_path() -> None:
    switched = PathState("replicas", "replicas", 2)
    assert not may_prune(PathState("router", "replicas", 2), ProbeResult(("runtime",) * 3), probing=True)
    assert not may_prune(switched, ProbeResult(("router", "runtime", "runtime")), probing=True)
    assert not may_prune(switched, None, probing=True)
    assert may_prune(switched, ProbeResult(("runtime",) * 3), probing=True)
    assert may_prune(switched, None, probing=False)


def test_the_probe_runs_only_when_it_decides_something() -> None:
    steady = PathState("router", "router", 2)
    assert not probe_needed(steady, was_ready=True, stale=False, probing=True)
    assert probe_needed(steady, was_ready=False, stale=False, probing=True)
    assert probe_needed(steady, was_ready=True, stale=True, probing=True)
    assert not probe_needed(PathState("router", "router", 0), was_ready=False, stale=True, probing=True)
    assert not probe_needed(steady, was_ready=False, stale=True, probing=False)


def _observation(serving: Serving, ready: int) -> Observation:
    current = RevisionView("abc", "chat-abc", "uid", 1, 1, ready, 1, True, False) if ready else None
    return Observation(1, "abc", current, (), None, "http://chat.ns.svc.cluster.local", serving)


def test_ready_names_what_it_waits_for() -> None:
    starting = Serving(PathState("router", "router", 0), answers=False)
    c = ready_condition(_observation(starting, ready=0))
    assert (c.status, c.reason) == ("False", "Creating")  # no replica yet: the usual way up
    c = ready_condition(_observation(starting, ready=1))
    assert (c.status, c.reason) == ("False", "RouterStarting")
    unanswered = Serving(PathState("router", "router", 2), answers=False, error="ConnectError: refused")
    c = ready_condition(_observation(unanswered, ready=1))
    assert (c.status, c.reason) == ("False", "URLNotAnswering")
    assert "http://chat.ns.svc.cluster.local" in c.message and "refused" in c.message
    c = ready_condition(_observation(Serving(PathState("router", "router", 2), answers=True), ready=1))
    assert (c.status, c.reason) == ("True", "Serving")


class _Ready(http.server.BaseHTTPRequestHandler):
    component = "runtime"

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/ready" else 404)
        self.send_header("x-kubeinfer-component", self.component)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def ready_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_probe_reads_which_component_answered_over_real_http(ready_server: str) -> None:
    result = probe_url(ready_server)
    assert result.components == ("runtime",) * 3 and result.error is None
    closed = probe_url("http://127.0.0.1:9", probes=3, timeout_s=0.5)
    # The first failure ends the probing: not yet answering is known after one.
    assert closed.components == (None,) and closed.error and "ConnectError" in closed.error
    assert not closed.all_from("runtime")


def test_the_routers_role_binding_belongs_to_the_router_routing_under_either_name() -> None:
    assert routing_of("RoleBinding", "tiny-router-config-reader", "tiny") == "router"
    assert routing_of("RoleBinding", "tiny-router", "tiny") == "router"  # what older operators wrote
    assert routing_of("RoleBinding", "other-router-config-reader", "tiny") is None
