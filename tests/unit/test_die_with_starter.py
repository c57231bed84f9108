"""nanoserve.process.die_with_starter: a service started by Child dies with the thread that started
it (PR_SET_PDEATHSIG, asked for by the service itself: no Popen preexec_fn, whose fork() runs a
gRPC parent's fork handlers in the child, grpc/grpc#43055), and its own children do not inherit the
request."""

import os
import signal
import subprocess
import sys
import time

CHILD = """
import os, sys, time
from nanoserve.process import PARENT_PID_ENV, die_with_starter
die_with_starter()
print(os.environ.get(PARENT_PID_ENV, "gone"), flush=True)
time.sleep(60)
"""

PARENT = """
import subprocess, sys, time
from nanoserve.process import Child
child = Child("stand-in", [sys.executable, "-c", sys.argv[1]])
print(child.process.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_child_dies_with_its_sigkilled_starter_and_passes_nothing_on() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True
    )
    child = None
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        # the child's own line, relayed by Child: the variable is out of its environment
        assert parent.stdout.readline().strip() == "gone"
        assert alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child)
    finally:
        parent.kill()
        if child is not None and alive(child):
            os.kill(child, signal.SIGKILL)


def test_without_the_variable_nothing_is_asked(monkeypatch) -> None:
    from nanoserve import process

    called: list[int] = []
    monkeypatch.delenv(process.PARENT_PID_ENV, raising=False)
    monkeypatch.setattr(process, "die_with", called.append)
    process.die_with_starter()
    monkeypatch.setenv(process.PARENT_PID_ENV, "123")
    process.die_with_starter()
    assert called == [123] and process.PARENT_PID_ENV not in os.environ
