"""The administrator's say over host paths and images (chart values security.*): the decision, and what
a reconcile of a refused InferenceService does (nothing, said in its conditions)."""

from __future__ import annotations

import pytest
from op_fixtures import OWNER, example, isvc, spec_of
from test_op_cache import FakeAPI

from kubeinfer_operator.conditions import find
from kubeinfer_operator.names import LABEL_APP, LABEL_ISVC, LABEL_REVISION
from kubeinfer_operator.reconcile import observe_and_plan
from kubeinfer_operator.serving_policy import host_path_allowed, image_allowed, refusals
from kubeinfer_operator.settings import Settings, load_settings

MODELS = "/var/lib/kubeinfer/models"


def host_path_manifest() -> dict:
    """examples/tiny-cpu.yaml with its model on the node's disk instead of a claim."""
    manifest = example("tiny-cpu.yaml")
    manifest["spec"]["model"]["source"] = {"hostPath": {"path": f"{MODELS}/tiny"}}
    return manifest


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        (MODELS, True),
        (f"{MODELS}/tiny", True),
        (f"{MODELS}/tiny/", True),
        (f"{MODELS}//tiny", True),
        (f"{MODELS}-evil/tiny", False),  # a sibling sharing the prefix's characters, not its directory
        (f"{MODELS}/../../../../etc", False),  # resolves to /etc, as the kernel resolves it
        (f"{MODELS}/./tiny/../../models/tiny", True),
        ("//etc", False),
        ("/var/lib", False),  # a parent of the allowed directory
        ("/", False),
    ],
)
def test_a_host_path_is_allowed_only_at_or_under_an_allowed_directory(path: str, allowed: bool) -> None:
    assert host_path_allowed(path, (f"{MODELS}/",)) is allowed


def test_no_allowed_host_paths_allows_none_and_root_allows_all() -> None:
    assert not host_path_allowed(f"{MODELS}/tiny", ())
    assert host_path_allowed("/etc", ("/",))


@pytest.mark.parametrize(
    ("image", "prefix", "allowed"),
    [
        ("registry.corp/ml/vllm:0.6", "registry.corp", True),
        ("registry.corp:5000/ml/vllm:0.6", "registry.corp", True),
        ("registry.corp.evil.example/ml/vllm:0.6", "registry.corp", False),
        ("registry.corp/ml/vllm:0.6", "registry.corp/ml/", True),
        ("registry.corp/mlx/vllm:0.6", "registry.corp/ml/", False),
        ("registry.corp/ml/vllm@sha256:" + "a" * 64, "registry.corp/ml/vllm", True),
        ("registry.corp/ml/vllm-evil:1", "registry.corp/ml/vllm", False),
        ("registry.corp/ml/vllm", "registry.corp/ml/vllm", True),
        ("docker.io/library/python:3", "registry.corp", False),
    ],
)
def test_an_image_must_start_with_a_prefix_ending_at_a_component(
    image: str, prefix: str, allowed: bool
) -> None:
    assert image_allowed(image, (prefix,)) is allowed


def test_no_image_prefixes_allow_any_image() -> None:
    assert image_allowed("anything.example/at/all:latest", ())


def test_the_refusals_name_the_field_and_the_chart_value() -> None:
    spec = spec_of(host_path_manifest(), image="docker.io/attacker/miner:1")
    (host_path, image) = refusals(spec, Settings(allowed_image_prefixes=("registry.corp/",)))
    assert (host_path.field, host_path.setting) == (
        "spec.model.source.hostPath.path",
        "security.allowedHostPaths",
    )
    assert "/var/lib/kubeinfer/models/tiny" in host_path.message and "none" in host_path.message
    assert (image.field, image.setting) == ("spec.runtime.image", "security.allowedImagePrefixes")
    assert "registry.corp/" in image.message
    allowed = Settings(allowed_host_paths=(MODELS,), allowed_image_prefixes=("docker.io/attacker",))
    assert refusals(spec, allowed) == []


def test_an_unset_image_runs_the_operators_own_whatever_the_prefixes() -> None:
    spec = spec_of(example("tiny-cpu.yaml"))
    assert (
        refusals(spec, Settings(allowed_host_paths=(MODELS,), allowed_image_prefixes=("registry.corp/",)))
        == []
    )


def _plan(settings: Settings, api: FakeAPI | None = None):
    return observe_and_plan(api or FakeAPI(), settings, isvc(host_path_manifest()))


def test_a_refused_host_path_rolls_no_pods_and_says_which_setting() -> None:
    refused = _plan(Settings())
    assert refused.apply == () and refused.retire == () and refused.scale == () and refused.prune == ()
    ready, degraded = (
        find(refused.status["conditions"], "Ready"),
        find(refused.status["conditions"], "Degraded"),
    )
    assert (ready["status"], ready["reason"]) == ("False", "NotAllowedBySettings")
    assert (degraded["status"], degraded["reason"]) == ("True", "NotAllowedBySettings")
    assert "security.allowedHostPaths" in ready["message"]
    assert find(refused.status["conditions"], "Stalled")["status"] == "True"  # kstatus: someone must act
    assert {t.condition.reason for t in refused.transitions} >= {"NotAllowedBySettings"}

    allowed = _plan(Settings(allowed_host_paths=(MODELS,)))
    assert [o["kind"] for o in allowed.apply][:3] == ["Deployment", "Service", "PodDisruptionBudget"]


def test_a_refused_change_leaves_the_running_revision_alone() -> None:
    api = FakeAPI()
    running = {
        "kind": "Deployment",
        "metadata": {
            "name": "tiny-0123456789",
            "namespace": OWNER.namespace,
            "uid": "uid-old",
            "labels": {LABEL_ISVC: OWNER.name, LABEL_APP: "kubeinfer-runtime", LABEL_REVISION: "0123456789"},
            "ownerReferences": [OWNER.reference()],
        },
        "spec": {"replicas": 1},
        "status": {"replicas": 1, "readyReplicas": 1},
    }
    api.store[("Deployment", running["metadata"]["name"])] = running
    api.resync([OWNER.namespace])
    # Allowed, the new spec would roll out a revision beside the running one; refused, nothing moves.
    allowed = _plan(Settings(allowed_host_paths=(MODELS,)), api)
    assert (
        allowed.apply[0]["kind"] == "Deployment" and allowed.apply[0]["metadata"]["name"] != "tiny-0123456789"
    )
    assert allowed.status["replicas"] == 1  # the running revision is seen
    refused = _plan(Settings(), api)
    assert refused.apply == () and refused.retire == () and refused.prune == () and refused.scale == ()


def test_the_settings_come_from_the_charts_json_lists() -> None:
    env = {
        "KUBEINFER_ALLOWED_HOST_PATHS": '["/var/lib/kubeinfer/models"]',
        "KUBEINFER_ALLOWED_IMAGE_PREFIXES": '["registry.corp/ml/"]',
    }
    settings = load_settings(env)
    assert settings.allowed_host_paths == ("/var/lib/kubeinfer/models",)
    assert settings.allowed_image_prefixes == ("registry.corp/ml/",)
    assert load_settings({}).allowed_host_paths == () and load_settings({}).allowed_image_prefixes == ()
    with pytest.raises(ValueError, match=r"KUBEINFER_ALLOWED_HOST_PATHS.*absolute"):
        load_settings({"KUBEINFER_ALLOWED_HOST_PATHS": '["models"]'})
    with pytest.raises(ValueError, match="KUBEINFER_ALLOWED_IMAGE_PREFIXES"):
        load_settings({"KUBEINFER_ALLOWED_IMAGE_PREFIXES": '"registry.corp"'})
