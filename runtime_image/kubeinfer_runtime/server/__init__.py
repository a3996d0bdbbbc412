"""The runtime's OpenAI-compatible HTTP server around the engine (`kubeinfer-runtime serve`)."""
