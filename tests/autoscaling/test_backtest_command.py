"""`kubeinfer backtest`: a trace file or a service's Prometheus history, replayed with a chosen config."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_api_client import PrometheusConnect

from kubeinfer_operator import cli
from kubeinfer_operator.autoscaling import backtest_command

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"
Answer = Callable[[str], tuple[int, list[dict]]]  # as the prometheus fixture (conftest.py) takes it


def profile(path: Path, points: list[tuple[float, float]]) -> Path:
    path.write_text("time_s,rps\n" + "".join(f"{t},{r}\n" for t, r in points))
    return path


def manifest(path: Path, **scaling: Any) -> Path:
    obj = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    obj["spec"]["scaling"] = {"minReplicas": 1, "maxReplicas": 40, **scaling}
    obj["spec"]["runtime"]["maxNumSeqs"] = 16
    obj["spec"].pop("slo", None)
    path.write_text(yaml.safe_dump(obj))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, dict[str, float]]:
    assert cli.main(["backtest", *argv, "--json"]) == 0
    return {row["policy"]: row for row in json.loads(capsys.readouterr().out)["rows"]}


def test_a_trace_file_is_replayed_beside_the_reactive_bound_and_the_oracle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = profile(tmp_path / "step.csv", [(0, 10), (299, 10), (300, 20), (600, 20)])  # doubles at 300 s
    assert cli.main(["backtest", "--trace", str(trace)]) == 0
    table = capsys.readouterr().out
    assert "TTFT target 1 s, model load 60 s" in table
    assert [line.split()[0] for line in table.splitlines()[2:]] == ["config", "reactive", "oracle"]
    rows = run_json(capsys, "--trace", str(trace))
    assert rows["oracle"]["attainment"] >= 0.99 and rows["oracle"]["vs_oracle"] == 1
    assert rows["config"]["scale_events"] >= 1  # the load doubled: the config scaled up
    assert all(0 < r["attainment"] <= 1 and r["replica_s"] > 0 for r in rows.values())


def test_the_chosen_config_is_what_is_replayed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ramp = profile(tmp_path / "ramp.csv", [(0, 5), (300, 5), (900, 26), (1200, 26)])
    plain = run_json(capsys, "--trace", str(ramp), "-f", str(manifest(tmp_path / "a.yaml")))
    # What requestsPerReplica a replica carries here: ~2.25 req/s (85% of full batch, this engine on CPU).
    floored = manifest(tmp_path / "b.yaml", requestsPerReplica=2.25, predictive={})
    predictive = run_json(capsys, "--trace", str(ramp), "-f", str(floored))
    assert predictive["config"]["attainment"] > plain["config"]["attainment"]
    capped = run_json(capsys, "--trace", str(ramp), "-f", str(manifest(tmp_path / "c.yaml", maxReplicas=2)))
    assert capped["config"]["replica_s"] <= 2 * 1200 + 1
    assert capped["config"]["attainment"] < 0.5 < capped["oracle"]["attainment"]


def test_a_request_trace_keeps_its_request_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = "".join(f"{i * 0.1:.2f},100,{50 if i < 3000 else 400}\n" for i in range(6000))  # 10 req/s
    trace = tmp_path / "requests.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    result = run_json(capsys, "--trace", str(trace))
    # Outputs eight times longer halfway through: the same arrivals need more replicas.
    assert result["config"]["scale_events"] >= 1 and result["oracle"]["attainment"] >= 0.99


def test_a_service_history_is_read_from_prometheus(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    prometheus: Callable[[Answer], PrometheusConnect],
) -> None:
    asked: list[str] = []
    until = 1_700_003_600.0

    def answer(query: str) -> tuple[int, list[dict]]:
        asked.append(query)
        values = [[until - 900 + 30 * i, "12" if i < 15 else "24"] for i in range(31)]
        return 200, [{"metric": {}, "values": values}]

    url = prometheus(answer).url
    argv = ["--prometheus", url, "--namespace", "team-a", "--name", "chat", "--since", "15m"]
    rows = run_json(capsys, *argv, "--until", str(until))
    assert asked and 'namespace="team-a",inferenceservice="chat"' in asked[0]
    assert rows["config"]["scale_events"] >= 1 and rows["oracle"]["replica_s"] > 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("when,how_many\n1,2\n", "want columns time_s,rps or arrival_s"),
        ("time_s,rps\n0,5\n", "time_s must increase"),
        ("time_s,rps\n0,5\n60,-1\n", "rps must be >= 0"),
        ("time_s,rps\n0,five\n60,5\n", "could not convert"),
        ("", "no rows"),
    ],
)
def test_a_bad_trace_is_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(content)
    assert backtest_command.main(["--trace", str(trace)]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_file_and_a_missing_name_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert backtest_command.main(["--trace", str(tmp_path / "none.csv")]) == 2
    assert "No such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        backtest_command.main(["--prometheus", "http://127.0.0.1:1"])
    assert "--prometheus needs --name" in capsys.readouterr().err


def test_the_cli_lists_backtest(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "backtest" in capsys.readouterr().out
