"""Tensor parallelism: rank 0 (the engine's process) drives N-1 spawned rank processes.

Each step rank 0 publishes the StepInputs encoding through the step mailbox (a shared-memory ring,
worker.engine.step_mailbox); every rank runs every step, in order, the layers all-reducing through
torch.distributed (NCCL on CUDA, gloo on CPU; rendezvous at a TCP store rank 0 hosts on 127.0.0.1).
Ranks belong to rank 0, not to the thread that built the engine nor to the process group: they are
started from one long-lived spawner thread, ignore SIGINT/SIGTERM, and leave when rank 0 tells them
or dies. A rank that dies makes the next step raise RankDied (the offline API's caller gets it); only
a service that sets `exit_on_rank_death` has its process ended (never a hang on a collective).
"""

import atexit
import ctypes
import gc
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np
import torch
import torch.distributed as dist

from nanoserve.worker.config import EngineConfig
from nanoserve.worker.distributed import close_symmetric_all_reduce, fused_all_reduce_error
from nanoserve.worker.engine.device import resolve_device
from nanoserve.worker.engine.model_runner import ModelRunner
from nanoserve.worker.engine.step_inputs import (
    CMD_COPY_BLOCKS,
    CMD_EXIT,
    CMD_STEP_AHEAD,
    StepInputs,
    copy_blocks_message,
    decode_copies,
    exit_message,
    max_message_words,
)
from nanoserve.worker.engine.step_mailbox import PeerDied, StepMailbox
from nanoserve.worker.model_config import ModelConfig

logger = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 10.0  # how long close() waits for a live rank to leave before it kills it


class RankDied(PeerDied):
    """A tensor-parallel rank is gone: this engine cannot run another step (shut it down)."""


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


def check_tp_size(config: EngineConfig, model_config: ModelConfig) -> None:
    tp, heads, kv = (
        config.tensor_parallel_size,
        model_config.num_attention_heads,
        model_config.num_key_value_heads,
    )
    if heads % tp:
        raise ValueError(
            f"tensor_parallel_size: {tp} does not divide num_attention_heads ({heads})"
        )
    if kv % tp and tp % kv:
        raise ValueError(
            f"tensor_parallel_size: {tp} and num_key_value_heads ({kv}) must divide one another"
        )
    if resolve_device(config.device).type == "cuda" and torch.cuda.device_count() < tp:
        raise ValueError(f"tensor_parallel_size: {tp} ranks but {torch.cuda.device_count()} GPUs")


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
            except Exception:  # noqa: BLE001 - best effort; the step then hangs as before
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


class TensorParallelRunner:
    """Rank 0's runner: a ModelRunner whose steps are mirrored on the other ranks."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig):
        check_tp_size(config, model_config)
        world_size = config.tensor_parallel_size
        max_len = model_config.max_len(config.max_model_len)
        words = max_message_words(
            config.max_num_batched_tokens,
            config.max_num_seqs,
            -(-max_len // config.kvcache_block_size),
        )
        ctx = mp.get_context("spawn")
        self.mailbox = StepMailbox(world_size - 1, words, ctx)
        self.on_rank_death: Callable[[str], None] | None = None  # the server ends its streams
        # the service entry point sets this: a dead rank may leave rank 0 blocked in a collective,
        # so the process is ended (10 s after on_rank_death). The offline API never ends it.
        self.exit_on_rank_death = False
        self.dead: str | None = None  # why no step can run any more
        self.closed = False
        store = rendezvous_store(world_size)
        self.procs = [
            ctx.Process(
                target=rank_main,
                name=f"nanoserve-tp-rank{r}",
                daemon=True,
                args=(config, model_config, r, store.port, self.mailbox.handle(r - 1), os.getpid()),
            )
            for r in range(1, world_size)
        ]
        for p in self.procs:
            Spawner.start(p)
        self.watcher = threading.Thread(target=self._watch, name="tp-watch", daemon=True)
        self.watcher.start()
        try:
            init_distributed(resolve_device(config.device), 0, world_size, store, self._alive)
            self.runner = ModelRunner(config, model_config, 0, world_size)
        except BaseException as e:
            error = self.explain(e)
            self.kill()
            if error is e:
                raise
            raise error from e
        self.runner.publish = self.publish
        atexit.register(self.close)

    def __getattr__(self, name: str):  # num_kvcache_blocks, max_model_len, dtype, release…
        if name == "runner":  # __init__ failed before it was set
            raise AttributeError(name)
        return getattr(self.runner, name)

    def _dead_ranks(self, dead: list) -> str:
        for p in dead:
            p.join(timeout=1)  # reap it, so that its exit code is known
        names = [f"rank {self.procs.index(p) + 1} (exit code {p.exitcode})" for p in dead]
        return f"tensor-parallel {', '.join(names)} died"

    def _alive(self) -> None:
        """Raises RankDied once a rank is gone (the mailbox calls it while it waits on a rank)."""
        if self.dead is None:
            dead = [p for p in self.procs if not p.is_alive()]
            if dead:
                self.dead = self._dead_ranks(dead)
        if self.dead is not None:
            raise RankDied(self.dead)

    def explain(self, exc: BaseException) -> BaseException:
        """A collective that fails on rank 0 (gloo raises, NCCL may not) usually means a rank died:
        name it, waiting briefly for the process to be gone."""
        if isinstance(exc, RankDied):
            return exc
        ready = mp.connection.wait([p.sentinel for p in self.procs], timeout=2.0)
        if not ready:
            reason = fused_all_reduce_error()  # the kernel trapped: this GPU context is gone
            if reason is None:
                return exc
            error = RankDied(f"tensor-parallel rank 0: {reason}")
            error.__cause__ = exc
            return error
        error = RankDied(self._dead_ranks([p for p in self.procs if p.sentinel in ready]))
        error.__cause__ = exc
        return error

    def run(self, seqs, is_prefill: bool, lookahead: bool = False) -> list[int | None]:
        """ModelRunner.run on every rank; RankDied once a rank is gone."""
        self._alive()
        try:
            return self.runner.run(seqs, is_prefill, lookahead=lookahead)
        except Exception as e:
            error = self.explain(e)
            if error is e:
                raise
            raise error from e

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """ModelRunner.copy_blocks on every rank (each holds its heads' share of every block)."""
        self.publish(copy_blocks_message(copies))
        self.runner.copy_blocks(copies)

    def kill(self) -> None:
        """Before a fatal exit: the ranks may be blocked in a collective; no teardown is waited for."""
        if self.closed:
            return
        self.closed = True
        for p in self.procs:
            p.kill()
        self.mailbox.close(unlink=True)

    def publish(self, msg: np.ndarray) -> None:
        """Send an encoded StepInputs (or the exit message) to the other ranks: waits while the
        slowest rank is SLOTS steps behind; RankDied when a rank is gone."""
        self._alive()
        self.mailbox.publish(msg, self._alive)

    def _watch(self) -> None:
        """A dead rank: later steps raise RankDied. A service (exit_on_rank_death) is ended, since
        rank 0 may be blocked in a collective that will never complete."""
        ready = mp.connection.wait([p.sentinel for p in self.procs])
        if self.closed:
            return
        message = self._dead_ranks([p for p in self.procs if p.sentinel in ready])
        self.dead = self.dead or message
        logger.error("%s: the engine cannot go on", message)
        if self.on_rank_death is not None:
            self.on_rank_death(message)  # the server ends its streams and reports NOT_SERVING
        if self.exit_on_rank_death:
            threading.Event().wait(10.0)  # the server exits well before this
            logging.shutdown()
            self.kill()
            os._exit(1)
        if dist.is_initialized() and dist.get_backend() == "nccl":
            # NCCL waits for the dead peer forever (gloo raises): abort, so a step in flight fails
            try:
                dist.distributed_c10d._abort_process_group()
            except Exception:
                logger.exception("could not abort the NCCL process group")

    def close(self) -> None:
        """Tell the ranks to leave and wait for them, bounded: a dead or stuck rank is killed."""
        if self.closed:
            return
        self.closed = True
        clean = self.dead is None
        if clean:
            deadline = threading.Timer(CLOSE_TIMEOUT_S, lambda: None)
            deadline.start()

            def alive() -> None:  # a rank stuck for CLOSE_TIMEOUT_S is given up on as well
                self._alive()
                if not deadline.is_alive():
                    raise RankDied("tensor-parallel ranks did not read the exit message")

            try:
                self.mailbox.publish(exit_message(), alive)
            except RankDied as e:
                logger.warning("%s", e)
                clean = False
            deadline.cancel()
        self.runner.close()
        gc.collect()
        # every rank tears its communicator down now, while the others still live: NCCL's
        # teardown can wait on peers, so it is bounded and never blocks the exit. After a rank
        # died too: a process group left initialised would make this process's next engine (a
        # new LLM, tensor-parallel or not) think it is a rank
        shutdown_process_group(10.0 if clean else 2.0)
        for p in self.procs:
            p.join(timeout=CLOSE_TIMEOUT_S if clean else 0.1)
            if p.is_alive():  # SIGKILL: the ranks ignore SIGTERM
                p.kill()
                p.join(timeout=5)
        self.mailbox.close(unlink=True)


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
