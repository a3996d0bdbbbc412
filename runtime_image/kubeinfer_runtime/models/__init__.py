"""Model definitions the engine can run, and the loader that fills them from safetensors files."""
