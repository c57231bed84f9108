"""`python -m worker`: start the WorkerService (flags generated from WorkerConfig)."""
from worker.server import main

main()
