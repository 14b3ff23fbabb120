"""The network: configuration presets, layers, attention with a KV cache, and the architectures."""
