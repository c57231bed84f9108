"""A rank process of the tensor-parallel group (worker.tp.runner drives the group from rank 0): how
ranks are started (one spawner thread, killed with their parent), how every rank joins and leaves
the torch.distributed group, and rank_main, the step loop ranks 1..N-1 run.
"""

import ctypes
import gc
import logging
import multiprocessing as mp
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import torch
import torch.distributed as dist

from nanoserve.startup_heap import freeze_startup_heap
from nanoserve.worker.config import EngineConfig
from nanoserve.worker.layers.distributed import close_symmetric_all_reduce, fused_all_reduce_error
from nanoserve.worker.model.config import ModelConfig
from nanoserve.worker.runner.device import resolve_device
from nanoserve.worker.runner.model_runner import ModelRunner
from nanoserve.worker.runner.step_inputs import (
    CMD_COPY_BLOCKS,
    CMD_EXIT,
    CMD_STEP_AHEAD,
    StepInputs,
    decode_copies,
)
from nanoserve.worker.tp.mailbox import StepMailbox

logger = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous_store(world_size: int, port: int = 0) -> dist.TCPStore:
    """Rank 0 (port 0: any free port, then `.port`) hosts the store the ranks meet at."""
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=port == 0, wait_for_workers=False)


def init_distributed(
    device: torch.device,
    rank: int,
    world_size: int,
    store: dist.TCPStore,
    alive: Callable[[], None] = lambda: None,
) -> None:
    """Rank 0 waits for every rank to reach the store, calling `alive` (which raises when a rank
    died on its way: a group signal during its start, a crash) instead of waiting for ever."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(rank)
    else:  # ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    if rank == 0:
        keys = [f"nanoserve/rank{r}" for r in range(1, world_size)]
        while not store.check(keys):
            alive()
            time.sleep(0.05)
    else:
        store.set(f"nanoserve/rank{rank}", "arrived")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)


def die_with_parent() -> None:
    """Linux: the kernel kills this rank when the thread that spawned it ends (the spawner thread,
    which lives as long as rank 0's process), also while the rank is blocked in a collective that a
    dead rank 0 will never join."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the idle loop's parent check still ends an orphaned rank


class Spawner:
    """One long-lived daemon thread that starts every rank process. PR_SET_PDEATHSIG fires when the
    *thread* that forked the child ends: ranks started from the caller's thread (a helper thread
    that builds an LLM, an executor thread) would be killed when it retires."""

    _instance: "Spawner | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="nanoserve-tp-spawner", daemon=True).start()

    @classmethod
    def start(cls, proc: mp.process.BaseProcess) -> None:
        with cls._lock:
            if cls._instance is None:
                cls._instance = Spawner()
        done: Future = Future()
        cls._instance.jobs.put((proc, done))
        done.result()

    def _loop(self) -> None:
        while True:
            proc, done = self.jobs.get()
            try:
                proc.start()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                done.set_exception(e)
            else:
                done.set_result(None)


def rank_main(
    config: EngineConfig,
    model_config: ModelConfig,
    rank: int,
    port: int,
    mailbox: tuple,
    parent_pid: int,
) -> None:
    """Entry point of ranks 1..N-1: run every step rank 0 publishes until told to exit."""
    # a signal to the process group (Ctrl-C, systemd stop, `timeout`, kill -- -PGID) reaches the
    # ranks too; rank 0 drains and then tells them to leave, so they must not die first
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(1)

    def alive() -> None:  # while idle: rank 0 is gone, nobody will ever publish
        if os.getppid() != parent_pid:
            os._exit(1)

    from nanoserve.log import setup_logging

    setup_logging("worker", "WARNING", rank)
    world_size = config.tensor_parallel_size
    init_distributed(
        resolve_device(config.device), rank, world_size, rendezvous_store(world_size, port)
    )
    runner = ModelRunner(config, model_config, rank, world_size)
    freeze_startup_heap(f"rank {rank}")  # a pass here would stall every rank's collective
    box = StepMailbox.attach(*mailbox)
    try:
        while True:
            message = box.read(alive)  # every step, in order
            if message[1] == CMD_EXIT:
                break
            if message[1] == CMD_COPY_BLOCKS:
                runner.copy_blocks(decode_copies(message))
                continue
            x, ids = StepInputs.decode(message), None
            if message[1] == CMD_STEP_AHEAD:  # lookahead: the ids rank 0 sampled, from its GPU
                ids = torch.empty(len(x.input_ids), dtype=torch.long, device=runner.device)
                dist.broadcast(ids, src=0)
            try:
                runner.execute(x, message, input_ids=ids)
            except Exception:
                reason = fused_all_reduce_error()
                if reason is not None:
                    logging.getLogger(__name__).error("rank %d: %s", rank, reason)
                raise  # the rank exits non-zero; rank 0 reports it dead
        runner.close()
        del runner
        gc.collect()
        shutdown_process_group()
    finally:
        box.close()
    # skip the interpreter's teardown: torch's communicator threads, if the bounded teardown left
    # them running, would abort the process from their destructors
    logging.shutdown()
    os._exit(0)


def shutdown_process_group(timeout_s: float = 10.0) -> None:
    """Every rank, once no collective is in flight: NCCL communicators are aborted (destroying them
    waits on peers and, with communicators captured in CUDA graphs, never returned on the H200);
    gloo's are destroyed. Bounded either way, so a stuck teardown never blocks the exit."""
    if not dist.is_initialized():
        return
    close_symmetric_all_reduce()
    if dist.get_backend() == "nccl":

        def teardown() -> None:  # the synchronize too: a dead peer can leave a kernel waiting
            torch.cuda.synchronize()
            dist.distributed_c10d._abort_process_group()
    else:
        teardown = dist.destroy_process_group
    t = threading.Thread(target=teardown, name="tp-teardown", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        logger.warning("tensor-parallel process group teardown timed out after %.0f s", timeout_s)
