"""``unstall.torch.DistributedSampler``: one job-wide order per epoch, dealt to the ranks batch by batch
(``unstall.elastic``), so that a job's position survives a change of world size or batch size."""

from __future__ import annotations

import os
from typing import Any, Iterator, Mapping, Optional, Sequence, Sized, Tuple

import torch
import torch.distributed as dist
import torch.utils.data as tud

from .elastic import Range, Remaining, Resume, Share, normalize, restore
from .state import epoch_seed, state_int

__all__ = ["DistributedSampler", "distributed_initialized", "rank_prefix", "fit_batches", "shuffles"]


def distributed_initialized() -> bool:
    """Whether this process is in an initialised ``torch.distributed`` process group."""
    return dist.is_available() and dist.is_initialized()


def rank_prefix() -> str:
    """``"rank R "`` (and ``"local L "``) in a distributed job, as torch numbers its processes: the rank from an
    initialized ``torch.distributed`` group, else ``$RANK`` (torchrun, SLURM through it), and ``$LOCAL_RANK``.
    Ranks sharing one sidecar then tell their sessions apart in ``sidecar.stats()``; "" outside such a job."""
    rank: Optional[str] = None
    if distributed_initialized():
        rank = str(dist.get_rank())
    rank = rank if rank is not None else os.environ.get("RANK", "").strip() or None
    if rank is None:
        return ""
    local = os.environ.get("LOCAL_RANK", "").strip()
    return f"rank {rank} " + (f"local {local} " if local else "")


def fit_batches(sampler: DistributedSampler, batch_size: Optional[int], seed: Optional[int],
                batcher: str = "the DataLoader") -> None:
    """Gives ``sampler`` the batch size of ``batcher`` (the loader, or its ``BatchSampler``) when it has none, and
    refuses one whose batches (its dealing step) or seed differ: its chunks must be the loader's batches for the
    state to count them."""
    if sampler.batch_size is None:
        sampler.batch_size = batch_size
    elif sampler.batch_size != batch_size:
        raise ValueError(f"unstall.torch.DistributedSampler deals batch_size={sampler.batch_size} per step but "
                         f"{batcher} batches {batch_size}: pass the same (or leave the sampler's None)")
    if seed is not None and seed != sampler.seed:
        raise ValueError(f"the DataLoader's seed {seed} differs from its DistributedSampler's seed {sampler.seed}, "
                         "which makes the order: pass one of them")


def shuffles(sampler: Any) -> bool:
    """Whether ``sampler`` (or a ``BatchSampler``'s) draws a random order."""
    if isinstance(sampler, tud.BatchSampler):
        return shuffles(sampler.sampler)
    if isinstance(sampler, (tud.RandomSampler, tud.SubsetRandomSampler, tud.WeightedRandomSampler)):
        return True
    return isinstance(sampler, (DistributedSampler, tud.DistributedSampler)) and bool(sampler.shuffle)


class DistributedSampler(tud.Sampler[int]):
    """``torch.utils.data.DistributedSampler``'s signature and defaults over **one global order per epoch**.

    Epoch e's order is a permutation of ``range(len(dataset))`` that is a function of ``(seed, e)`` only
    (``unstall.state.epoch_seed``; the identity without ``shuffle``), whatever the world size. It is dealt to
    the ranks step by step (``unstall.elastic.Share``): at each step rank r gets the next ``batch_size``
    positions after those of ranks 0..r-1, so a rank's batches are step-aligned and after k steps on every
    rank the job consumed a prefix of the order. That is what lets ``unstall.torch.merge_states`` combine the
    ranks' states into a job state that a loader on any number of ranks, with any batch size, continues.

    Unlike torch's, it **never pads**: every sample is dealt exactly once per epoch. The positions that do not
    fill a whole step are split as evenly as the world size allows (a smaller last batch; a rank may get one
    batch fewer). ``drop_last`` leaves out the ``len(dataset) % num_replicas`` last positions instead, so that
    every rank gets as many samples (torch's count).

    ``batch_size`` (keyword-only): the items dealt to a rank per step; ``unstall.torch.DataLoader`` sets it to its
    own when None, and needs them equal. Standalone with None, one item per step (torch's interleaving).
    ``set_epoch(e)`` as torch's; ``len()`` is this rank's samples in the current epoch.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        batch_size: Optional[int] = None,
    ) -> None:
        # torch's resolution and messages, word for word
        if num_replicas is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            num_replicas = dist.get_world_size()
        if rank is None:
            if not dist.is_available():
                raise RuntimeError("Requires distributed package to be available")
            rank = dist.get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                       or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
        self.dataset = dataset
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.batch_size = batch_size
        self.epoch = 0
        self._restored: Optional[Tuple[int, Tuple[Range, ...]]] = None  # (epoch, consumed) of a restored epoch

    @property
    def chunk(self) -> int:
        """Items dealt to a rank per step: ``batch_size``, or 1 when None."""
        return self.batch_size or 1

    @property
    def epoch_size(self) -> int:
        """Positions in every epoch's global order: ``len(dataset)``."""
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def restore(self, epoch: int, consumed: Sequence[Range]) -> None:
        """Makes epoch ``epoch`` be dealt from the positions not in ``consumed`` (what the job consumed of it before
        a restore; ``unstall.elastic.restore`` says which) and the current epoch; later epochs are whole."""
        self._restored = (int(epoch), tuple(normalize(consumed, self.epoch_size)))
        self.epoch = int(epoch)

    def load_state(self, state: Mapping[str, Any], what: str, dataset: str) -> Resume:
        """Applies a loader's state over this order to this sampler (its epoch and the consumed ranges it deals the
        rest around) and returns where the rank continues: a rank's own state (same world size, rank and batch
        size) or a job state (``merge_states``, any). Refuses, naming it, another order, seed, epoch_size or
        drop_last."""
        if state.get("order") != "global":
            raise ValueError(f"{what} state_dict was taken from a loader whose order is {state.get('order')!r}; this "
                             "one deals a job-wide order ('global', unstall.torch.DistributedSampler)")
        seed = state_int(state, "seed", what)
        if seed != self.seed:
            raise ValueError(f"{what} state_dict was taken with seed {seed}; this loader's order has seed {self.seed}")
        size = state_int(state, "epoch_size", what)
        if size != self.epoch_size:
            raise ValueError(f"{what} state_dict was taken over an epoch_size of {size} samples; dataset "
                             f"{dataset!r} has {self.epoch_size} here")
        if state.get("kind") != "job" and state.get("drop_last") != self.drop_last:
            raise ValueError(f"{what} state_dict was taken with drop_last={state.get('drop_last')!r}; this loader's "
                             f"DistributedSampler has drop_last={self.drop_last}")
        resume = restore(state, world=self.num_replicas, rank=self.rank, chunk=self.chunk, what=what)
        self.restore(resume.epoch, resume.consumed)
        return resume

    def consumed(self, epoch: int) -> list[Range]:
        """The positions of epoch ``epoch`` that this rank's share is dealt around (empty but for a restored one)."""
        return list(self._restored[1]) if self._restored is not None and self._restored[0] == epoch else []

    def share(self, epoch: Optional[int] = None) -> Share:
        """This rank's share of epoch ``epoch`` (the current one by default)."""
        epoch = self.epoch if epoch is None else epoch
        remaining = Remaining(self.epoch_size, self.consumed(epoch))
        return Share(remaining, self.num_replicas, self.rank, self.chunk, self.drop_last)

    def global_order(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s job-wide order: the sample at each position."""
        n = self.epoch_size
        if not self.shuffle:
            return list(range(n))
        g = torch.Generator()
        g.manual_seed(epoch_seed(self.seed, epoch))
        return torch.randperm(n, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch
        if self._restored is not None and self._restored[0] != epoch:
            self._restored = None  # a restore applies to its own epoch only
        share = self.share(epoch)
        order = self.global_order(epoch)
        return (order[p] for p in share.positions())

    def __len__(self) -> int:
        return self.share().num_items

    @property
    def num_samples(self) -> int:
        """This rank's samples in the current epoch (torch's attribute)."""
        return len(self)

    def __repr__(self) -> str:
        return (f"DistributedSampler(epoch_size={self.epoch_size}, num_replicas={self.num_replicas}, rank={self.rank}, "
                f"shuffle={self.shuffle}, seed={self.seed}, drop_last={self.drop_last}, batch_size={self.batch_size})")

