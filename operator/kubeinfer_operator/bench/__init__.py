"""`kubeinfer bench`: a load generator for OpenAI-compatible servers, measured against an SLO.

workload (what to send, when) -> client (send one request, time it) -> runner (one load point,
a sweep, the knee) -> stats (percentiles, goodput) -> report / plots. `slo` reads the SLO from
flags or an InferenceService manifest; `synthetic_server` is a server whose latencies are set
by flags, for tests and demos.
"""
