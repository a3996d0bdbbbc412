"""`kubeinfer alerts -f MANIFEST`: the SLO's recording rules and burn-rate alerts (slo_alerts.py) for an
InferenceService manifest, as a Prometheus rule file (for a Prometheus without the Operator, or for
`promtool check rules`) or as the PrometheusRule the operator writes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from kubeinfer_operator.api.resource import InvalidManifest, parse_manifest
from kubeinfer_operator.slo_alerts import render_prometheus_rule, rule_groups


class _RuleDumper(yaml.SafeDumper):
    """Rule files as people write them: multi-line PromQL as | blocks, no &anchors for shared labels."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_RuleDumper.add_representer(str, _str)


def dump(data: object) -> str:
    return yaml.dump(data, Dumper=_RuleDumper, sort_keys=False, width=200)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubeinfer alerts", description="Prometheus rules (recording + burn-rate alerts) from spec.slo."
    )
    parser.add_argument("-f", "--filename", required=True, type=Path, help="InferenceService manifest")
    parser.add_argument(
        "-n", "--namespace", help="namespace the service runs in (default: the manifest's, else default)"
    )
    parser.add_argument(
        "--output",
        choices=("rules", "prometheusrule"),
        default="rules",
        help="rules: a file for prometheus.yml rule_files; prometheusrule: a monitoring.coreos.com/v1 object",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        manifest = yaml.safe_load(args.filename.read_text())
        isvc = parse_manifest(manifest)
    except (OSError, yaml.YAMLError, InvalidManifest) as error:
        print(f"kubeinfer alerts: {args.filename}: {error}", file=sys.stderr)
        return 2
    meta = manifest.get("metadata") or {}
    name = meta.get("name")
    if not name:
        print(f"kubeinfer alerts: {args.filename}: metadata.name is missing", file=sys.stderr)
        return 2
    namespace = args.namespace or meta.get("namespace") or "default"
    if args.output == "rules":
        groups = rule_groups(namespace, name, isvc.spec)
        if not groups:
            print(f"kubeinfer alerts: engine {isvc.spec.runtime.engine}: no SLO rules", file=sys.stderr)
            return 1
        print(dump({"groups": groups}), end="")
        return 0
    owner = {"apiVersion": manifest.get("apiVersion"), "kind": "InferenceService", "name": name, "uid": "-"}
    rule = render_prometheus_rule(namespace, name, isvc.spec, owner)
    if rule is None:
        print(f"kubeinfer alerts: engine {isvc.spec.runtime.engine}: no SLO rules", file=sys.stderr)
        return 1
    rule["metadata"].pop("ownerReferences")  # the operator sets it to the live object's uid
    print(dump(rule), end="")
    return 0
