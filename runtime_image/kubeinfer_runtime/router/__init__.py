"""The router: splits an InferenceService's traffic between its stable and canary tracks; imports no torch."""
