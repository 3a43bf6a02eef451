"""What the prep loaders share (``GroupLoader``): the group membership joined on first use, the epoch each ``for``
reads, data-parallel ranks each reading its share of an epoch, and ``state_dict``/``load_state_dict``."""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple

from ..cache_order import order_window, restored_snapshot
from ..echo import Echo
from ..elastic import Remaining, Resume, Share, restore
from ..state import STATE_VERSION, CountingIterator, Progress, check_state, position, state_int
from .membership import Membership, join

__all__ = ["GroupLoader"]


def _ranks(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """``(rank, world_size)``: as given, else torch.distributed's when it is initialised, else ``(0, 1)``."""
    if rank is None or world_size is None:
        import torch.distributed as dist

        from ..sharding import distributed_initialized

        on = distributed_initialized()
        world_size = world_size if world_size is not None else dist.get_world_size() if on else 1
        rank = rank if rank is not None else dist.get_rank() if on else 0
    if not isinstance(world_size, int) or not isinstance(rank, int) or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"a prep loader's rank must be in [0, world_size) and world_size >= 1; got rank {rank!r}, "
                         f"world_size {world_size!r}")
    return rank, world_size


class GroupLoader:
    """What the prep loaders share: the group membership, joined on first use (``membership``), the epoch
    each ``for`` reads, and ``state_dict``/``load_state_dict`` as torchdata's ``StatefulDataLoader``'s.

    ``rank``/``world_size`` (default: torch.distributed's when initialised, else 0 and 1): each data-parallel rank
    is a member of the group and reads its share of every epoch's batches, dealt by ``unstall.elastic.Share`` one
    batch per step (rank r reads batches r, r + world_size, ...; nothing padded or repeated, so the last step may
    leave some ranks a batch short). The group still prepares each batch once, frees it once every rank that reads
    it did, and lets a rank go after its own last batch.

    The state (plain ints, strings and lists, for ``torch.save``): ``version``, ``dataset``, ``seed`` (the group's:
    it fixes the order and the augmentations), ``batch_size`` (the group's), ``start_epoch`` (this job's first epoch,
    against which ``epochs`` counts), ``epoch`` (the one in progress; after its last batch, still that one: a state
    taken then restores as its end, so the next ``for`` yields nothing and the one after reads the next epoch) and
    the elastic keys of ``unstall.elastic``: ``epoch_size`` (the group's batches per epoch), ``consumed`` (the batch
    ranges of the epoch the job read before this rank's share was dealt), ``world_size``, ``rank``, ``chunk`` (1)
    and ``batches_yielded`` (batches of its share the loop was handed). Taking it asks the sidecar nothing once the
    group is joined. ``unstall.elastic.merge_states(states, what="PrepLoader")`` of every rank's state is a job
    state. Call ``load_state_dict`` with this rank's own state (same ranks) or a job state (any number of ranks) on a
    new loader built with the same arguments, before iterating: it joins the group at the first batch its share still
    needs (``prep.join``'s ``start_epoch`` and ``share``), so the sidecar never prepares the batches the job read for
    it, and the first ``for`` continues the saved epoch.

    ``echo``/``echo_level`` (not part of the group's key: every member echoes the group's batches on its own, in
    this process, after they arrived; ``unstall.echo``): each batch handed out ``echo`` times per epoch,
    reshuffled by the group's seed and the epoch; ``len()`` counts the echoed batches, ``echo_counts`` the fresh
    ones. With ``echo > 1`` the state is taken between epochs only.

    ``order="cache_first"``/``order_window`` (as ``unstall.torch.DataLoader``'s; default 4 batches): the group
    (``prep.join``'s ``"order"``, part of its key) reorders each epoch's seeded order cached samples first within
    aligned windows of ``order_window`` positions, from one snapshot of the sidecar's cache per epoch, the same order
    for every member (docs/PREP.md). The state adds ``cache_window`` and, mid-epoch, ``cache_snapshot`` (that
    epoch's), which a restored loader's join carries, so a restarted sidecar continues the very same order.
    """

    def __init__(self, dataset: str, pipeline: Any, batch_size: int, join_kwargs: Mapping[str, Any],
                 rank: Optional[int] = None, world_size: Optional[int] = None) -> None:
        import torch  # noqa: F401  (fail early, naming the missing extra)

        self.rank, self.world_size = _ranks(rank, world_size)
        join_kwargs = dict(join_kwargs)
        self.echo = Echo.of(join_kwargs.pop("echo", 1), join_kwargs.pop("echo_level", "batch"))
        self.echo_counts = self.echo.counts()
        self._cache_window = order_window(join_kwargs.pop("order", "sampler"), join_kwargs.pop("order_window", None),
                                          batch_size)
        if self._cache_window is not None:
            join_kwargs["order"] = {"cache_first": self._cache_window}
        self._resume_snapshot: Optional[str] = None  # a restored state's cache_snapshot, for the join
        self._dataset = dataset
        self._pipeline = pipeline
        self._batch_size = batch_size
        self._join_kwargs = dict(join_kwargs)
        self._membership: Optional[Membership] = None
        self._first_epoch = 0  # this job's first epoch (kept across restores)
        self._resume: Optional[Tuple[int, Resume]] = None  # (first epoch, where this rank continues)
        self._next_epoch = 0
        self._progress: Optional[Progress] = None

    @property
    def membership(self) -> Membership:
        """This loader's place in the group; joins it on first use."""
        if self._membership is None:
            kwargs = dict(self._join_kwargs)
            share: dict[str, Any] = {"world_size": self.world_size, "rank": self.rank}
            if self._resume is not None:
                first, r = self._resume
                kwargs.update(start_epoch=r.epoch, share=dict(share, consumed=[list(c) for c in r.consumed],
                                                               skip=r.skip))
                if self._resume_snapshot is not None:
                    kwargs["cache_snapshot"] = self._resume_snapshot
                if kwargs.get("epochs") is not None:
                    kwargs["epochs"] = int(kwargs["epochs"]) - (r.epoch - first)
            elif self.world_size > 1:
                kwargs["share"] = share
            m = join(self._dataset, self._pipeline, batch_size=self._batch_size, **kwargs)
            self._first_epoch = self._resume[0] if self._resume is not None else m.start_epoch
            self._next_epoch = m.start_epoch
            self._membership = m
        return self._membership

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        self.membership  # noqa: B018  (a joiner learns its first epoch)
        return self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        m = self.membership
        if epoch < m.start_epoch:
            raise ValueError(f"this member starts at epoch {m.start_epoch}, not {epoch}")
        self._next_epoch = int(epoch)
        self._progress = None

    def __len__(self) -> int:
        m = self.membership
        samples = int(m.info.get("num_samples", m.num_batches * self._batch_size)) if self.world_size == 1 else None
        return self.echo.length(len(self._share(self.epoch)[0]), samples, self._batch_size)

    def _share(self, epoch: int) -> Tuple[Share, int]:
        """This rank's share of ``epoch``'s batches, and how many of them it already read (a restored epoch)."""
        r = self._resume[1] if self._resume is not None and self._resume[1].epoch == epoch else None
        remaining = Remaining(self.membership.num_batches, r.consumed if r is not None else ())
        return Share(remaining, self.world_size, self.rank, 1), r.skip if r is not None else 0

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        epoch = self.epoch
        self._next_epoch = epoch + 1
        share, skip = self._share(epoch)
        progress = self._progress = Progress(epoch, skip)
        batches = self.echo.apply(self._batches(epoch, list(share.positions(skip))),
                                  seed=int(self._join_kwargs.get("seed", 0)), epoch=epoch,
                                  batch_size=self._batch_size, counts=self.echo_counts)
        return CountingIterator(batches, progress)

    def _batches(self, epoch: int, indices: Sequence[int]) -> Iterator[Tuple[Any, ...]]:
        """The batches ``indices`` of ``epoch`` (this rank's share from where it stands), in order."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        m = self.membership
        progress = self._progress
        # As torchdata's: after the epoch's last batch, its end; once the ``for`` is over, the next epoch's start.
        epoch, yielded = position(progress, self._next_epoch, self._share(self._next_epoch)[1])
        self.echo.check_resumable(type(self).__name__, progress is not None and not progress.done
                                  and progress.handed > 0)
        r = self._resume[1] if self._resume is not None and self._resume[1].epoch == epoch else None
        state = {"version": STATE_VERSION, "dataset": self._dataset, "seed": int(self._join_kwargs.get("seed", 0)),
                 "batch_size": self._batch_size, "start_epoch": self._first_epoch, "epoch": epoch,
                 "epoch_size": m.num_batches, "consumed": [list(c) for c in r.consumed] if r is not None else [],
                 "world_size": self.world_size, "rank": self.rank, "chunk": 1, "batches_yielded": yielded}
        if self._cache_window is not None:
            state["cache_window"] = self._cache_window
            snapshot = m.cache_snapshot(epoch)
            if snapshot is not None and (yielded > 0 or state["consumed"]):  # an epoch in progress
                state["cache_snapshot"] = snapshot
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        what = type(self).__name__
        check_state(state, what)
        if state.get("dataset", self._dataset) != self._dataset:
            raise ValueError(f"{what} state_dict was taken from a loader over dataset {state['dataset']!r}; this "
                             f"one reads {self._dataset!r}")
        if state.get("batch_size", self._batch_size) != self._batch_size:
            raise ValueError(f"{what} state_dict was taken with batch_size {state['batch_size']}; this loader has "
                             f"{self._batch_size}: a prep group's batches are the group's (its batch size is part of "
                             "its key), so its epoch continues with the same batch_size only")
        if "epoch_size" not in state:  # a state without ranks: one rank's, counted in batches of the whole epoch
            state = dict(state, epoch_size=state_int(state, "num_batches", what), consumed=[], world_size=1, rank=0,
                         chunk=1)
        resume = restore(state, world=self.world_size, rank=self.rank, chunk=1, what=what)
        first = state_int(state, "start_epoch", what)
        epochs = self._join_kwargs.get("epochs")
        if epochs is not None and resume.epoch >= first + int(epochs):
            raise ValueError(f"{what} state_dict is at epoch {resume.epoch}, past the {epochs} epochs from epoch "
                             f"{first} this loader declares: nothing is left to read")
        self._join_kwargs["seed"] = state_int(state, "seed", what)
        if self._membership is not None:  # joined already (len(), epoch): join again at the saved batch
            self._membership.leave()
            self._membership = None
        self._resume = (first, resume)
        self._progress = None
        snapshot = state.get("cache_snapshot")
        same = state.get("cache_window") == self._cache_window and resume.epoch == state.get("epoch")
        self._resume_snapshot = str(snapshot) if snapshot is not None and same else None
        m = self.membership
        if m.num_batches != state["epoch_size"]:
            self.close()
            raise ValueError(f"{what} state_dict was taken from a loader with {state['epoch_size']} batches per "
                             f"epoch over dataset {self._dataset!r}; this one has {m.num_batches} (build it with "
                             "the same batch_size and drop_last)")
        try:
            restored_snapshot(state, self._cache_window, int(m.info["num_samples"]), what)
        except ValueError:
            self.close()
            raise

    def close(self) -> None:
        if self._membership is not None:
            self._membership.leave()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
