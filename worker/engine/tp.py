"""Tensor parallelism: rank 0 (the engine's process) drives N-1 spawned rank processes.

Each step rank 0 writes the StepInputs encoding into a shared-memory buffer with a fresh unique name
and signals the ranks; every rank runs the same forward, the layers all-reducing through
torch.distributed (NCCL on CUDA, gloo on CPU; rendezvous on 127.0.0.1 at a free port). A rank that
dies or raises ends the worker (never a hang on a collective): see TensorParallelRunner._watch.
"""
import atexit
import ctypes
import gc
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.shared_memory import SharedMemory

import numpy as np
import torch
import torch.distributed as dist

from nanoserve.worker.config import EngineConfig
from nanoserve.worker.distributed import close_symmetric_all_reduce
from nanoserve.worker.engine.model_runner import ModelRunner, resolve_device
from nanoserve.worker.engine.step_inputs import (
    CMD_EXIT,
    CMD_STEP_AHEAD,
    HEADER_LEN,
    StepInputs,
    exit_message,
    max_message_words,
    message_len,
)
from nanoserve.worker.model_config import ModelConfig

logger = logging.getLogger(__name__)
SPIN_S = 0.005  # how long an idle rank polls shared memory before it sleeps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device: torch.device, rank: int, world_size: int, port: int) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(rank)
    else:  # ranks share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)


def check_tp_size(config: EngineConfig, model_config: ModelConfig) -> None:
    tp, heads, kv = config.tensor_parallel_size, model_config.num_attention_heads, \
        model_config.num_key_value_heads
    if heads % tp:
        raise ValueError(f"tensor_parallel_size: {tp} does not divide num_attention_heads ({heads})")
    if kv % tp and tp % kv:
        raise ValueError(f"tensor_parallel_size: {tp} and num_key_value_heads ({kv}) must divide "
                         "one another")
    if resolve_device(config.device).type == "cuda" and torch.cuda.device_count() < tp:
        raise ValueError(f"tensor_parallel_size: {tp} ranks but {torch.cuda.device_count()} GPUs")


def die_with_parent() -> None:
    """Linux: the kernel kills this rank when the thread that spawned it ends, also while the rank
    is blocked in a collective that a dead rank 0 will never join."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the idle loop's parent check still ends an orphaned rank


def rank_main(config: EngineConfig, model_config: ModelConfig, rank: int, port: int,
              shm_name: str, ready: mp.Event, parent_pid: int) -> None:
    """Entry point of ranks 1..N-1: run every step rank 0 publishes until told to exit."""
    die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(1)
    from nanoserve.log import setup_logging
    setup_logging("worker", "WARNING", rank)
    world_size = config.tensor_parallel_size
    init_distributed(resolve_device(config.device), rank, world_size, port)
    runner = ModelRunner(config, model_config, rank, world_size)
    shm = SharedMemory(name=shm_name)
    words = np.ndarray((shm.size // 8,), dtype=np.int64, buffer=shm.buf)
    seen = 0
    try:
        while True:
            # a busy engine publishes the next step within milliseconds: spin on the sequence
            # number (the wake-up of a sleeping process is on the critical path of every step),
            # then sleep on the event
            spin_until = time.perf_counter() + SPIN_S
            while words[0] == seen:
                if time.perf_counter() > spin_until:
                    ready.wait(timeout=1.0)
                    ready.clear()
                    if os.getppid() != parent_pid:  # rank 0 is gone: nobody will ever publish
                        os._exit(1)
            seen = int(words[0])
            size = message_len(words[1:1 + HEADER_LEN])
            message = words[1:1 + size].copy()  # rank 0 reuses the buffer for the next step
            if message[1] == CMD_EXIT:
                break
            x, ids = StepInputs.decode(message), None
            if message[1] == CMD_STEP_AHEAD:  # lookahead: the ids rank 0 sampled, from its GPU
                ids = torch.empty(len(x.input_ids), dtype=torch.long, device=runner.device)
                dist.broadcast(ids, src=0)
            runner.execute(x, message, input_ids=ids)
        runner.close()
        del runner
        gc.collect()
        shutdown_process_group()
    finally:
        del words
        shm.close()
    # skip the interpreter's teardown: torch's communicator threads, if the bounded teardown left
    # them running, would abort the process from their destructors
    logging.shutdown()
    os._exit(0)


class TensorParallelRunner:
    """Rank 0's runner: a ModelRunner whose steps are mirrored on the other ranks."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig):
        check_tp_size(config, model_config)
        world_size = config.tensor_parallel_size
        max_len = min(config.max_model_len, model_config.max_position_embeddings)
        words = max_message_words(config.max_num_batched_tokens, config.max_num_seqs,
                                  -(-max_len // config.kvcache_block_size))
        self.shm = SharedMemory(create=True, size=8 * (1 + words))  # [sequence number | message]
        self.words = np.ndarray((self.shm.size // 8,), dtype=np.int64, buffer=self.shm.buf)
        self.on_rank_death: Callable[[str], None] | None = None  # the server ends its streams
        self.closed = False
        ctx = mp.get_context("spawn")
        port = free_port()
        self.ready = [ctx.Event() for _ in range(world_size - 1)]
        self.procs = [ctx.Process(target=rank_main, name=f"nanoserve-tp-rank{r}", daemon=True,
                                  args=(config, model_config, r, port, self.shm.name,
                                        self.ready[r - 1], os.getpid()))
                      for r in range(1, world_size)]
        for p in self.procs:
            p.start()
        self.watcher = threading.Thread(target=self._watch, name="tp-watch", daemon=True)
        self.watcher.start()
        init_distributed(resolve_device(config.device), 0, world_size, port)
        self.runner = ModelRunner(config, model_config, 0, world_size)
        self.runner.publish = self.publish
        atexit.register(self.close)

    def __getattr__(self, name: str):  # run, num_kvcache_blocks, max_model_len, dtype, release…
        return getattr(self.runner, name)

    def _dead_ranks(self, dead: list) -> str:
        for p in dead:
            p.join(timeout=1)  # reap it, so that its exit code is known
        names = [f"rank {self.procs.index(p) + 1} (exit code {p.exitcode})" for p in dead]
        return f"tensor-parallel {', '.join(names)} died"

    def explain(self, exc: BaseException) -> BaseException:
        """A collective that fails on rank 0 (gloo raises, NCCL may not) usually means a rank died:
        name it, waiting briefly for the process to be gone."""
        ready = mp.connection.wait([p.sentinel for p in self.procs], timeout=2.0)
        if not ready:
            return exc
        error = RuntimeError(self._dead_ranks([p for p in self.procs if p.sentinel in ready]))
        error.__cause__ = exc
        return error

    def kill(self) -> None:
        """Before a fatal exit: the ranks may be blocked in a collective; no teardown is waited for."""
        self.closed = True
        for p in self.procs:
            p.kill()
        self.shm.unlink()

    def publish(self, msg: np.ndarray) -> None:
        """Send an encoded StepInputs (or the exit message) to the other ranks."""
        self.words[1:1 + len(msg)] = msg
        self.words[0] += 1  # after the message: x86 keeps the stores in order
        for event in self.ready:
            event.set()

    def _watch(self) -> None:
        """A dead rank would leave rank 0 blocked in a collective forever: end the process."""
        ready = mp.connection.wait([p.sentinel for p in self.procs])
        if self.closed:
            return
        message = self._dead_ranks([p for p in self.procs if p.sentinel in ready])
        logger.error("%s: the worker cannot go on", message)
        if self.on_rank_death is not None:
            self.on_rank_death(message)  # ends streams, reports NOT_SERVING, exits non-zero
            threading.Event().wait(10.0)  # the server exits well before this
        logging.shutdown()
        self.kill()
        os._exit(1)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.publish(exit_message())
        self.runner.close()
        gc.collect()
        # every rank tears its communicator down now, while the others still live: NCCL's teardown
        # can wait on peers, so it is bounded and never blocks the exit
        shutdown_process_group()
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        del self.words
        self.shm.close()
        self.shm.unlink()


def shutdown_process_group(timeout_s: float = 10.0) -> None:
    """Every rank, once no collective is in flight: NCCL communicators are aborted (destroying them
    waits on peers and, with communicators captured in CUDA graphs, never returned on the H200);
    gloo's are destroyed. Bounded either way, so a stuck teardown never blocks the exit."""
    if not dist.is_initialized():
        return
    close_symmetric_all_reduce()
    if dist.get_backend() == "nccl":
        torch.cuda.synchronize()
        teardown = dist.distributed_c10d._abort_process_group
    else:
        teardown = dist.destroy_process_group
    t = threading.Thread(target=teardown, name="tp-teardown", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        logger.warning("tensor-parallel process group teardown timed out after %.0f s", timeout_s)
