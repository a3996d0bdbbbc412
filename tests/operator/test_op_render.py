"""Rendering: what the cluster receives for an InferenceService."""

from __future__ import annotations

from op_fixtures import OWNER, example, spec_of

from kubeinfer_operator.names import LABEL_ISVC, LABEL_REVISION, LABEL_TRACK
from kubeinfer_operator.render import (
    render_deployment,
    render_pdb,
    render_pod_template,
    render_service,
)
from kubeinfer_operator.settings import Settings

SETTINGS = Settings(runtime_image="registry.example/kubeinfer-runtime:1.2.3")


def _container(pod: dict) -> dict:
    (container,) = pod["spec"]["containers"]
    return container


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_tiny_example_runs_the_builtin_runtime_on_cpu_with_the_spec_limits() -> None:
    pod = render_pod_template(OWNER, spec_of(example("tiny-cpu.yaml")), SETTINGS).template
    container = _container(pod)
    assert container["image"] == "registry.example/kubeinfer-runtime:1.2.3"
    assert container["command"] == ["kubeinfer-runtime", "serve"]
    args = container["args"]
    assert _flag(args, "--model") == "/mnt/model"
    assert _flag(args, "--served-model-name") == "tiny"
    assert _flag(args, "--port") == "8000"
    assert _flag(args, "--max-num-seqs") == "8"
    assert _flag(args, "--max-model-len") == "512"
    assert _flag(args, "--kv-cache-tokens") == "4096"
    assert _flag(args, "--device") == "cpu"
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    model = next(v for v in pod["spec"]["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "tiny-model", "readOnly": True}
    assert {"name": "model", "mountPath": "/mnt/model", "readOnly": True} in container["volumeMounts"]


def test_builtin_runtime_reads_its_revision_label_for_traces_and_vllm_does_not_get_it() -> None:
    template = render_pod_template(OWNER, spec_of(example("tiny-cpu.yaml")), SETTINGS)
    env = _container(template.template)["env"]
    revision = next(e for e in env if e["name"] == "KUBEINFER_SERVING_REVISION")
    assert revision["valueFrom"] == {"fieldRef": {"fieldPath": f"metadata.labels['{LABEL_REVISION}']"}}
    deployment = render_deployment(OWNER, spec_of(example("tiny-cpu.yaml")), template, 1)
    # the label the downward API reads is on the pods the Deployment makes
    assert deployment["spec"]["template"]["metadata"]["labels"][LABEL_REVISION] == template.revision
    vllm = _container(render_pod_template(OWNER, spec_of(example("vllm.yaml")), SETTINGS).template)
    assert "KUBEINFER_SERVING_REVISION" not in {e["name"] for e in vllm["env"]}


def test_gpu_count_goes_to_limits_under_the_configured_resource_with_a_toleration() -> None:
    spec = spec_of(example("tiny-cpu.yaml"), resources={"gpus": 1, "gpuResource": "amd.com/gpu"})
    pod = render_pod_template(OWNER, spec, SETTINGS).template
    assert _container(pod)["resources"]["limits"]["amd.com/gpu"] == "1"
    assert "--device" not in _container(pod)["args"]
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_node_selector_and_user_tolerations_are_passed_through() -> None:
    manifest = example("llama-8b-gpu.yaml")
    pod = render_pod_template(OWNER, spec_of(manifest), SETTINGS).template
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    # the user's own nvidia.com/gpu toleration is not duplicated
    assert pod["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert _container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert _flag(_container(pod)["args"], "--model") == "/mnt/model/llama-3.1-8b-instruct"


def test_pod_is_locked_down() -> None:
    pod = render_pod_template(OWNER, spec_of(example("tiny-cpu.yaml")), SETTINGS).template
    pod_security = pod["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    security = _container(pod)["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["spec"]["automountServiceAccountToken"] is False
    mounts = {m["mountPath"]: m["name"] for m in _container(pod)["volumeMounts"]}
    assert mounts["/tmp"] == "scratch"  # writable scratch beside the read-only root
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == mounts["/dev/shm"])
    assert shm["emptyDir"]["medium"] == "Memory"


def test_probes_give_the_model_its_startup_timeout_and_streams_their_drain_time() -> None:
    spec = spec_of(example("tiny-cpu.yaml"), startupTimeout="20m")
    pod = render_pod_template(OWNER, spec, SETTINGS).template
    container = _container(pod)
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/ready"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    # slo.e2e.p95 is 30s: a request at the bound gets twice that to finish after SIGTERM
    drain = int(_flag(container["args"], "--drain-timeout"))
    assert drain == 60
    assert (
        pod["spec"]["terminationGracePeriodSeconds"]
        > drain + container["lifecycle"]["preStop"]["sleep"]["seconds"]
    )


def test_pods_carry_identity_labels_and_scrape_annotations() -> None:
    spec = spec_of(example("tiny-cpu.yaml"))
    pod = render_pod_template(OWNER, spec, SETTINGS)
    deployment = render_deployment(OWNER, spec, pod, replicas=2, track="canary")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "kubeinfer-runtime"
    assert labels[LABEL_ISVC] == "tiny"
    assert labels[LABEL_REVISION] == pod.revision
    assert labels[LABEL_TRACK] == "canary"
    assert deployment["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    assert deployment["metadata"]["name"] == f"tiny-{pod.revision}"
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"]["matchLabels"] == {LABEL_ISVC: "tiny", LABEL_REVISION: pod.revision}


def test_vllm_pod_serves_the_spec_through_vllm_flags() -> None:
    manifest = example("vllm.yaml")
    pod = render_pod_template(OWNER, spec_of(manifest), SETTINGS)
    container = _container(pod.template)
    assert container["image"] == "vllm/vllm-openai:v0.11.0"
    assert container["command"] == ["vllm", "serve"]
    args = container["args"]
    assert args[0] == "Qwen/Qwen2.5-32B-Instruct"
    assert _flag(args, "--revision") == "5ede1c97bbab6ce5cda5812749b4c0bdf79b18dd"
    assert _flag(args, "--served-model-name") == "Qwen/Qwen2.5-32B-Instruct"
    assert _flag(args, "--max-model-len") == "32768"
    assert _flag(args, "--max-num-seqs") == "64"
    assert _flag(args, "--gpu-memory-utilization") == "0.92"
    assert _flag(args, "--tensor-parallel-size") == "2"
    assert "--enable-prefix-caching" in args
    assert args[-3:] == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
    } in container["env"]
    # vLLM listens only once loaded: every probe asks /health
    assert {container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {
        "/health"
    }
    assert pod.template["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod.template["metadata"]["labels"][LABEL_ISVC] == "tiny"
    assert not any(v["name"] == "model" for v in pod.template["spec"]["volumes"])  # vLLM downloads


def test_kv_cache_tokens_become_whole_vllm_blocks() -> None:
    manifest = example("vllm.yaml")
    spec = spec_of(manifest, kvCacheFraction=None, kvCacheTokens=100000)
    args = _container(render_pod_template(OWNER, spec, SETTINGS).template)["args"]
    assert _flag(args, "--num-gpu-blocks-override") == "6250"


def test_fault_injection_reaches_the_runtime_flags() -> None:
    spec = spec_of(
        example("tiny-cpu.yaml"), faults={"tokenLatency": "150ms", "errorRate": 0.2, "failLoad": True}
    )
    args = _container(render_pod_template(OWNER, spec, SETTINGS).template)["args"]
    assert _flag(args, "--fault-token-latency-ms") == "150"
    assert _flag(args, "--fault-error-rate") == "0.2"
    assert "--fault-fail-load" in args


def test_revision_is_stable_and_changes_exactly_when_the_pod_does() -> None:
    manifest = example("tiny-cpu.yaml")
    first = render_pod_template(OWNER, spec_of(manifest), SETTINGS).revision
    assert render_pod_template(OWNER, spec_of(manifest), SETTINGS).revision == first
    assert len(first) == 10 and all(c in "0123456789abcdef" for c in first)
    assert render_pod_template(OWNER, spec_of(manifest, maxNumSeqs=4), SETTINGS).revision != first
    assert render_pod_template(OWNER, spec_of(manifest, image="other:1"), SETTINGS).revision != first
    # scaling and SLO do not change the pod: no new revision, no restart
    scaled = {**manifest, "spec": {**manifest["spec"], "scaling": {"minReplicas": 2, "maxReplicas": 5}}}
    assert render_pod_template(OWNER, spec_of(scaled), SETTINGS).revision == first


def test_a_new_model_revision_is_a_new_revision_for_every_source_type() -> None:
    manifest = example("tiny-cpu.yaml")
    sources = {
        "hostPath": {"hostPath": {"path": "/models/tiny"}},
        "pvc": {"pvc": {"claimName": "models", "path": "tiny"}},
        "uri": {"uri": "hf://org/tiny"},
    }
    for kind, source in sources.items():
        revisions = []
        for model_revision in (None, "v1", "v2"):
            model = {**manifest["spec"]["model"], "source": source}
            if model_revision:
                model["revision"] = model_revision
            runtime = {**manifest["spec"]["runtime"]}
            if kind == "uri":  # the builtin engine reads local files only
                runtime |= {"engine": "vllm", "image": "vllm/vllm-openai:v0.11.0"}
            obj = {**manifest, "spec": {**manifest["spec"], "model": model, "runtime": runtime}}
            pod = render_pod_template(OWNER, spec_of(obj), SETTINGS)
            revisions.append(pod.revision)
            annotation = pod.template["metadata"]["annotations"].get("serving.kubeinfer.dev/model-revision")
            assert annotation == model_revision, kind
        assert len(set(revisions)) == 3, f"{kind}: {revisions}"


def test_owned_objects_point_at_their_inference_service() -> None:
    spec = spec_of(example("tiny-cpu.yaml"))
    objects = [
        render_deployment(OWNER, spec, render_pod_template(OWNER, spec, SETTINGS), 1),
        render_service(OWNER),
        render_pdb(OWNER),
    ]
    for obj in objects:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == OWNER.uid and ref["kind"] == "InferenceService" and ref["controller"] is True
        assert obj["metadata"]["namespace"] == "default"
    service, pdb = objects[1], objects[2]
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "kubeinfer-runtime", LABEL_ISVC: "tiny"}
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
