"""`python -m nanoserve.worker`: start the WorkerService (flags generated from WorkerConfig)."""
from nanoserve.worker.server import main

if __name__ == "__main__":  # tensor-parallel ranks are spawned: they re-import this module
    main()
