"""Training one policy with several processes through torch.distributed, launched by torchrun.

    torchrun --nproc_per_node=P train.py --config ...                     # P processes on this machine
    torchrun --nnodes=2 --nproc_per_node=P --rdzv-endpoint=HOST:PORT ... # or across machines

Each process (rank) steps its own share of the ``n_workers`` worker lanes, lanes rank * N/P .. (rank + 1) * N/P - 1,
with their own memory, exactly as one process would step those lanes: environment seeds follow the global lane index,
and the sampling noise of all N lanes is drawn in one piece from a generator every rank holds in the same state, each
rank taking its rows (``heads.noise``). The minibatches are the ones a single process would cut: every rank draws the
same permutation of all N lanes' chunks (or steps) and keeps the part that its lanes hold; each rank's loss is weighted
by its share of the minibatch's steps, and the gradients are summed over the ranks in one flattened all-reduce, so the
step equals the single-process step up to the order of floating-point sums (advantages are normalised with the
minibatch's global mean and standard deviation). Every rank then holds the same parameters, which ``check_identical``
verifies after every update. Rank 0 alone writes summaries, the model and the checkpoint; the checkpoint holds every
rank's environment and memory state (gathered every ``checkpoint_interval`` updates and at the end), so a resume with
the same number of processes continues exactly.

Backends: NCCL on CUDA (each rank on the GPU of its LOCAL_RANK), gloo on the CPU. A plain ``python train.py`` runs
with ``SINGLE`` and never touches torch.distributed; under torchrun even one process joins a process group and takes
the path of several (collectives over one rank), which is how a machine with one GPU checks the NCCL path.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from typing import NamedTuple, NoReturn

import torch
import torch.distributed as dist

# How long a collective waits for a rank that does not answer before it fails (TRXL_COLLECTIVE_TIMEOUT_S overrides it).
TIMEOUT_S = float(os.environ.get("TRXL_COLLECTIVE_TIMEOUT_S", 600))
# How long the other ranks wait for rank 0 working alone (an evaluation, which evaluation.MAX_EPISODE_STEPS bounds).
WAIT_TIMEOUT_S = 24 * 3600
_waiting_group: dist.ProcessGroup | None = None  # the gloo group they wait in (``wait_for_main``)


class Rows(NamedTuple):
    """Where one process's N worker lanes sit among all: lanes first .. first + N - 1 of total."""

    first: int
    total: int


@dataclass(frozen=True)
class Ranks:
    """This process's place among the training processes.

    Attributes:
        rank: This process's number, 0 .. world - 1; rank 0 writes every file.
        world: The number of processes.
        group: Whether the processes joined a torch.distributed process group (torchrun, even with one process;
            several processes always do).
    """

    rank: int = 0
    world: int = 1
    group: bool = False

    @property
    def main(self) -> bool:
        """Whether this process writes summaries, the model and checkpoints (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Whether this process trains in a process group (torchrun): the path of several processes, with collectives
        over the ranks, even where there is one."""
        return self.group or self.world > 1

    def lanes(self, n_workers: int) -> range:
        """This rank's worker lanes (global indices) among n_workers, which the config check made a multiple of world."""
        share = n_workers // self.world
        return range(self.rank * share, (self.rank + 1) * share)

    def rows(self, n_workers: int) -> Rows | None:
        """This rank's lanes as ``Rows`` for sampling noise and minibatches; None for a single process."""
        if not self.distributed:
            return None
        lanes = self.lanes(n_workers)
        return Rows(lanes.start, n_workers)


SINGLE = Ranks()


class LaunchError(RuntimeError):
    """The processes cannot start as launched (e.g. more processes than GPUs on a machine)."""


def launched() -> bool:
    """Whether torchrun started this process (even as the only one), or another launcher as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or "TORCHELASTIC_RUN_ID" in os.environ


def start(device_type: str) -> Ranks:
    """Joins the process group torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).

    Args:
        device_type: "cuda" or "cpu": NCCL with one GPU per rank (made the current device by LOCAL_RANK), or gloo.

    Returns:
        This process's Ranks.

    Raises:
        LaunchError: If a process on CUDA has no GPU of its own (NCCL refuses two ranks on one GPU).
    """
    if not launched():
        return SINGLE
    if device_type == "cuda":
        local, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local >= gpus:
            raise LaunchError(
                f"process {local} of this machine (LOCAL_RANK) has no GPU of its own: the machine shows {gpus} GPU(s) "
                f"and NCCL needs one per process; start at most {gpus} per machine (--nproc_per_node={gpus}), or add "
                "--cpu to train on the CPU with gloo"
            )
        torch.cuda.set_device(torch.device("cuda", local))
    global _waiting_group
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    _waiting_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=WAIT_TIMEOUT_S))
    return Ranks(dist.get_rank(), dist.get_world_size(), group=True)


def backend() -> str | None:
    """The process group's backend ("nccl" or "gloo"), None outside one."""
    return dist.get_backend() if dist.is_available() and dist.is_initialized() else None


def wait_for_main(ranks: Ranks) -> None:
    """Every rank meets rank 0 here after it worked alone (an evaluation), in a barrier of a gloo group with a long
    timeout: a rank that went on would wait in its next training collective, which fails after ``TIMEOUT_S`` (on NCCL
    the watchdog then aborts the process), however long the evaluation has still to run."""
    if ranks.distributed:
        dist.barrier(group=_waiting_group)


def stop() -> None:
    """Leaves the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def leave(code: int) -> NoReturn:
    """Ends a torchrun process that has left the process group and closed its files: flushes stdout and stderr, then
    exits with ``code`` at once, without the interpreter's shutdown.

    On the CPU, a gloo process that exits normally after ``destroy_process_group`` aborts now and then while the
    interpreter shuts down (``terminate called without an active exception``, no Python frame on the stack: a C++
    thread object destroyed while still joinable), and torchrun then reports a failed run although it had finished
    and saved. Nothing is left to do by then, so the shutdown is skipped.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing more can reach it
    os._exit(code)


def all_reduce_sum(tensor: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """The element-wise sum of ``tensor`` over all ranks (in place; ``tensor`` itself for a single process)."""
    if ranks.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def gather_to_main(item: object, ranks: Ranks) -> list[object] | None:
    """Every rank's ``item`` (picklable) as a list in rank order on rank 0, None on the others; [item] for one process."""
    if not ranks.distributed:
        return [item]
    gathered: list[object] | None = [None] * ranks.world if ranks.main else None
    dist.gather_object(item, gathered, dst=0)
    return gathered


def all_gather(item: object, ranks: Ranks) -> list[object]:
    """Every rank's ``item`` (picklable) as a list in rank order, on every rank."""
    if not ranks.distributed:
        return [item]
    gathered: list[object] = [None] * ranks.world
    dist.all_gather_object(gathered, item)
    return gathered


def check_identical(model: torch.nn.Module, ranks: Ranks) -> None:
    """Raises RuntimeError unless every rank holds bit-identical parameters (compares a checksum of their bytes)."""
    if not ranks.distributed:
        return
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])
        checksum = (flat.view(torch.int32).to(torch.int64) * torch.arange(1, flat.numel() + 1) % 2_147_483_647).sum()
    sums = all_gather(int(checksum), ranks)
    if len(set(sums)) != 1:
        raise RuntimeError(
            f"the ranks' parameters differ after an update (checksums {sums}); this is a bug: please report it with "
            "the config and the torchrun command"
        )
