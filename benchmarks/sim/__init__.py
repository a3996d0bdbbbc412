"""The autoscaling simulation behind benchmarks/autoscaling_sim.py: workload traces, replicas, autoscalers."""
