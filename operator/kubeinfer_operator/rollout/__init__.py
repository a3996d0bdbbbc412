"""Progressive delivery for InferenceServices: the canary state machine, its analysis and capacity hand-off,
as pure functions the operator calls on each reconcile tick."""
