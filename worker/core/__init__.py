"""The engine core process: LLMEngine's step loop over typed frames from the gRPC process, with the
scheduler, the paged KV block manager, the sequences and the grammars (CPU bookkeeping)."""
