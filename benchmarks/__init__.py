"""Benchmarks: figures, never pass/fail (`nanoserve bench`, `python -m nanoserve.benchmarks.X`)."""
