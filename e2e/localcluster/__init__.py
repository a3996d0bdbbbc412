"""kubeinfer's local Kubernetes cluster: real etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kube-proxy (built from source by e2e/build_binaries.sh), a process kubelet that runs
pods as local processes in their own network namespaces, and Prometheus from Debian's package.

Command line (run as root, with PYTHONPATH=e2e):
    python -m localcluster up       # start (or reuse) the cluster; prints the kubeconfig path
    python -m localcluster down     # stop every process it started, remove its network
    python -m localcluster status   # exit 0 and print the endpoints when it is up

State lives in $KUBEINFER_CLUSTER_DIR (default <repo>/.cluster): state.json, kubeconfig, pki/,
logs/<component>.log, kubelet/pods/<ns>_<pod>_<uid>/logs/<container>/<restart>.log.
Knobs: KUBEINFER_NODES (2), KUBEINFER_NODE_CAPACITY (JSON merged into the default capacity
{"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "2", "ephemeral-storage": "100Gi"}),
KUBEINFER_IMAGE_ENTRYPOINTS (JSON {"image-repo": ["argv", ...]} for containers without a command).

Tests: the root conftest.py provides the session-scoped `cluster` fixture (mark such tests
`@pytest.mark.cluster`).  It reuses a cluster that is already up (and leaves it up), or starts one on
first use and takes it down at the end of the session, also when the session is interrupted or killed.
It sets os.environ["KUBECONFIG"] for the session, so kubectl, helm and an operator started as a
subprocess find the cluster.  The fixture is a `localcluster.cluster.Cluster`:

    cluster.kubeconfig       path of an admin kubeconfig (system:masters)
    cluster.server           apiserver URL, https://10.244.0.1:<port>
    cluster.prometheus_url   http://10.244.0.1:<port>; scrapes pods annotated prometheus.io/scrape="true"
                             every 2 s, with target labels namespace, pod, inferenceservice, revision, track
    cluster.bin_dir          the directory of the Kubernetes binaries; cluster.helm_path its helm
    cluster.node_names       ["kubeinfer-node-1", "kubeinfer-node-2"]
    cluster.kubectl(*args, check=True, input=None) -> subprocess.CompletedProcess[str]
                             (raises AssertionError with stderr when check and it fails)
    cluster.api_client()     -> kubernetes.client.ApiClient for the admin kubeconfig
    cluster.stop_prometheus() / cluster.start_prometheus()   same port, same data; start waits for ready
    cluster.pod_log(namespace, pod, container=None) -> str   the container's current log ("" if none)

Pods: images are ignored; each container runs its `command` + `args` (required) as a local process with
the harness's PATH (unless the pod sets PATH), in the pod's network namespace (its own IP on the bridge,
reachable from the host and every pod), with its volumes bind-mounted at their mountPaths and Services
resolvable by name through the pod's /etc/hosts.  See e2e/README.md for what the kubelet does and not.
"""

from .cluster import Cluster, down, handle, up

__all__ = ["Cluster", "down", "handle", "up"]
