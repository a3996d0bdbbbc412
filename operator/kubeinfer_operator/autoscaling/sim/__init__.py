"""The autoscaling simulation: workload traces, replicas behind a router, autoscalers. Run by
benchmarks/autoscaling_sim.py (the comparison tables) and `kubeinfer backtest` (one config on a trace)."""
