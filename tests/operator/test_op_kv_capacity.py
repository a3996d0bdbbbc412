"""KV-cache capacity: numbers a user can check against the model card."""

from __future__ import annotations

from op_fixtures import example, spec_of

from kubeinfer_operator.kv_capacity import check, device_memory, model_shape


def test_llama_8b_on_h100_reports_bytes_per_token_and_the_batch_that_fits() -> None:
    spec = spec_of(example("llama-8b-gpu.yaml"))
    shape, device = model_shape(spec), device_memory(spec)
    assert shape is not None and device is not None
    capacity, condition = check(spec, shape, device)
    # 2 x 32 layers x 8 KV heads x 128 head dim x 2 bytes
    assert capacity["bytesPerToken"] == 131072
    assert capacity["tokensNeeded"] == 128 * 8192
    assert 400_000 < capacity["tokensFit"] < 500_000
    assert condition.status == "False" and condition.reason == "FullBatchDoesNotFit"
    assert "131072 B/token" in condition.message and str(capacity["tokensFit"]) in condition.message
    assert f"maxNumSeqs to {capacity['tokensFit'] // 8192}" in condition.message


def test_a_batch_within_the_budget_fits() -> None:
    spec = spec_of(example("llama-8b-gpu.yaml"), maxNumSeqs=32)
    capacity, condition = check(spec, model_shape(spec), device_memory(spec))
    assert condition.status == "True" and capacity["tokensNeeded"] == 32 * 8192


def test_kv_tokens_beyond_device_memory_are_refused_with_numbers() -> None:
    spec = spec_of(example("llama-8b-gpu.yaml"), kvCacheFraction=None, kvCacheTokens=2_000_000)
    capacity, condition = check(spec, model_shape(spec), device_memory(spec))
    assert condition.reason == "ExceedsDeviceMemory" and "2000000" in condition.message
    assert capacity["tokensFit"] == 2_000_000


def test_a_sequence_longer_than_the_cache_does_not_fit() -> None:
    manifest = example("llama-8b-gpu.yaml")
    manifest["spec"]["model"]["maxModelLen"] = 131072
    spec = spec_of(manifest, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-L4"})
    capacity, condition = check(spec, model_shape(spec), device_memory(spec))
    assert condition.status == "False" and condition.reason == "SequenceDoesNotFit"
    assert capacity["tokensFit"] < 131072
    assert "131072" in condition.message and str(capacity["tokensFit"]) in condition.message


def test_unknown_shape_and_device_is_unknown_not_a_guess() -> None:
    spec = spec_of(example("vllm.yaml"))
    capacity, condition = check(spec, model_shape(spec), None)
    assert condition.status == "Unknown"
    assert capacity == {"bytesPerToken": 262144, "tokensNeeded": 64 * 32768}
