"""Clients the field already uses, against a live server on the tiny model: lm-eval's
local-completions model (a loglikelihood task and a generate task over local JSONL files, since no
dataset hub is reachable) and GuideLLM profiling the server. The scores are noise on random
weights; what counts is that every request of theirs is answered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from runtime_server_process import SERVED_MODEL, LiveServer, running_server

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
CHOICE_DOCS = [
    {"question": "The sky on a clear day is", "choices": [" blue", " green", " loud"], "answer": 0},
    {"question": "Bread is baked in an", "choices": [" oven", " ocean"], "answer": 0},
    {"question": "Trains run on", "choices": [" rails", " clouds", " soup"], "answer": 0},
    {"question": "At night the library is", "choices": [" closed", " open"], "answer": 0},
]
ANSWER_DOCS = [
    {"question": "Q: What do bakers bake?\nA:", "answer": "bread"},
    {"question": "Q: Where do trains stop?\nA:", "answer": "stations"},
    {"question": "Q: What opens at nine?\nA:", "answer": "the library"},
]
TASKS = {
    "kubeinfer_choice": {
        "output_type": "multiple_choice",
        "doc_to_text": "{{question}}",
        "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{answer}}",
        "metric_list": [{"metric": "acc"}],
    },
    "kubeinfer_answer": {
        "output_type": "generate_until",
        "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 12, "do_sample": False},
        "metric_list": [{"metric": "exact_match"}],
    },
}


@pytest.fixture(scope="module")
def server(tiny_model: Path, server_logs: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model, server_logs, "--max-model-len", "512") as live:
        yield live


def write_tasks(directory: Path) -> None:
    for name, docs in (("kubeinfer_choice", CHOICE_DOCS), ("kubeinfer_answer", ANSWER_DOCS)):
        data = directory / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        # lm-eval reads YAML; JSON is YAML.
        task = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}}}
        task |= {"test_split": "test", **TASKS[name]}
        (directory / f"{name}.yaml").write_text(json.dumps(task, indent=2))


def outcomes(server: LiveServer) -> dict[str, float]:
    return {
        dict(labels)["outcome"]: value
        for (name, labels), value in server.metrics().items()
        if name == "kubeinfer_requests_total"
    }


def test_lm_eval_local_completions_runs_a_loglikelihood_and_a_generate_task(
    server: LiveServer, tiny_model: Path, tmp_path: Path
) -> None:
    write_tasks(tmp_path)
    before = outcomes(server)
    model_args = ",".join(
        [
            f"model={SERVED_MODEL}",
            f"base_url={server.base_url}/v1/completions",
            f"tokenizer={tiny_model}",
            "num_concurrent=2",
            "max_retries=1",
            "tokenized_requests=True",
        ]
    )
    command = [str(BIN / "lm_eval"), "--model", "local-completions", "--model_args", model_args]
    command += ["--tasks", "kubeinfer_choice,kubeinfer_answer", "--include_path", str(tmp_path)]
    command += ["--output_path", str(tmp_path / "out"), "--seed", "0"]
    run = subprocess.run(command, env=OFFLINE, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (results_file,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    assert 0 <= results["kubeinfer_choice"]["acc,none"] <= 1
    assert 0 <= results["kubeinfer_answer"]["exact_match,none"] <= 1
    after = outcomes(server)
    requests = sum(len(d["choices"]) for d in CHOICE_DOCS) + len(ANSWER_DOCS)
    assert after.get("success", 0) - before.get("success", 0) == requests
    for outcome in ("error", "rejected", "cancelled", "timeout"):
        assert after.get(outcome, 0) == before.get(outcome, 0), outcome


def test_guidellm_profiles_the_server_without_errors(
    server: LiveServer, tiny_model: Path, tmp_path: Path
) -> None:
    before = outcomes(server)
    report = tmp_path / "guidellm.json"
    command = [str(BIN / "guidellm"), "run"]
    command += ["--backend", f"kind=openai_http,target={server.base_url},model={SERVED_MODEL}"]
    command += ["--profile", "kind=concurrent,streams=4", "--constraint", "kind=max_requests,count=24"]
    command += ["--data", "kind=synthetic_text,prompt_tokens=48,output_tokens=12"]
    command += ["--tokenizer", f"kind=huggingface_auto,model={tiny_model}"]
    command += ["--output", f"kind=json,path={report}", "--disable-console-interactive"]
    run = subprocess.run(command, env=OFFLINE, capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    assert totals["successful"] == 24 and totals["errored"] == 0 and totals["incomplete"] == 0
    after = outcomes(server)
    assert after.get("success", 0) - before.get("success", 0) >= 24
    assert after.get("error", 0) == before.get("error", 0)
