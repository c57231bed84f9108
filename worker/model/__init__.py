"""The model: Qwen3 (worker.layers' TP-aware layers, worker.kernels' Triton kernels), its config from
config.json and generation_config.json, and the safetensors loader."""
