"""Horovod Elastic for dpcompare's loop: the state the survivors roll back to, and what a reset redoes.

``hvd.elastic.run`` calls the epochs; when a collective fails (a host is gone: ``HorovodInternalError``) every
survivor restores the last commit, re-initialises Horovod with the hosts that are left (``shutdown``, ``init``:
a new rendezvous through horovodrun's driver) and runs the epochs again from there; a host that comes back
(``HostsUpdatedInterrupt`` at a commit) joins the same way. :class:`Keeper` is the ``State`` it saves, restores
and syncs: the model's and the optimizer's state dicts and the loop's progress (:class:`~.base.ElasticState`).

Horovod's own ``TorchState`` is not used: its first sync broadcasts the optimizer's state even when rank 0 has
none, which takes an optimizer step on zero gradients everywhere (weight decay moves the weights, Adam counts
a step), so the run would no longer start as every other strategy's does. Here the optimizer's state is
broadcast only when rank 0 has some, decided by rank 0 for everyone (a joining worker has none).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch
from torch import nn

from dpcompare.backends.parts import Holder, Restarts
from dpcompare.launch.env import LaunchEnv

if TYPE_CHECKING:
    from dpcompare.backends.parts import ElasticState

T = TypeVar("T")


class Owner(Holder, Protocol):
    """What :class:`HorovodElastic` needs of the Horovod strategy that holds it (this module never imports
    that one)."""

    _hvd: Any
    env: LaunchEnv


class HorovodElastic(Restarts):
    """Horovod Elastic: the epochs inside ``hvd.elastic.run``; a commit is kept in memory (:class:`Keeper`)."""

    strategy: Owner

    def __init__(self, strategy: Owner) -> None:
        super().__init__(strategy)
        self.keeper: Any = None  # the Keeper while run() runs

    def run(self, body: Callable[[], T], model: nn.Module, optimizer: torch.optim.Optimizer,
            state: ElasticState) -> T:
        """``body`` inside ``hvd.elastic.run``: it starts from rank 0's state (the keeper's sync), and after a lost
        host the survivors roll back to the last :meth:`commit`, re-initialise with the hosts left and run it
        again from there."""
        self.keeper = keeper_class()(self, model, optimizer, state)
        try:
            return self.strategy._hvd.elastic.run(lambda _keeper: body())(self.keeper)
        finally:
            self.keeper = None

    def commit(self, save: Callable[[], object]) -> None:
        """Keep the state in memory (and raise ``HostsUpdatedInterrupt`` when horovodrun has added or removed
        hosts: every rank at the same commit); outside :meth:`run`, a checkpoint."""
        if self.keeper is None:
            save()
        else:
            self.keeper.commit()

    def joined_again(self, optimizer: torch.optim.Optimizer) -> None:
        """After Horovod re-initialised with another world: this rank's new place, and the optimizer averaging over
        the new size (its pre-division factor was the old size; pre-dividing by the new one keeps the averaging
        exactly that of a run started at this size)."""
        s = self.strategy
        s.env = env_now(s._hvd)
        if not s.cfg.adasum:
            optimizer.gradient_predivide_factor = float(s._hvd.size())  # type: ignore[attr-defined]


def keeper_class() -> type:
    """:class:`Keeper`, built on Horovod's ``State`` on first use (Horovod is imported only by its strategy)."""
    from horovod.common.elastic import State  # optional: Horovod may not be installed

    class Keeper(State):  # type: ignore[misc, valid-type]
        """The model, the optimizer and the loop's progress as of the last commit."""

        def __init__(self, elastic: HorovodElastic, model: nn.Module, optimizer: torch.optim.Optimizer,
                     loop: ElasticState) -> None:
            hvd = elastic.strategy._hvd
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)
            self.elastic, self.strategy = elastic, elastic.strategy
            self.model, self.optimizer, self.loop = model, optimizer, loop
            self.save()  # what a failure before the first commit rolls back to

        def save(self) -> None:
            module = self.strategy.unwrap_model(self.model)
            self.saved = (copy.deepcopy(module.state_dict()), copy.deepcopy(self.optimizer.state_dict()),
                          copy.deepcopy(self.loop.progress()))

        def restore(self) -> None:
            model_state, optimizer_state, progress = self.saved
            self.strategy.unwrap_model(self.model).load_state_dict(model_state)
            self.optimizer.load_state_dict(optimizer_state)  # Horovod's also forgets unfinished all-reduces
            self.loop.resume_from(copy.deepcopy(progress))

        def sync(self) -> None:
            hvd = self.strategy._hvd
            has_state = hvd.broadcast_object(bool(self.optimizer.state), root_rank=0)
            if has_state:  # first: a joining worker's zero-gradient step must not touch the weights broadcast next
                hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
            hvd.broadcast_parameters(self.strategy.unwrap_model(self.model).state_dict(), root_rank=0)
            self.loop.resume_from(hvd.broadcast_object(self.loop.progress(), root_rank=0))

        def reset(self) -> None:
            """After Horovod's re-initialisation: this rank's new place, the optimizer's averaging, the loop's
            data and learning rate for the new world size."""
            self.elastic.joined_again(self.optimizer)
            self.loop.on_reset()

    return Keeper


def env_now(hvd: Any) -> LaunchEnv:
    """Who this process is after a reset (horovodrun's variables describe the world it started in)."""
    return LaunchEnv(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), "horovodrun")
