"""One engine step on the device: ModelRunner prepares the step's inputs, forwards the model (CUDA
graphs, decode lookahead) and samples; the KV cache and the sampler live here."""
