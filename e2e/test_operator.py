"""The operator on the local cluster, installed by its chart and running as a pod of the chart's
Deployment with the chart's ServiceAccount, so every API call it makes is checked by RBAC."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from demo import CHART, TINY_EXAMPLE, chat, endpoint_addresses, service_urls
from e2e_support import get, operator_release, wait_for

pytestmark = pytest.mark.cluster

# A release of its own, serving only its own namespace: it neither disturbs nor depends on a
# `make demo` release that may be running in the same cluster, and it exercises the chart's
# namespaced RBAC (RoleBindings instead of a ClusterRoleBinding).
RELEASE = "kubeinfer-e2e"
OPERATOR_NAMESPACE = "kubeinfer-e2e"
OPERATOR_NAME = f"{RELEASE}-operator"  # Deployment, ServiceAccount and Lease
NAMESPACE = "op-e2e"
ISVC_LABEL = "serving.kubeinfer.dev/inferenceservice"
RESYNC_SECONDS = 3


def owned(cluster: Any, kind: str, name: str) -> list[dict[str, Any]]:
    return get(cluster, kind, "-n", NAMESPACE, "-l", f"{ISVC_LABEL}={name}")["items"]


def condition(isvc: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in isvc.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def leader_pod(cluster: Any) -> str:
    holder = (
        get(cluster, "lease", OPERATOR_NAME, "-n", OPERATOR_NAMESPACE)["spec"].get("holderIdentity") or ""
    )
    return holder.rsplit("_", 1)[0]


def reconciles_logged(cluster: Any, name: str) -> int:
    log = cluster.pod_log(OPERATOR_NAMESPACE, leader_pod(cluster))
    return log.count(f"reconciled {NAMESPACE}/{name}:")


def manifest(name: str, **spec_changes: Any) -> dict[str, Any]:
    obj = yaml.safe_load(TINY_EXAMPLE.read_text())
    obj["metadata"] = {"name": name, "namespace": NAMESPACE}
    for dotted, value in spec_changes.items():
        *parents, leaf = dotted.split("__")
        node = obj["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return obj


def apply(cluster: Any, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))


@pytest.fixture(scope="module")
def operator(cluster: Any) -> Iterator[Any]:
    values = {"replicaCount": 2, "logLevel": "DEBUG", "resyncSeconds": RESYNC_SECONDS}
    with operator_release(
        cluster, release=RELEASE, operator_namespace=OPERATOR_NAMESPACE, namespace=NAMESPACE, values=values
    ):

        def elected() -> bool:
            lease = cluster.kubectl("get", "lease", OPERATOR_NAME, "-n", OPERATOR_NAMESPACE, check=False)
            instance = f"app.kubernetes.io/instance={RELEASE}"
            pods = get(cluster, "pods", "-n", OPERATOR_NAMESPACE, "-l", instance)
            names = {p["metadata"]["name"] for p in pods["items"]}
            return lease.returncode == 0 and leader_pod(cluster) in names

        # A Lease left by an earlier session (its holder gone) expires within its 15 s duration.
        wait_for("one of the operator pods to be elected", elected, timeout=60)
        yield cluster


@pytest.fixture(scope="module")
def tiny(operator: Any) -> dict[str, Any]:
    # A fixed count: the autoscaler (e2e/test_autoscaling.py) writes readings of its own to status.
    apply(operator, manifest("tiny", scaling__maxReplicas=1))
    operator.kubectl("wait", "--for=condition=Ready", "infsvc/tiny", "-n", NAMESPACE, "--timeout=180s")
    return get(operator, "infsvc", "tiny", "-n", NAMESPACE)


def test_operator_runs_as_the_charts_pods_with_its_service_account(operator: Any) -> None:
    selector = f"app.kubernetes.io/instance={RELEASE}"
    pods = get(operator, "pods", "-n", OPERATOR_NAMESPACE, "-l", selector)["items"]
    assert len(pods) == 2
    assert {p["spec"]["serviceAccountName"] for p in pods} == {OPERATOR_NAME}
    # the permissions come from a RoleBinding in the served namespace, not cluster-wide
    binding = get(operator, "rolebinding", OPERATOR_NAME, "-n", NAMESPACE)
    assert binding["subjects"][0]["name"] == OPERATOR_NAME
    assert {p["status"]["phase"] for p in pods} == {"Running"}
    assert leader_pod(operator) in {p["metadata"]["name"] for p in pods}
    helm = [operator.helm_path, "lint", "--strict", str(CHART)]
    linted = subprocess.run(helm, capture_output=True, text=True, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_tiny_example_becomes_ready_and_answers(operator: Any, tiny: dict[str, Any]) -> None:
    status = tiny["status"]
    assert condition(tiny, "Ready")["status"] == "True"
    # GitOps-safe: the operator wrote status and nothing else, and holds no finalizer
    assert not tiny["metadata"].get("finalizers")
    fields = get(operator, "infsvc", "tiny", "-n", NAMESPACE, "--show-managed-fields")["metadata"][
        "managedFields"
    ]
    ours = [m for m in fields if m["manager"] == "kubeinfer-operator"]
    assert ours and {m.get("subresource") for m in ours} == {"status"}
    assert status["observedGeneration"] == tiny["metadata"]["generation"]
    assert status["readyReplicas"] == 1 and status["desiredReplicas"] == 1
    assert status["url"] == f"http://tiny.{NAMESPACE}.svc.cluster.local"
    pods = get(operator, "pods", "-n", NAMESPACE, "-l", status["selector"])["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running"]
    assert status["stableRevision"] == pods[0]["metadata"]["labels"]["serving.kubeinfer.dev/revision"]
    addresses = endpoint_addresses(operator, NAMESPACE, "tiny")
    assert addresses == [pods[0]["status"]["podIP"]]
    response = httpx.post(
        f"http://{addresses[0]}:8000/v1/completions",
        json={"model": "tiny", "prompt": "Hello", "max_tokens": 5},
        timeout=30,
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 5
    _, answer = chat(service_urls(operator, NAMESPACE, "tiny"), "tiny", "Hi")
    assert answer["choices"][0]["message"]["role"] == "assistant"


def test_reconciling_an_unchanged_object_writes_nothing(operator: Any, tiny: dict[str, Any]) -> None:
    def versions() -> dict[str, str]:
        found = {
            f"{kind}/{obj['metadata']['name']}": obj["metadata"]["resourceVersion"]
            for kind in ("deployments", "services", "poddisruptionbudgets")
            for obj in owned(operator, kind, "tiny")
        }
        return found

    def settled() -> bool:
        isvc = get(operator, "infsvc", "tiny", "-n", NAMESPACE)
        return condition(isvc, "Progressing").get("reason") == "Complete"

    wait_for("the rollout to settle", settled)
    before, status_before = versions(), get(operator, "infsvc", "tiny", "-n", NAMESPACE)["status"]
    seen = reconciles_logged(operator, "tiny")
    # An event on the object itself, and then resyncs: at least three more reconciles.
    operator.kubectl("annotate", "infsvc", "tiny", "-n", NAMESPACE, f"e2e/poke={time.time()}")
    wait_for("three more reconciles", lambda: reconciles_logged(operator, "tiny") >= seen + 3, timeout=30)
    assert len(before) == 3
    assert versions() == before
    assert get(operator, "infsvc", "tiny", "-n", NAMESPACE)["status"] == status_before


def operator_requests(cluster: Any) -> dict[str, float]:
    """The leader's own count of API requests by verb (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    pod = get(cluster, "pod", leader_pod(cluster), "-n", OPERATOR_NAMESPACE)
    text = httpx.get(f"http://{pod['status']['podIP']}:8081/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kubeinfer_operator_api_requests_total":
                verb = sample.labels["verb"]
                counts[verb] = counts.get(verb, 0.0) + sample.value
    return counts


def test_reconciling_an_unchanged_service_sends_no_api_request(operator: Any, tiny: dict[str, Any]) -> None:
    """Reconciles of a service nothing changed read only the operator's watch cache: over a few resync
    periods (each reconciles every service) the leader sends no GET and no write; its only requests are
    the resync's one LIST per cached kind."""
    seen = reconciles_logged(operator, "tiny")
    before = operator_requests(operator)
    wait_for("four more reconciles", lambda: reconciles_logged(operator, "tiny") >= seen + 4, timeout=30)
    after = operator_requests(operator)
    sent = {verb: after.get(verb, 0) - before.get(verb, 0) for verb in after}
    print(f"\nrequests over {reconciles_logged(operator, 'tiny') - seen} reconciles of tiny: {sent}")
    assert {verb: n for verb, n in sent.items() if verb != "list" and n} == {}
    assert sent.get("list", 0) > 0  # the resync passes ran


def test_a_deleted_service_comes_back(operator: Any, tiny: dict[str, Any]) -> None:
    old = get(operator, "service", "tiny", "-n", NAMESPACE)["metadata"]["uid"]
    operator.kubectl("delete", "service", "tiny", "-n", NAMESPACE)
    back = wait_for(
        "the Service to be recreated",
        lambda: [s for s in owned(operator, "services", "tiny") if s["metadata"]["uid"] != old],
        timeout=30,
    )
    assert back[0]["spec"]["ports"][0]["port"] == 80


def test_a_hand_scaled_deployment_is_set_back(operator: Any, tiny: dict[str, Any]) -> None:
    (deployment,) = owned(operator, "deployments", "tiny")
    name = deployment["metadata"]["name"]
    operator.kubectl("scale", "deployment", name, "-n", NAMESPACE, "--replicas=3")
    wait_for(
        "the operator to restore 1 replica",
        lambda: get(operator, "deployment", name, "-n", NAMESPACE)["spec"]["replicas"] == 1,
        timeout=30,
    )


def wait_rolled_out(cluster: Any, name: str, old_revision: str) -> dict[str, Any]:
    """The InferenceService once a revision other than `old_revision` serves alone, all replicas up."""

    def rolled_out() -> dict[str, Any] | None:
        isvc = get(cluster, "infsvc", name, "-n", NAMESPACE)
        status = isvc["status"]
        done = (
            status.get("observedGeneration") == isvc["metadata"]["generation"]
            and status.get("stableRevision") not in (None, old_revision)
            and condition(isvc, "Progressing").get("reason") == "Complete"
        )
        return isvc if done else None

    return wait_for("the new revision to replace the old", rolled_out, timeout=120)


def test_a_spec_change_rolls_out_a_new_revision(operator: Any, tiny: dict[str, Any]) -> None:
    first = get(operator, "infsvc", "tiny", "-n", NAMESPACE)["status"]["stableRevision"]
    operator.kubectl(
        "patch",
        "infsvc",
        "tiny",
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        '{"spec":{"runtime":{"maxNumSeqs":4}}}',
    )

    isvc = wait_rolled_out(operator, "tiny", first)
    second = isvc["status"]["stableRevision"]
    deployments = owned(operator, "deployments", "tiny")
    assert [d["metadata"]["name"] for d in deployments] == [f"tiny-{second}"]
    args = deployments[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "4"
    assert condition(isvc, "Ready")["status"] == "True"
    events = get(operator, "events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=tiny")["items"]
    assert "RollingOut" in {e["reason"] for e in events}


def cluster_ip_url(cluster: Any, name: str) -> str:
    ip = cluster.kubectl("get", "service", name, "-n", NAMESPACE, "-o", "jsonpath={.spec.clusterIP}").stdout
    return f"http://{ip.strip()}:80"


def test_a_model_revision_change_alone_rolls_out_a_new_revision(operator: Any, tiny: dict[str, Any]) -> None:
    # Weights on a volume: nothing of the pod but the revision annotation says which version they are.
    first = get(operator, "infsvc", "tiny", "-n", NAMESPACE)["status"]["stableRevision"]
    patch = '{"spec":{"model":{"revision":"v2"}}}'
    operator.kubectl("patch", "infsvc", "tiny", "-n", NAMESPACE, "--type=merge", "-p", patch)

    second = wait_rolled_out(operator, "tiny", first)["status"]["stableRevision"]
    (deployment,) = owned(operator, "deployments", "tiny")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert deployment["metadata"]["name"] == f"tiny-{second}"
    assert annotations["serving.kubeinfer.dev/model-revision"] == "v2"


def test_the_url_answers_the_moment_ready_is_reported(operator: Any) -> None:
    """`kubectl wait --for=condition=Ready` returns only once a request to the Service is answered:
    a request sent right then succeeds, on every try (each a new service, so Ready goes False -> True)."""
    request = {"model": "tiny", "prompt": "Hello", "max_tokens": 2}
    for attempt in range(3):
        name = f"ready-{attempt}"
        apply(operator, manifest(name, scaling__maxReplicas=1))
        try:
            operator.kubectl(
                "wait", "--for=condition=Ready", f"infsvc/{name}", "-n", NAMESPACE, "--timeout=180s"
            )
            response = httpx.post(
                f"{cluster_ip_url(operator, name)}/v1/completions", json=request, timeout=30
            )
            assert response.status_code == 200, (attempt, response.text)
        finally:
            operator.kubectl("delete", "infsvc", name, "-n", NAMESPACE, "--wait=false")


def test_more_gpus_than_any_node_has_is_explained(operator: Any) -> None:
    greedy = manifest(
        "greedy",
        runtime__engine="vllm",
        runtime__image="vllm/vllm-openai:v0.11.0",
        runtime__resources={"gpus": 4},
        runtime__kvCacheTokens=None,
    )
    del greedy["spec"]["runtime"]["kvCacheTokens"]
    apply(operator, greedy)

    def explained() -> dict[str, Any]:
        ready = condition(get(operator, "infsvc", "greedy", "-n", NAMESPACE), "Ready")
        return ready if ready.get("reason") == "Unschedulable" else {}

    ready = wait_for("the Unschedulable condition", explained, timeout=60)
    assert ready["status"] == "False"
    assert "Insufficient nvidia.com/gpu" in ready["message"]
    assert "lower spec.runtime.resources.gpus" in ready["message"]
    events = get(operator, "events", "-n", NAMESPACE, "--field-selector", "involvedObject.name=greedy")[
        "items"
    ]
    assert any(e["reason"] == "Unschedulable" and e["type"] == "Warning" for e in events)
    operator.kubectl("delete", "infsvc", "greedy", "-n", NAMESPACE)


def test_a_crashing_runtime_is_explained(operator: Any) -> None:
    apply(operator, manifest("broken", runtime__faults={"failLoad": True}))

    def explained() -> dict[str, Any]:
        ready = condition(get(operator, "infsvc", "broken", "-n", NAMESPACE), "Ready")
        return ready if ready.get("reason") == "CrashLoop" else {}

    ready = wait_for("the CrashLoop condition", explained, timeout=90)
    assert ready["status"] == "False"
    assert "keeps exiting" in ready["message"] and f"kubectl logs -n {NAMESPACE} broken-" in ready["message"]
    degraded = condition(get(operator, "infsvc", "broken", "-n", NAMESPACE), "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "CrashLoop")
    operator.kubectl("delete", "infsvc", "broken", "-n", NAMESPACE)


def test_the_runtime_pod_runs_as_its_uid_on_a_read_only_root_with_the_prebuilt_kernels(
    operator: Any, tiny: dict[str, Any]
) -> None:
    if not operator.real_nodes:
        pytest.skip("needs real nodes (KUBEINFER_NODE_KIND=real): the process kubelet runs no image, no exec")
    pod = next(p for p in owned(operator, "pod", "tiny") if not p["metadata"].get("deletionTimestamp"))
    name = pod["metadata"]["name"]

    def in_pod(*argv: str) -> Any:
        return operator.kubectl("exec", name, "-n", NAMESPACE, "-c", "runtime", "--", *argv, check=False)

    assert in_pod("id", "-u").stdout.strip() == "10001"
    wrote = in_pod("touch", "/usr/local/lib/x")
    assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr
    log = operator.kubectl("logs", name, "-n", NAMESPACE, "-c", "runtime").stdout
    assert "CPU kernels on (avx2, /opt/kubeinfer/kernels/kubeinfer_cpu_ops.so)" in log, log[-2000:]


def test_a_runtime_over_its_memory_limit_is_oom_killed_and_explained(operator: Any) -> None:
    if not operator.real_nodes:
        pytest.skip(
            "needs real nodes (KUBEINFER_NODE_KIND=real): the process kubelet enforces no memory limit"
        )
    # 128 Mi: less than importing torch takes, so the kernel kills the runtime before it serves.
    apply(operator, manifest("oom", runtime__resources__memory="128Mi"))

    def oom_killed() -> dict[str, Any] | None:
        pods = owned(operator, "pod", "oom")
        statuses = [s for p in pods for s in p["status"].get("containerStatuses") or []]
        return next((t for s in statuses if (t := (s.get("lastState") or {}).get("terminated"))), None)

    killed = wait_for("the runtime container to be killed", oom_killed, timeout=120)
    assert (killed["exitCode"], killed["reason"]) == (137, "OOMKilled")

    def explained() -> dict[str, Any]:
        ready = condition(get(operator, "infsvc", "oom", "-n", NAMESPACE), "Ready")
        return ready if ready.get("reason") == "OutOfMemory" else {}

    ready = wait_for("the OutOfMemory condition", explained, timeout=60)
    assert ready["status"] == "False" and "spec.runtime.resources.memory" in ready["message"]
    operator.kubectl("delete", "infsvc", "oom", "-n", NAMESPACE)


def test_the_standby_takes_over_when_the_leader_dies(operator: Any, tiny: dict[str, Any]) -> None:
    leader = leader_pod(operator)
    operator.kubectl("delete", "pod", leader, "-n", OPERATOR_NAMESPACE, "--wait=false")
    successor = wait_for(
        "another replica to hold the lease",
        lambda: (pod := leader_pod(operator)) and pod != leader and pod,
        timeout=60,
    )
    assert successor
    old = get(operator, "service", "tiny", "-n", NAMESPACE)["metadata"]["uid"]
    operator.kubectl("delete", "service", "tiny", "-n", NAMESPACE)
    wait_for(
        "the new leader to repair the Service",
        lambda: [s for s in owned(operator, "services", "tiny") if s["metadata"]["uid"] != old],
        timeout=30,
    )


OPERATOR_SA = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_NAME}"
ROUTER_CLUSTER_ROLE = f"{RELEASE}-router"  # the chart's


def can(cluster: Any, who: str, *request: str) -> bool:
    answer = cluster.kubectl("auth", "can-i", *request, f"--as={who}", check=False)
    assert answer.stdout.strip() in ("yes", "no"), answer.stderr
    return answer.stdout.strip() == "yes"


def test_the_operator_cannot_read_secrets_make_roles_or_grant_more_than_the_router_role(
    operator: Any,
) -> None:
    served = ("-n", NAMESPACE)
    assert can(operator, OPERATOR_SA, "create", "rolebindings", *served)
    assert can(operator, OPERATOR_SA, "bind", f"clusterroles/{ROUTER_CLUSTER_ROLE}", *served)
    for request in (
        ("get", "secrets", *served),
        ("list", "secrets", *served),
        ("create", "roles", *served),
        ("escalate", "roles", *served),
        ("create", "clusterroles"),
        ("escalate", "clusterroles"),
        ("create", "clusterrolebindings"),
        ("bind", "clusterroles/cluster-admin", *served),
        ("bind", f"clusterroles/{ROUTER_CLUSTER_ROLE}", "-n", "kube-system"),  # a namespace it does not serve
    ):
        assert not can(operator, OPERATOR_SA, *request), request
    # The apiserver's own escalation check, on a real request: binding cluster-admin is refused, binding the
    # router's role is not.
    binding = ("create", "rolebinding", "grab", "--serviceaccount", f"{NAMESPACE}:default", *served)
    refused = operator.kubectl(*binding, "--clusterrole=cluster-admin", f"--as={OPERATOR_SA}", check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()
    allowed = (*binding, f"--clusterrole={ROUTER_CLUSTER_ROLE}", "--dry-run=server", f"--as={OPERATOR_SA}")
    operator.kubectl(*allowed)


def test_a_router_may_only_read_the_config_maps_of_its_namespace(operator: Any) -> None:
    apply(
        operator,
        manifest("gated", rollout__strategy="Canary", rollout__steps=[{"weight": 50, "pause": "1m"}]),
    )
    router = f"system:serviceaccount:{NAMESPACE}:gated-router"
    try:
        wait_for(
            "the router's RoleBinding",
            lambda: (
                operator.kubectl(
                    "get", "rolebinding", "gated-router-config-reader", "-n", NAMESPACE, check=False
                ).returncode
                == 0
            ),
            timeout=60,
        )
        assert can(operator, router, "get", "configmaps/gated-router", "-n", NAMESPACE)
        for request in (
            ("list", "configmaps", "-n", NAMESPACE),
            ("get", "secrets", "-n", NAMESPACE),
            ("get", "configmaps", "-n", "kube-system"),
            ("create", "configmaps", "-n", NAMESPACE),
            ("get", "pods", "-n", NAMESPACE),
        ):
            assert not can(operator, router, *request), request
        assert get(operator, "rolebinding", "gated-router-config-reader", "-n", NAMESPACE)["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": ROUTER_CLUSTER_ROLE,
        }
        assert not get(operator, "roles", "-n", NAMESPACE)["items"]  # the operator made none
    finally:
        operator.kubectl("delete", "infsvc", "gated", "-n", NAMESPACE, "--wait=true", check=False)


def test_a_host_path_outside_the_allowed_directories_is_refused_and_rolls_no_pods(operator: Any) -> None:
    # The release allows the demo's model directory only (security.allowedHostPaths, e2e_support.py).
    apply(operator, manifest("nodefs", model__source={"hostPath": {"path": "/etc"}}))
    try:

        def refused() -> dict[str, Any]:
            ready = condition(get(operator, "infsvc", "nodefs", "-n", NAMESPACE), "Ready")
            return ready if ready.get("reason") == "NotAllowedBySettings" else {}

        ready = wait_for("nodefs to be refused", refused, timeout=60)
        assert ready["status"] == "False" and "security.allowedHostPaths" in ready["message"]
        assert not any(owned(operator, kind, "nodefs") for kind in ("deployments", "pods", "services"))
    finally:
        operator.kubectl("delete", "infsvc", "nodefs", "-n", NAMESPACE, "--wait=true", check=False)


def test_services_named_like_yaml_keywords_reconcile_and_answer(operator: Any) -> None:
    # `on` would render as true and `null` as None in unquoted YAML; `null` also runs the router's
    # templates (Canary), whose RBAC names the service too.
    names = {
        "on": {},
        "null": {"rollout__strategy": "Canary", "rollout__steps": [{"weight": 50, "pause": "1m"}]},
    }
    for name, changes in names.items():
        apply(operator, manifest(name, scaling__maxReplicas=1, **changes))
    try:
        for name in names:
            operator.kubectl(
                "wait", "--for=condition=Ready", f"infsvc/{name}", "-n", NAMESPACE, "--timeout=240s"
            )
            assert [s["metadata"]["name"] for s in owned(operator, "services", name)] == [name]
            assert [p["metadata"]["name"] for p in owned(operator, "pdb", name)] == [name]
            _, answer = chat(service_urls(operator, NAMESPACE, name), "tiny", "Hi")
            assert answer["choices"][0]["message"]["role"] == "assistant"
        binding = get(operator, "rolebinding", "null-router-config-reader", "-n", NAMESPACE)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "null-router", "namespace": NAMESPACE}
        ]
    finally:
        operator.kubectl(
            "delete", "infsvc", *names, "-n", NAMESPACE, "--wait=true", "--timeout=60s", check=False
        )


def test_deleting_the_inference_service_removes_what_it_owned(operator: Any, tiny: dict[str, Any]) -> None:
    operator.kubectl("delete", "infsvc", "tiny", "-n", NAMESPACE, "--wait=true", "--timeout=60s")
    wait_for(
        "owned objects to be garbage-collected",
        lambda: not any(owned(operator, kind, "tiny") for kind in ("deployments", "services", "pdb", "pods")),
        timeout=90,
    )
