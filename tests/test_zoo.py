"""The zoo (tests/zoo/*.py): plug-ins written the way users write them, each with the traits of real models, each
through one parity command at np=2 across ddp, horovod, zero and fsdp, with the one-process reference.

| plug-in | traits | result |
|---|---|---|
| recommender | dict batch from a collate function, dropout, LayerNorm, frozen embeddings, metric "hit rate" | 0.0 everywhere, single included |
| unused_branch | a head forward never calls; Adam with weight decay | 0.0 everywhere; DDP ran with find_unused_parameters |
| tied_weights | output layer tied to the embedding; a GRU | 0.0 everywhere (FSDP keeps the tied weight in the root) |
| sparse_bag | nn.Embedding(sparse=True), SGD with momentum | horovod and single within 1e-6 of ddp (rows summed in another order), zero 0.0; fsdp refused in one line |
| bert_classifier | transformers BertForSequenceClassification, tiny, random, offline; dropout 0.1 | 0.0 everywhere |
| squeezenet | torchvision.models.squeezenet1_1(num_classes=5), dropout | 0.0 everywhere |
| lightning_classifier | a LightningModule (--workload lightning:...), dropout, StepLR per step | 0.0 everywhere |
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import dpcompare, missing, needs_horovod, needs_mpi, summary

ZOO = Path(__file__).resolve().parent / "zoo"
EVERY = "ddp,horovod,zero,fsdp"
SHORT = ("--steps", "4", "--batch-size", "8", "--threads", "1")


def _needs(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        missing(f"{module} is not installed (the dev extra has it: pip install -e '.[dev]')")


def _parity(tmp_path: Path, workload: str, *extra: str, strategies: str = EVERY) -> dict:
    p = dpcompare("parity", "--np", "2", "--strategies", strategies, "--workload", workload, *SHORT, *extra,
                  "--out", str(tmp_path / "p"))
    res = json.loads((tmp_path / "p" / "parity.json").read_text())
    assert res["passed"] and "PASS" in p.stdout, p.stdout
    assert set(res["diffs"]) == {*strategies.split(",")[1:], "single"}  # the one-process reference ran
    return res


def _exact(res: dict) -> None:
    assert {s: (d["weights_max"], d["loss_max"]) for s, d in res["diffs"].items()} == {
        s: (0.0, 0.0) for s in res["diffs"]}


@needs_mpi
@needs_horovod
def test_recommender_dropout_layernorm_frozen_dict_batch(tmp_path: Path) -> None:
    """Dropout: the one-process reference replays each process's random stream, so it matches at 0.0 too."""
    res = _parity(tmp_path, f"{ZOO / 'recommender.py'}:workload")
    _exact(res)
    assert res["model"]["random"] == ["Dropout"] and res["model"]["frozen"] == ["items.weight"]


@needs_mpi
@needs_horovod
def test_unused_branch_trains_alike_with_weight_decay_and_adam(tmp_path: Path) -> None:
    """DDP finds the unused head by itself (auto); under Adam with weight decay the head, which gets a zero gradient
    under every strategy, moves alike everywhere."""
    res = _parity(tmp_path, f"{ZOO / 'unused_branch.py'}:workload", "--optimizer", "adam", "--lr", "0.01",
                  "--weight-decay", "0.1")
    _exact(res)
    assert res["model"]["unused"] == ["aux_head.weight", "aux_head.bias"]
    ddp = summary(tmp_path / "p" / "ddp")
    assert ddp["comm"]["find_unused_parameters"] is True and ddp["regime"]["find_unused_parameters"] is True
    torch.manual_seed(42)  # the run's seed: the model as every run built it
    from zoo.unused_branch import TwoHeads  # noqa: PLC0415

    start = TwoHeads().aux_head.weight.detach()
    from dpcompare.checkpoint import latest_checkpoint, load_checkpoint

    end = load_checkpoint(latest_checkpoint(tmp_path / "p" / "ddp"))["model"]["aux_head.weight"]
    assert not torch.equal(start, end)  # decayed: a zero gradient, not a skipped one


SEEN = {cls: f"{ZOO / 'grads_seen.py'}:{cls}" for cls in ("HorovodSeen", "DDPSeen")}


@pytest.fixture(scope="module")
def unused_compare(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The unused-branch plug-in compared from the plain command line (no flag) under ddp and horovod, and under the
    test-only strategies that count what each library leaves for the unused head: one compare, one worker job.
    (its folder, its runs by arm)."""
    out = tmp_path_factory.mktemp("unused") / "cmp"
    dpcompare("compare", "--np", "2", "--strategies", ",".join(["ddp", "horovod", *SEEN.values()]), "--workload",
              f"{ZOO / 'unused_branch.py'}:workload", "--epochs", "1", "--max-steps", "4", "--warmup-steps", "1",
              "--repeats", "1", "--min-steps", "0", "--threads", "1", "--workers", "persistent", "--out", str(out))
    results = json.loads((out / "results.json").read_text())
    runs = {r["arm"]: r for r in results["runs"]}
    assert all(r["status"] == "ok" for r in runs.values()), [r["error"] for r in runs.values()]
    return out, runs


@needs_mpi
@needs_horovod
def test_what_each_library_leaves_for_a_parameter_without_gradient(unused_compare: tuple[Path, dict]) -> None:
    """Horovod's synchronize() gives the unused head a zero gradient (all-reduced); DDP leaves it None. dpcompare
    then fills the zeros itself (the parity test above), so both update alike."""
    out, runs = unused_compare
    seen = {cls: {k: summary(out / runs[spec]["dir"])["comm"][k] for k in ("none_grads", "zero_grads")}
            for cls, spec in SEEN.items()}
    assert seen["HorovodSeen"] == {"none_grads": 0, "zero_grads": 2 * 4}  # weight and bias, 4 steps
    assert seen["DDPSeen"] == {"none_grads": 2 * 4, "zero_grads": 0}


@needs_mpi
@needs_horovod
def test_unused_branch_compares_from_the_plain_command_line(unused_compare: tuple[Path, dict]) -> None:
    """No flag: ddp and horovod both train it; the banner, summary.json and the report say DDP ran with
    find_unused_parameters."""
    out, runs = unused_compare
    assert runs["ddp"]["final_train_loss"] == runs["horovod"]["final_train_loss"]
    banner = (out / runs["ddp"]["dir"] / "stdout.log").read_text()
    assert "trainable parameters without a gradient: aux_head.weight, aux_head.bias" in banner
    assert "DDP runs with find_unused_parameters=True" in banner
    assert summary(out / runs["ddp"]["dir"])["comm"]["find_unused_parameters"] is True
    html = (out / "report.html").read_text()
    assert "2 trainable parameters get no gradient (aux_head.weight, aux_head.bias): " \
           f"{SEEN['DDPSeen']}, ddp ran DDP with find_unused_parameters=True" in html  # both DDP arms named


@needs_mpi
def test_a_parameter_unused_only_later_stops_ddp_with_one_line_and_on_fixes_it(tmp_path: Path) -> None:
    spec = f"{ZOO / 'sometimes_unused.py'}:workload"
    args = ("train", "--strategy", "ddp", "--workload", spec, "--epochs", "1", "--max-steps", "4", "--batch-size", "8",
            "--threads", "1", "--no-tensorboard")
    p = dpcompare(*args, "--out", str(tmp_path / "auto"), np=2, check=False)
    assert p.returncode != 0 and "run with --find-unused-parameters on" in p.stderr
    assert "Expected to have finished reduction" not in p.stderr  # not torch's wall of text
    dpcompare(*args, "--find-unused-parameters", "on", "--out", str(tmp_path / "on"), np=2)
    assert summary(tmp_path / "on")["comm"]["find_unused_parameters"] is True


@needs_mpi
@needs_horovod
def test_tied_weights(tmp_path: Path) -> None:
    _exact(_parity(tmp_path, f"{ZOO / 'tied_weights.py'}:workload"))


@pytest.fixture(scope="module")
def sparse(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The sparse plug-in's one parity, traced (2 warm-up steps, then 2 traced): the tests below read its runs."""
    tmp = tmp_path_factory.mktemp("sparse")
    return tmp, _parity(tmp, f"{ZOO / 'sparse_bag.py'}:workload", "--warmup-steps", "2", "--trace", "2",
                        strategies="ddp,horovod,zero")


@needs_mpi
@needs_horovod
def test_sparse_embeddings_under_ddp_horovod_and_zero(sparse: tuple[Path, dict], tmp_path: Path) -> None:
    """Sparse gradients: zero is DDP (0.0); Horovod all-gathers the rows and the one-process reference adds them
    in yet another order: within 1e-6, and parity names the cause."""
    _, res = sparse
    assert res["diffs"]["zero"]["weights_max"] == 0.0
    for s in ("horovod", "single"):
        assert res["diffs"][s]["weights_max"] <= 1e-6
        assert any(c.startswith("sparse gradients") for c in res["diffs"][s]["causes"])
    assert res["model"]["sparse"] == ["words.weight"]
    p = dpcompare("parity", "--np", "2", "--strategies", "ddp,fsdp", "--workload", f"{ZOO / 'sparse_bag.py'}:workload",
                  "--out", str(tmp_path / "f"), check=False)
    assert p.returncode == 2 and "FSDP2 cannot reduce-scatter sparse gradients" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "f").exists()


@needs_mpi
@needs_horovod
def test_sparse_gradients_in_the_trace(sparse: tuple[Path, dict]) -> None:
    """How each library moves the sparse gradient: DDP's sparse all-reduce (gloo gathers the rows), Horovod's two
    all-gathers (indices, values); the dense layers' all-reduce beside them."""
    tmp, _ = sparse
    kinds = {s: summary(tmp / "p" / s)["communication"]["collectives"] for s in ("ddp", "horovod")}
    rows = 8 * 12 * (8 + 32 * 4) * 2  # 96 looked-up rows of 32 floats and their indices, from 2 ranks
    assert set(kinds["ddp"]) == {"all_reduce", "sparse_all_reduce"} and kinds["ddp"]["sparse_all_reduce"]["count"] == 1
    assert 0 < kinds["ddp"]["sparse_all_reduce"]["bytes_per_step"] <= rows  # coalesced: repeated rows once
    assert set(kinds["horovod"]) == {"all_reduce", "all_gather"}
    assert kinds["horovod"]["all_gather"]["bytes_per_step"] == rows  # every looked-up row, repeats included
    assert kinds["ddp"]["all_reduce"]["bytes_per_step"] == kinds["horovod"]["all_reduce"]["bytes_per_step"] == 4752


@needs_mpi
@needs_horovod
def test_bert_classifier_from_transformers(tmp_path: Path) -> None:
    _needs("transformers")
    res = _parity(tmp_path, f"{ZOO / 'bert_classifier.py'}:workload")
    _exact(res)
    assert "Dropout" in res["model"]["random"]


@needs_mpi
@needs_horovod
def test_torchvision_squeezenet(tmp_path: Path) -> None:
    _needs("torchvision")
    res = _parity(tmp_path, f"{ZOO / 'squeezenet.py'}:workload")
    _exact(res)
    assert res["model"]["random"] == ["Dropout"]


@needs_mpi
@needs_horovod
def test_lightning_module_without_the_trainer(tmp_path: Path) -> None:
    _needs("lightning")
    res = _parity(tmp_path, f"lightning:{ZOO / 'lightning_classifier.py'}:LitClassifier")
    _exact(res)
    s = summary(tmp_path / "p" / "ddp")
    assert s["metric"]["name"] == "val_acc" and s["metric"]["higher_is_better"]  # validation_step's first self.log
    row = json.loads((tmp_path / "p" / "ddp" / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(row["metrics"]) == {"val_acc", "val_loss"} and 0 <= row["metrics"]["val_acc"] <= 1
