"""The Strategy hooks a step is made of, for real at np=2 under every strategy: joint set-up, zero_grad, the
accumulation context, backward, synchronize, clip_grad_norm and optimizer_step (with and without a gradient
scaler), checked against the same step done by hand in float64 on the averaged gradient.

One ``mpirun -np 2`` job runs this file as a script (:func:`main`), every strategy in turn; rank 0 writes
what each measured and the tests assert on it. The fifth strategy is tests/test_fifth_strategy.py's plug-in.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, mpi_env, needs_horovod, needs_mpi, run

WORLD, ACCUMULATE, LR, BATCH = 2, 2, 0.5, 4
FIFTH = "tests/test_fifth_strategy.py:HandAllReduce"


def _model() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def _batch(rank: int, micro: int, step: int) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def _by_hand(ref: Any, step: int, max_norm: float | None) -> float:
    """One step of ``ref`` (float64) on the gradient averaged over every rank's micro-batches; its norm."""
    import torch

    ref.zero_grad()
    for rank in range(WORLD):
        for micro in range(ACCUMULATE):
            x, y = _batch(rank, micro, step)
            (torch.nn.functional.mse_loss(ref(x.double()), y.double()) / ACCUMULATE / WORLD).backward()
    norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ref.parameters()])))
    coef = min(1.0, max_norm / (norm + 1e-6)) if max_norm else 1.0
    with torch.no_grad():
        for p in ref.parameters():
            p -= LR * coef * p.grad
    return norm


def _full(t: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _one_step(s: Any, model: Any, opt: Any, step: int, max_norm: float | None, scaler: Any) -> float | None:
    """One step through the hooks only, as the step runner takes it."""
    import torch

    s.zero_grad(opt)
    for micro in range(ACCUMULATE):
        with s.accumulation_context(model, micro):
            x, y = _batch(s.rank, micro, step)
            s.backward(torch.nn.functional.mse_loss(model(x), y) / ACCUMULATE, scaler)
    norm = s.clip_grad_norm(model, opt, max_norm, scaler) if max_norm else None
    s.optimizer_step(opt, scaler)
    return norm


def check(strategy: str) -> dict[str, Any]:
    """Three steps (plain; clipped; clipped through a gradient scaler) against the hand-made ones."""
    import copy

    import torch

    from dpcompare import backends
    from dpcompare.config import TrainConfig

    s = backends.create(strategy, device="cpu")
    s.configure(TrainConfig(strategy=strategy, accumulate=ACCUMULATE))
    calls = []
    synchronize = s.synchronize
    s.synchronize = lambda opt: (calls.append(1), synchronize(opt))[1]
    with s:
        plain = _model()
        ref = copy.deepcopy(plain).double()
        model, opt = s.setup(plain, torch.optim.SGD(plain.parameters(), lr=LR))
        held = {id(p) for g in opt.param_groups for p in g["params"]}
        s.broadcast_initial_state(model, opt)
        got: dict[str, Any] = {"optimizer_holds_model_params": held == {id(p) for p in model.parameters()},
                               "norms": [], "hand_norms": [], "weight_diff": [], "synchronized": []}
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for step, (max_norm, sc) in enumerate([(None, None), (0.05, None), (0.05, scaler)]):
            calls.clear()
            got["norms"].append(_one_step(s, model, opt, step, max_norm, sc))
            got["hand_norms"].append(_by_hand(ref, step, max_norm))
            got["synchronized"].append(len(calls))
            got["weight_diff"].append(max(float((_full(p).detach().double() - r.detach()).abs().max())
                                          for p, r in zip(s.unwrap_model(model).parameters(), ref.parameters(),
                                                          strict=True)))
        s.barrier()
    return got


def main(strategies: str, out: str) -> None:
    """The job: every strategy in turn, each joining and leaving the process group; rank 0 writes the results."""
    import torch

    from dpcompare.launch.env import detect_launch_env

    torch.set_num_threads(1)
    got = {}
    for name in strategies.split(","):
        got[name] = check(name)
        for var in ("MASTER_ADDR", "MASTER_PORT"):  # the next process group meets at a fresh port
            os.environ.pop(var, None)
    if detect_launch_env().rank == 0:
        Path(out).write_text(json.dumps(got))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One job for every strategy (Horovod only where it imports; its test says why not)."""
    from conftest import horovod_problem

    names = [n for n in STRATEGIES if n != "horovod" or horovod_problem() is None]
    out = tmp_path_factory.mktemp("hooks") / "result.json"
    run(["mpirun", "-np", str(WORLD), "--oversubscribe", "--bind-to", "none", sys.executable, __file__,
         ",".join(names), str(out)], env=mpi_env(), cwd=ROOT, timeout=300)
    return json.loads(out.read_text())


STRATEGIES = ["ddp", "zero", "fsdp", "horovod", FIFTH]


@needs_mpi
@pytest.mark.parametrize("strategy", [pytest.param(n, marks=needs_horovod) if n == "horovod" else n
                                      for n in STRATEGIES])
def test_hooks_step_clip_and_scale_as_by_hand_on_the_averaged_gradient(results, strategy):
    r = results[strategy]
    assert r["optimizer_holds_model_params"]  # setup pointed the optimizer at what the model trains (FSDP: shards)
    assert r["norms"][0] is None
    for norm, hand in zip(r["norms"][1:], r["hand_norms"][1:], strict=True):
        assert norm == pytest.approx(hand, rel=1e-5)  # the global norm of the averaged gradient, every shard in it
        assert hand > 0.05 * 2  # so the clipping changed the step
    assert max(r["weight_diff"]) < 1e-6  # each step landed where the hand-made one did (clipped, unscaled)
    assert r["synchronized"] == [1, 1, 1]  # once per step: clip_grad_norm's synchronize is not repeated by the step


if __name__ == "__main__":
    main(*sys.argv[1:])
