"""Real models' traits without a process group: what the pre-check sees (unused, sparse, frozen, random,
BatchNorm), the one rule for parameters without gradient, the refusals that come before any run, the one-process
reference's replay of the processes' batches, the known causes parity names, the Lightning adapter's refusals."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from dpcompare import backends
from dpcompare.backends.base import fill_missing_grads
from dpcompare.compare.parity import known_causes
from dpcompare.config import TrainConfig
from dpcompare.data.datasets import replay_loader, train_loader
from dpcompare.data.plugins import check_workload, resolve_workload
from dpcompare.data.workload import ModelTraits, Workload
from dpcompare.errors import ConfigError
from dpcompare.report.regime import model_lines

ZOO = Path(__file__).resolve().parent / "zoo"


def traits_of(name: str) -> ModelTraits:
    w = resolve_workload(TrainConfig(workload=f"{ZOO / name}.py:workload")).workload
    assert w.traits is not None  # resolve_workload ran the pre-check and kept what it saw
    return w.traits


def test_the_pre_check_sees_unused_sparse_frozen_and_random() -> None:
    rec = traits_of("recommender")
    assert rec.frozen == ("items.weight",) and rec.random == ("Dropout",) and rec.unused == () and not rec.batchnorm
    assert traits_of("unused_branch").unused == ("aux_head.weight", "aux_head.bias")
    sparse = traits_of("sparse_bag")
    assert sparse.sparse == ("words.weight",) and sparse.random == () and sparse.frozen == ()
    convnet = resolve_workload(TrainConfig(model="convnet")).workload  # a built-in is not checked on resolve ...
    assert convnet.traits is None and check_workload(convnet).batchnorm  # ... but can be


def test_sparse_gradients_need_an_optimizer_that_takes_them() -> None:
    spec = f"{ZOO / 'sparse_bag.py'}:workload"
    for bad in ({"optimizer": "adam"}, {"weight_decay": 0.01}):
        with pytest.raises(ConfigError, match=r"words.weight get sparse gradients .* use --optimizer sgd without"):
            resolve_workload(TrainConfig(workload=spec, **bad))  # type: ignore[arg-type]
    resolve_workload(TrainConfig(workload=spec))  # SGD with momentum takes them


def test_the_pre_check_leaves_the_random_stream_alone() -> None:
    torch.manual_seed(3)
    before = torch.get_rng_state()
    traits_of("recommender")  # its dropout drew random numbers inside the check
    assert torch.equal(before, torch.get_rng_state())


def test_a_dict_batch_must_come_as_inputs_and_target() -> None:
    w = Workload("dicts", build_model=lambda: nn.Linear(2, 1), build_data=lambda: ([torch.zeros(2)] * 4,) * 2,
                 loss=nn.functional.mse_loss, metrics=(), collate=lambda xs: {"x": torch.stack(xs), "y": xs[0]},
                 source="dicts.py:workload")
    with pytest.raises(ConfigError, match=r"make the collate function return \(inputs, target\), where inputs may "
                                          r"be a dict of tensors"):
        check_workload(w)


def test_a_parameter_without_gradient_gets_a_zero_one_and_a_frozen_one_is_left_alone() -> None:
    used, unused, frozen = (nn.Parameter(torch.ones(2)) for _ in range(3))
    frozen.requires_grad_(False)
    used.grad = torch.full((2,), 3.0)
    opt = torch.optim.SGD([used, unused, frozen], lr=0.1)
    fill_missing_grads(opt)
    assert torch.equal(used.grad, torch.full((2,), 3.0)) and torch.equal(unused.grad, torch.zeros(2))
    assert frozen.grad is None


def test_refusals_before_any_process_group() -> None:
    unused, sparse = ModelTraits(unused=("aux.weight",)), ModelTraits(sparse=("emb.weight",))
    off = TrainConfig(find_unused_parameters="off")
    with pytest.raises(ConfigError, match=r"--find-unused-parameters off, but .* \(aux.weight\): DDP would stop"):
        backends.check_model("ddp", unused, off)
    with pytest.raises(ConfigError, match="--find-unused-parameters off"):
        backends.check_model("zero", unused, off)
    backends.check_model("ddp", unused, TrainConfig())  # auto: DDP looks for them
    with pytest.raises(
        ConfigError, match="--strategy horovod cannot honour it; only --strategy ddp or --strategy zero"
    ):
        backends.check_config("horovod", TrainConfig(find_unused_parameters="on"), 2)
    with pytest.raises(ConfigError, match="FSDP2 cannot reduce-scatter sparse gradients"):
        backends.check_model("fsdp", sparse, TrainConfig())
    with pytest.raises(ConfigError, match="DDP's communication hooks take dense buckets"):
        backends.check_model("ddp", sparse, TrainConfig(grad_compression="fp16"))
    backends.check_model("fsdp", None, TrainConfig())  # not checked: nothing to refuse
    with pytest.raises(ConfigError, match="--emulate-ranks is for one process"):
        backends.check_config("ddp", TrainConfig(emulate_ranks=2, accumulate=2), 2)


def test_replay_loader_gives_each_ranks_batches_in_turn_and_draws_like_one_process() -> None:
    ds = torch.utils.data.TensorDataset(torch.arange(40.0))
    replay, samplers = replay_loader(ds, 4, ranks=2, accumulate=2, seed=7)
    ranks = [train_loader(ds, 4, r, 2, 7)[0] for r in range(2)]
    samplers.set_epoch(1)
    for lo in ranks:
        lo.sampler.set_epoch(1)
    torch.manual_seed(0)
    got = [b[0].tolist() for b in replay]
    after_replay = torch.get_rng_state()
    torch.manual_seed(0)
    per_rank = [[b[0].tolist() for b in lo] for lo in ranks]
    # one process's loader draws once per epoch: the replay as well (rank 1's iterator under a forked stream)
    torch.manual_seed(0)
    iter(ranks[0])
    assert torch.equal(after_replay, torch.get_rng_state())
    assert len(replay) == len(got) == 8  # 5 batches per rank → 2 steps of 2 micro-batches each, for 2 ranks
    assert got == [*per_rank[0][0:2], *per_rank[1][0:2], *per_rank[0][2:4], *per_rank[1][2:4]]


def test_parity_names_the_known_causes() -> None:
    base = TrainConfig(grad_compression="fp16")
    assert known_causes("horovod", "ddp", base, 2, {}, ModelTraits()) == [
        "fp16 compression rounds the exchanged gradients"]
    causes = known_causes("single", "ddp", TrainConfig(), 2, {"comm": {"diverged_at_step": 3}},
                          ModelTraits(sparse=("e",)))
    assert causes[0].startswith("random operations (dropout): from step 3") and causes[1].startswith("sparse")
    assert known_causes("horovod", "ddp", TrainConfig(), 4, {"device": "cuda:0"}, ModelTraits()) == [
        "summation order: sums of more than two terms grouped differently",
        "non-deterministic CUDA kernels (atomic adds in some backward passes)"]
    assert known_causes("zero", "ddp", TrainConfig(), 2, {"device": "cpu"}, ModelTraits()) == []


def test_parity_reference_replays_the_processes_or_says_why_not() -> None:
    from dpcompare.compare.parity import _single

    a = argparse.Namespace(single=True, np=2, out="p")
    one, note = _single(a, TrainConfig(accumulate=3), ModelTraits(random=("Dropout",)))
    assert note is None and (one.emulate_ranks, one.accumulate, one.batch_size) == (2, 6, 32)
    one, note = _single(a, TrainConfig(sync_bn=True), ModelTraits(random=("Dropout",), batchnorm=True))
    assert one is None and "random masks (Dropout) come from one random stream" in note
    one, note = _single(a, TrainConfig(sync_bn=True), ModelTraits(batchnorm=True))
    assert note is None and (one.emulate_ranks, one.batch_size) == (0, 64)


def test_the_report_says_what_the_model_made_the_strategies_do() -> None:
    runs = [{"arm": "ddp", "regime": {"unused_parameters": ["a.w", "a.b"], "find_unused_parameters": True,
                                      "sparse_parameters": []}},
            {"arm": "horovod", "regime": {"unused_parameters": ["a.w", "a.b"], "find_unused_parameters": None,
                                          "sparse_parameters": ["e.w"]}}]
    unused, sparse = model_lines(runs)
    assert unused.startswith("2 trainable parameters get no gradient (a.w, a.b): ddp ran DDP with "
                             "find_unused_parameters=True")
    assert sparse.startswith("sparse gradients (e.w): DDP all-reduces them sparse")
    assert model_lines([{"arm": "ddp", "regime": {}}]) == ()


# -- the Lightning adapter ------------------------------------------------------------------------------------

LIT = '''
import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def data():
    x = torch.randn(32, 4)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)


class Base(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 2)

    def training_step(self, batch, i):
        x, y = batch
        return {"loss": nn.functional.cross_entropy(self.net(x), y)}

    def validation_step(self, batch, i):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]

    def train_dataloader(self):
        return data()

    def val_dataloader(self):
        return data()


class Manual(Base):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False


class UsesTrainer(Base):
    def training_step(self, batch, i):
        self.trainer.global_step
        return super().training_step(batch, i)


class TwoOptimizers(Base):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.Adam(self.parameters())]


class NoData(Base):
    train_dataloader = pl.LightningModule.train_dataloader
'''


@pytest.fixture
def lit(tmp_path: Path) -> Path:
    try:
        import lightning  # noqa: F401
    except ImportError:
        from conftest import missing

        missing("lightning is not installed (pip install -e '.[lightning]'; the dev extra has it)")
    path = tmp_path / "lit.py"
    path.write_text(LIT)
    return path


def _lightning(path: Path, cls: str, **settings: object) -> Workload:
    return resolve_workload(TrainConfig(workload=f"lightning:{path}:{cls}", **settings)).workload  # type: ignore[arg-type]


def test_lightning_module_becomes_a_workload(lit: Path) -> None:
    w = _lightning(lit, "Base", epochs=2)
    assert [m.name for m in w.metrics] == ["val_loss"] and not w.metric.higher_is_better
    model = w.build_model()
    opt = w.build_optimizer(model, 0.05)  # configure_optimizers' own optimizer (its lr, not --lr)
    assert opt.param_groups[0]["lr"] == 0.1
    sched = w.build_scheduler(opt, 8)  # Lightning's default interval: per epoch, here every 4 steps
    for _ in range(4):
        opt.step()
        sched.step()
    assert sched.inner.last_epoch == 1
    x, y = w.collate([(torch.zeros(4), 0), (torch.ones(4), 1)])
    assert len(y) == 2 and float(w.loss(model(x), y).detach()) > 0
    assert "lightning." + next(iter(dict(model.lightning.named_parameters()))) in model.state_dict()


@pytest.mark.parametrize(("cls", "says"), [
    ("Manual", r"automatic_optimization = False \(manual optimization"),
    ("UsesTrainer", "training_step uses self.trainer"),
    ("NoData", r"NoData.train_dataloader\(\) failed .*; define train_dataloader\(\) on the module"),
])
def test_lightning_trainer_only_features_are_refused_in_one_line(lit: Path, cls: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says) as e:
        _lightning(lit, cls)
    assert "\n" not in str(e.value)


def test_lightning_refusals_at_set_up(lit: Path) -> None:
    w = _lightning(lit, "TwoOptimizers")
    with pytest.raises(ConfigError, match="configure_optimizers\\(\\) gave 2 optimizers"):
        w.build_optimizer(w.build_model(), 0.1)
    w = _lightning(lit, "Base", max_steps=5)
    opt = w.build_optimizer(w.build_model(), 0.1)
    with pytest.raises(ConfigError, match="steps every epoch .* with --max-steps"):
        w.build_scheduler(opt, 5)


def test_lightning_workload_flag_round_trips() -> None:
    from dpcompare.options import train_argv

    cfg = TrainConfig(workload="lightning:my_pkg.models:LitModel")
    assert train_argv(cfg)[:2] == ["--workload", "lightning:my_pkg.models:LitModel"]
    assert dataclasses.replace(cfg).workload.startswith("lightning:")
