"""Strategy registry, models and datasets (no processes started)."""

import sys

import pytest
import torch

from dpcompare import backends, models
from dpcompare.backends.base import Strategy
from dpcompare.data.datasets import build_dataset, eval_loader, train_loader
from dpcompare.errors import ConfigError
from dpcompare.launch.rendezvous import Iface, choose_master_address, iface_for


def test_registry_lists_the_three_strategies():
    assert {"ddp", "horovod", "single"} <= set(backends.names())
    assert all(issubclass(backends.get(n), Strategy) for n in backends.names())


def test_unknown_strategy_is_a_config_error():
    with pytest.raises(ConfigError, match="choose from"):
        backends.get("nope")


def test_missing_library_gives_the_install_command(monkeypatch):
    from dpcompare.backends import horovod

    def no_horovod() -> None:
        raise ImportError("No module named 'horovod'")

    monkeypatch.setattr(horovod, "_hvd", no_horovod)  # as if `import horovod.torch` failed
    with pytest.raises(ConfigError) as e:
        backends.create("horovod")
    assert horovod.INSTALL_HINT in str(e.value) and "make setup" in str(e.value)
    assert "No module named 'horovod'" in str(e.value)


def test_single_strategy_is_a_no_op():
    s = backends.create("single")
    with s:
        assert (s.rank, s.world_size, s.is_main, s.device.type) == (0, 1, True, "cpu")
        m = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        assert s.setup(m, opt) == (m, opt)
        assert float(s.all_reduce(3.0, "sum")) == 3.0
        assert s.all_gather_floats([1.0, 2.0]) == [[1.0, 2.0]]


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32), (1, 28, 28)])
def test_convnet_is_sized_to_its_input(shape):
    m = models.build_model("convnet", shape, 10)
    assert m(torch.zeros(2, *shape)).shape == (2, 10)
    assert models.has_batchnorm(m)


def test_mlp_width_sets_the_hidden_size():
    m = models.build_model("mlp", (1, 8, 8), 10, width=32)
    assert m(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    assert sum(p.numel() for p in m.parameters()) == 64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10
    assert not models.has_batchnorm(m)


def test_the_run_seed_decides_the_initial_weights(tmp_path, monkeypatch):
    """What a run does before joining anyone (``prepare``: seed, data, then model) builds the same initial weights
    for the same --seed whatever the process's random state was, and other weights for another seed."""
    from dpcompare.config import TrainConfig
    from dpcompare.launch.env import LaunchEnv
    from dpcompare.training.loop import prepare

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # leave this test process's threads alone

    def initial(seed: int, before: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(before)  # whatever ran earlier in the process
        cfg = TrainConfig(model="convnet", dataset="synthetic", input_shape=(1, 8, 8), samples=16, seed=seed,
                          out=str(tmp_path / f"s{seed}-{before}"))
        return prepare(cfg, LaunchEnv(), None).model.state_dict()

    a, b, c = initial(7, before=1), initial(7, before=2), initial(8, before=1)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("build", [lambda: models.build_model("resnet18", (3, 32, 32), 10),
                                   lambda: build_dataset("mnist", "/nonexistent")])
def test_vision_extra_missing_is_a_clear_error(build, monkeypatch):
    """As on the lean cpu flavour, where torchvision does not import: a one-line hint, not a traceback."""
    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[vision\]'"):
        build()


def test_unknown_model_and_dataset():
    with pytest.raises(ConfigError, match="unknown model"):
        models.build_model("nope", (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="unknown dataset"):
        build_dataset("nope")


def test_digits_split_is_fixed_and_real():
    a, b = build_dataset("digits"), build_dataset("digits")
    assert (len(a.train), len(a.test), a.input_shape, a.num_classes) == (1437, 360, (1, 8, 8), 10)
    assert torch.equal(a.test.tensors[0], b.test.tensors[0])
    assert float(a.train.tensors[0].max()) == 1.0


def test_digits_cache_holds_scikit_learns_split_and_is_rebuilt_when_damaged(tmp_path, monkeypatch):
    from dpcompare.data import datasets as data

    monkeypatch.setenv("DPCOMPARE_CACHE", str(tmp_path))
    made = build_dataset("digits")  # no cache yet: scikit-learn splits, the split is written
    (cached,) = tmp_path.glob("digits-sklearn-*.npz")
    ref = data._digits_split()
    assert torch.equal(made.train.tensors[0], torch.from_numpy(ref["xtr"]))
    read = build_dataset("digits")  # from the cache
    for got, want in ((read.train, "tr"), (read.test, "te")):
        assert torch.equal(got.tensors[0], torch.from_numpy(ref[f"x{want}"]))
        assert torch.equal(got.tensors[1], torch.from_numpy(ref[f"y{want}"])) and got.tensors[1].dtype == torch.int64
    cached.write_bytes(b"damaged")
    again = build_dataset("digits")
    assert torch.equal(again.test.tensors[0], torch.from_numpy(ref["xte"])) and cached.stat().st_size > 1000


def test_synthetic_has_the_requested_shape():
    d = build_dataset("synthetic", shape=(2, 4, 4), samples=80)
    assert d.input_shape == (2, 4, 4) and len(d.train) + len(d.test) == 80
    assert d.train[0][0].shape == (2, 4, 4)


def test_rank_batches_together_are_the_global_batch():
    """The k-th batches of N ranks, taken together, are one process's k-th batch of N× the size."""
    ds = build_dataset("digits").train
    world, b = 2, 16
    single, s_sampler = train_loader(ds, b * world, 0, 1, seed=3)
    ranks = [train_loader(ds, b, r, world, seed=3) for r in range(world)]
    for epoch in (0, 1):
        s_sampler.set_epoch(epoch)
        for _, sampler in ranks:
            sampler.set_epoch(epoch)
        assert len(single) == len(ranks[0][0])
        for (xs, _), *per_rank in zip(single, *(loader for loader, _ in ranks), strict=True):
            union = torch.cat([x for x, _ in per_rank])
            key = lambda t: sorted(map(tuple, t.flatten(1).tolist()))  # noqa: E731
            assert key(union) == key(xs)


def test_eval_shards_cover_the_test_set_exactly_once():
    ds = build_dataset("digits").test
    seen = [y for r in range(3) for _, ys in eval_loader(ds, r, 3) for y in ys.tolist()]
    assert sorted(seen) == sorted(ds.tensors[1].tolist())


def test_batch_larger_than_the_shard_is_refused():
    with pytest.raises(ConfigError, match="batch-size"):
        train_loader(build_dataset("digits").train, 5000, 0, 2, seed=0)


def test_master_address_choice():
    a = [Iface("lo", "127.0.0.1", "255.0.0.0"), Iface("eth0", "10.250.0.1", "255.255.255.0")]
    b = [Iface("lo", "127.0.0.1", "255.0.0.0"), Iface("veth1", "10.250.0.2", "255.255.255.0")]
    assert choose_master_address([a, a]) == "127.0.0.1"  # one host
    assert choose_master_address([a, b]) == "10.250.0.1"
    assert iface_for("10.250.0.1", b) == "veth1"
    assert iface_for("127.0.0.1", b) == "lo"
    assert iface_for("localhost", b) == "lo"  # torchrun sets MASTER_ADDR=localhost
    assert iface_for("no-such-host.invalid", b) is None
