"""Tensor parallelism: rank 0 (the engine's process) drives N-1 spawned rank processes.

Each step rank 0 publishes the StepInputs encoding through the step mailbox (a shared-memory ring,
worker.tp.mailbox); every rank runs every step, in order, the layers all-reducing through
torch.distributed (NCCL on CUDA, gloo on CPU; rendezvous at a TCP store rank 0 hosts on 127.0.0.1).
Ranks belong to rank 0, not to the thread that built the engine nor to the process group: they are
started from one long-lived spawner thread, ignore SIGINT/SIGTERM, and leave when rank 0 tells them
or dies (the rank processes' side: worker.tp.rank). A rank that dies makes the next step raise RankDied (the offline API's caller gets it); only
a service that sets `exit_on_rank_death` has its process ended (never a hang on a collective).
"""

import atexit
import gc
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import threading
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from nanoserve.worker.config import EngineConfig
from nanoserve.worker.layers.distributed import fused_all_reduce_error
from nanoserve.worker.model.config import ModelConfig
from nanoserve.worker.runner.device import resolve_device
from nanoserve.worker.runner.model_runner import ModelRunner
from nanoserve.worker.runner.step_inputs import (
    copy_blocks_message,
    exit_message,
    max_message_words,
)
from nanoserve.worker.tp.mailbox import PeerDied, StepMailbox
from nanoserve.worker.tp.rank import (
    Spawner,
    init_distributed,
    rank_main,
    rendezvous_store,
    shutdown_process_group,
)

logger = logging.getLogger(__name__)
CLOSE_TIMEOUT_S = 10.0  # how long close() waits for a live rank to leave before it kills it


class RankDied(PeerDied):
    """A tensor-parallel rank is gone: this engine cannot run another step (shut it down)."""


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

    def run(self, seqs, is_prefill: bool, lookahead: bool = False, plan=None) -> list[int | None]:
        """ModelRunner.run on every rank; RankDied once a rank is gone."""
        self._alive()
        try:
            return self.runner.run(seqs, is_prefill, lookahead=lookahead, plan=plan)
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
