"""Tensor parallelism: rank 0's runner in the engine core, the rank processes, the shared-memory step
mailbox between them and the all-reduce."""
