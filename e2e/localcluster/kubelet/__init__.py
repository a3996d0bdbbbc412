"""The process kubelet: registers Nodes, keeps their Leases fresh and runs the pods bound to them as local
processes, each pod in its own network, mount and UTS namespaces.  Run as
`python -m localcluster.kubelet CONFIG.json` (the cluster's `up` does this)."""
