"""--engine-core-cpus (worker.core.cpu_affinity): the CPU-list syntax, its bounds and errors, and
keeping a process off the step loop's CPUs (in a child process: it changes the caller's affinity)."""

import os
import subprocess
import sys
import textwrap

import pytest

from nanoserve.worker.config import MAX_SPEC_CHARS, WorkerConfig, parse_cpu_list


@pytest.mark.parametrize(
    ("spec", "cpus"),
    [("3", {3}), ("2-3", {2, 3}), ("0,4-5", {0, 4, 5}), (" 1 , 4-5 ", {1, 4, 5}), ("7-7", {7})],
)
def test_cpu_lists(spec: str, cpus: set[int]) -> None:
    assert parse_cpu_list(spec) == cpus


@pytest.mark.parametrize(
    "spec",
    ["", "a", "1,", "5-3", "-1", "1-", "3-x", "99999", "0-99999", "1" * (MAX_SPEC_CHARS + 1)],
)
def test_bad_cpu_lists_name_the_flag(spec: str) -> None:
    with pytest.raises(ValueError, match="engine_core_cpus"):
        parse_cpu_list(spec)


def test_worker_config_checks_the_list(tmp_path) -> None:
    with pytest.raises(ValueError, match="engine_core_cpus"):
        WorkerConfig(model=str(tmp_path), engine_core_cpus="2-1")
    assert WorkerConfig(model=str(tmp_path), engine_core_cpus="0").engine_core_cpus == "0"


def _child(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_process_kept_off_and_its_threads_inherit_it() -> None:
    last = max(os.sched_getaffinity(0))
    out = _child(
        f"""
        import os, threading
        from nanoserve.worker.core.cpu_affinity import keep_process_off, pin_step_loop
        rest = keep_process_off("{last}")
        seen = {{}}
        t = threading.Thread(target=lambda: seen.update(thread=os.sched_getaffinity(0)))
        t.start(); t.join()
        pin_step_loop(frozenset({{{last}}}))
        print(sorted(rest), sorted(seen["thread"]), sorted(os.sched_getaffinity(0)))
        """
    )
    rest = sorted(os.sched_getaffinity(0) - {last})
    assert out == f"{rest} {rest} [{last}]"


def test_taking_every_cpu_is_refused() -> None:
    out = _child(
        """
        import os
        from nanoserve.worker.core.cpu_affinity import keep_process_off
        try:
            keep_process_off(",".join(map(str, os.sched_getaffinity(0))))
        except ValueError as e:
            print(e)
        """
    )
    assert "takes every CPU" in out


def test_a_cpu_the_process_may_not_use_is_refused() -> None:
    out = _child(
        """
        import os
        from nanoserve.worker.core.cpu_affinity import keep_process_off
        try:
            keep_process_off("8000")  # no such CPU here
        except ValueError as e:
            print(e)
        """
    )
    assert "no thread may run there" in out
