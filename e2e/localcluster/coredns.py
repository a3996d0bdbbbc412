"""Cluster DNS: CoreDNS as a Deployment behind the `kube-dns` Service, as kubeadm installs it, from the
locally built image (images/build.sh coredns).  It answers for cluster.local only: pods reach nothing
beyond the cluster, so there is no upstream to forward to.  It listens on 1053 so that it needs no
capability; the Service maps port 53 to it."""

from __future__ import annotations

from typing import Any

DNS_PORT = 1053
COREFILE = f""".:{DNS_PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
    loop
    loadbalance
}}
"""


def manifests(image: str, cluster_ip: str) -> list[dict[str, Any]]:
    labels = {"k8s-app": "kube-dns"}
    meta = {"namespace": "kube-system"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", **meta},
            "data": {"Corefile": COREFILE},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", "labels": labels, **meta},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "priorityClassName": "system-cluster-critical",
                        "dnsPolicy": "Default",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": DNS_PORT, "protocol": "TCP"},
                                ],
                                "resources": {
                                    "requests": {"cpu": "10m", "memory": "32Mi"},
                                    "limits": {"memory": "128Mi"},
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 2,
                                },
                                "livenessProbe": {
                                    "httpGet": {"path": "/health", "port": 8080},
                                    "periodSeconds": 10,
                                },
                                "volumeMounts": [
                                    {"name": "config", "mountPath": "/etc/coredns", "readOnly": True}
                                ],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "labels": labels, **meta},
            "spec": {
                "clusterIP": cluster_ip,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": DNS_PORT, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": DNS_PORT, "protocol": "TCP"},
                ],
            },
        },
    ]
