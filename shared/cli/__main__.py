"""`python -m nanoserve.cli`: the `nanoserve` command of this interpreter."""

from nanoserve.cli import main

main()
