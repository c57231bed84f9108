"""The worker's gRPC process: WorkerService, its Session streams and the one door (admission) in front
of the engine core process, whose outputs it fans out to the streams."""
