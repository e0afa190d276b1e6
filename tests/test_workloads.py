"""Workloads without the training loop: the GPT sizes, the pydoc corpus, the language-model metrics, plug-ins
that resolve or are refused in one line, the flags that carry them to child jobs, and `dpcompare workloads`."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import pytest
import torch

from dpcompare import models
from dpcompare.config import TrainConfig
from dpcompare.data import text
from dpcompare.data.plugins import check_workload, resolve_workload
from dpcompare.data.workload import Workload
from dpcompare.errors import ConfigError
from dpcompare.models.gpt import SIZES, config_for, parameter_count
from dpcompare.options import add_config_options, config_from_args, train_argv

from conftest import DPCOMPARE, dpcompare, missing, mpi_env, needs_mpi, run

# (layers, width, vocabulary) → parameters: 12·d² + 13·d per block, the tables, the final LayerNorm
EXPECTED = {"gpt-tiny": 858_880, "gpt-mini": 4_870_144, "gpt-small": 10_844_160, "gpt-base": 25_613_312,
            "gpt2-small": 86_039_040}


@pytest.mark.parametrize("name", list(SIZES))
def test_gpt_sizes_have_the_parameters_they_claim(name: str) -> None:
    c = config_for(name)
    assert parameter_count(c) == EXPECTED[name]
    if c.n_embd <= 384:  # build the small ones (the big ones' count is the same formula, checked above)
        m = models.build_model(name, (32,), 256, seed=0)
        assert sum(p.numel() for p in m.parameters()) == EXPECTED[name]
        assert m(torch.zeros(2, 32, dtype=torch.long)).shape == (2, 32, 256)
    millions = f"{EXPECTED[name] / 1e6:.2g}" if EXPECTED[name] < 1e6 else f"{EXPECTED[name] / 1e6:.1f}"
    assert f"{millions} M parameters" in models.MODELS[name][1]
    # GPT-2 small's own vocabulary of 50257 tokens gives its published 124 M
    assert parameter_count(config_for("gpt2-small", 50257)) == 124_439_808


def test_gpt_weights_depend_on_the_seed_only() -> None:
    a = models.build_model("gpt-tiny", (16,), 256, seed=7)
    torch.manual_seed(123)  # the global generator does not matter
    b = models.build_model("gpt-tiny", (16,), 256, seed=7)
    c = models.build_model("gpt-tiny", (16,), 256, seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.wte, c.wte)


def test_gpt_is_causal_and_refuses_a_longer_context() -> None:
    m = models.build_model("gpt-tiny", (16,), 256, seed=0)
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 256  # later tokens cannot change earlier predictions
    with torch.no_grad():
        assert torch.equal(m(x)[0, :10], m(y)[0, :10])
    with pytest.raises(ConfigError, match="--seq-len 300 is longer than gpt-tiny's context of 256"):
        models.build_model("gpt-tiny", (300,), 256)


def test_pydoc_corpus_is_the_python_reference_as_bytes() -> None:
    from pydoc_data.topics import topics

    train, test = text.pydoc_corpus(64)
    total = sum(len(t.encode()) for t in topics.values())
    assert len(train.tokens) + len(test.tokens) == total + 2 * 2 * (len(topics) - 1)  # "\n\n" between topics
    assert 0.09 < len(test.tokens) / total < 0.11
    assert len(train) == (len(train.tokens) - 1) // 64
    x, y = train[3]
    assert x.dtype == torch.long and x.shape == (64,) and torch.equal(x[1:], y[:-1])
    assert bytes(train[0][0].tolist()).decode().startswith(topics[sorted(topics)[0]][:64])
    assert torch.equal(text.pydoc_corpus(64)[1][5][1], test[5][1])  # the same split every time
    with pytest.raises(IndexError):
        train[len(train)]


def test_language_model_metrics() -> None:
    logits = torch.zeros(2, 5, 256)  # uniform: perplexity 256
    target = torch.randint(0, 256, (2, 5))
    total, count = text.PERPLEXITY.batch(logits, target)
    assert count == 10 and math.isclose(text.PERPLEXITY.finish(total / count), 256, rel_tol=1e-5)
    assert not text.PERPLEXITY.higher_is_better and text.TOKEN_ACCURACY.higher_is_better
    logits[0, :, 65] = 10
    target[0] = 65
    assert text.TOKEN_ACCURACY.batch(logits, target)[0] >= 5


def test_text_workload_builds_and_refuses_mismatches() -> None:
    w = resolve_workload(TrainConfig(model="gpt-tiny", dataset="tokens", seq_len=32, samples=64)).workload
    assert [m.name for m in w.metrics] == ["perplexity", "token accuracy"] and w.source == "builtin"
    check_workload(w)
    train, test = w.build_data()
    assert len(train) == 56 and len(test) == 8
    job = resolve_workload(TrainConfig(model="gpt-tiny"))  # the default dataset for LMs, in the run's config too
    assert job.workload.name == "gpt-tiny on pydoc" and job.cfg.dataset == "pydoc"
    with pytest.raises(ConfigError, match="use a text --dataset"):
        resolve_workload(TrainConfig(model="gpt-tiny", dataset="mnist"))
    with pytest.raises(ConfigError, match="use a language --model"):
        resolve_workload(TrainConfig(model="mlp", dataset="pydoc"))


PLUGIN = '''
import torch, torch.nn.functional as F
from dpcompare.data.workload import Metric, Workload

def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    ds = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    return ds, ds

MSE = Metric("mse", higher_is_better=False, batch=lambda o, y: (float(F.mse_loss(o, y, reduction="sum")), y.numel()))
workload = Workload("regression", lambda: torch.nn.Linear(4, 1), _data, F.mse_loss, (MSE,))

def make():
    return workload

def make_for(cfg):
    return Workload("regression", lambda: torch.nn.Linear(4, cfg.width), _data, F.mse_loss, (MSE,))

def wrong():
    return 42

def boom():
    raise RuntimeError("no GPU here")

def build(input_shape, num_classes):
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(input_shape[-1] * input_shape[-2], num_classes))

def tokens(cfg):
    from dpcompare.data.text import random_tokens
    return random_tokens(cfg.seq_len, 32)
'''


@pytest.fixture
def plugin(tmp_path: Path) -> str:
    path = tmp_path / "bench.py"
    path.write_text(PLUGIN)
    return str(path)


def test_plugin_forms_resolve(plugin: str) -> None:
    for attr in ("workload", "make"):
        w = resolve_workload(TrainConfig(workload=f"{plugin}:{attr}")).workload
        assert isinstance(w, Workload) and w.name == "regression" and w.source == f"{plugin}:{attr}"
    w = resolve_workload(TrainConfig(workload=f"{plugin}:make_for", width=1)).workload
    assert w.build_model().out_features == 1
    # only the model, on a built-in dataset; only the data, for a built-in model
    w = resolve_workload(TrainConfig(model=f"{plugin}:build", dataset="digits")).workload
    assert w.metric.name == "accuracy" and w.build_model()[1].out_features == 10 and "model" in w.source
    w = resolve_workload(TrainConfig(model="gpt-tiny", dataset=f"{plugin}:tokens", seq_len=16)).workload
    assert w.metric.name == "perplexity" and len(w.build_data()[0]) == 28
    # a Workload given from Python: checked, named by where it came from, the config's own --model ignored
    given = resolve_workload(TrainConfig(workload=f"{plugin}:workload")).workload
    job = resolve_workload(TrainConfig(model="gpt-tiny"), given=dataclasses.replace(given, source="builtin"))
    assert job.workload.source == "python:regression" and job.cfg.dataset == "pydoc"
    with pytest.raises(ConfigError, match="got int; expected a Workload"):
        resolve_workload(TrainConfig(), given=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("spec", "says"), [
    ("nowhere:thing", "--workload nowhere:thing: cannot import 'nowhere'"),
    ("{plugin}:nothing", "has no 'nothing'"),
    ("{plugin}:wrong", "gave int 42; expected a dpcompare Workload"),
    ("{plugin}:boom", "failed when called with 0 argument(s): RuntimeError: no GPU here"),
    ("{plugin}:MSE", "gave Metric"),
    ("{dir}/absent.py:workload", "no file"),
])
def test_plugin_refusals_are_one_line(plugin: str, spec: str, says: str) -> None:
    spec = spec.format(plugin=plugin, dir=Path(plugin).parent)
    with pytest.raises(ConfigError) as e:
        resolve_workload(TrainConfig(workload=spec))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_plugin_whose_output_does_not_fit_its_loss(tmp_path: Path) -> None:
    (tmp_path / "misfit.py").write_text(PLUGIN + "\nbad = Workload('bad', lambda: torch.nn.Linear(4, 3), _data, "
                                                 "F.mse_loss, (MSE,))\n")
    with pytest.raises(ConfigError) as e:
        resolve_workload(TrainConfig(workload=f"{tmp_path / 'misfit.py'}:bad"))
    msg = str(e.value)
    assert "misfit.py:bad: its loss on the model's output (shape (2, 3)) and the target (shape (2, 1)) failed" in msg
    assert "\n" not in msg


def test_importable_module_plugin_and_a_failing_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_bench_pkg.py").write_text(PLUGIN)
    (tmp_path / "broken_bench_pkg.py").write_text("import torch\nraise ImportError('needs apex')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_workload(TrainConfig(workload="my_bench_pkg:workload")).workload.source == "my_bench_pkg:workload"
    with pytest.raises(ConfigError, match="importing broken_bench_pkg failed: ImportError: needs apex"):
        resolve_workload(TrainConfig(workload="broken_bench_pkg:workload"))


def test_plugin_flags_reach_child_jobs(plugin: str) -> None:
    """compare, parity and launch rebuild a child's flags from the config: the plug-in and --seq-len survive."""
    cfg = TrainConfig(workload=f"{plugin}:workload", seq_len=48, model="hf:gpt2", dataset="pydoc")
    argv = train_argv(cfg)
    assert argv[argv.index("--workload") + 1] == f"{plugin}:workload" and "--seq-len" in argv
    p = argparse.ArgumentParser()
    add_config_options(p)
    assert config_from_args(p.parse_args(argv)) == cfg
    with pytest.raises(SystemExit):
        p.parse_args(["--model", "nonsense"])


def test_slurm_script_carries_the_plugin(plugin: str, tmp_path: Path) -> None:
    out = tmp_path / "job.sbatch"
    dpcompare("slurm", "--nodes", "1", "--tasks-per-node", "2", "--time", "00:10:00", "--out-file", str(out), "--",
              "train",
              "--strategy", "ddp", "--workload", f"{plugin}:workload")
    assert f"--workload {plugin}:workload" in out.read_text()


def test_workloads_command_lists_builtins_and_explains_plugins() -> None:
    p = dpcompare("workloads")
    for word in ("gpt-tiny", "gpt2-small", "pydoc", "tokens", "hf:gpt2", "perplexity", "--workload",
                 "--model my_pkg.models:build", "dpcompare.train"):
        assert word in p.stdout, word
    assert "--workload my_pkg.bench:workload" in dpcompare("train", "--help").stdout


@needs_mpi
def test_train_with_a_missing_plugin_is_one_line_under_mpirun(tmp_path: Path) -> None:
    p = run(["mpirun", "-np", "2", "--oversubscribe", DPCOMPARE, "train", "--workload", "nowhere:thing",
             "--out", str(tmp_path / "r")], check=False, env=mpi_env(), cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.startswith("dpcompare")]  # mpirun adds its banner
    assert "Traceback" not in p.stderr and lines == ["dpcompare train: error: --workload nowhere:thing: cannot import "
                                                     "'nowhere' (ModuleNotFoundError: "
                     "No module named 'nowhere'); give a module on PYTHONPATH or in this folder, or a "
                     "path/to/file.py"], p.stderr


def test_parity_refuses_to_compare_one_strategy_with_nothing(tmp_path: Path) -> None:
    p = dpcompare("parity", "--np", "2", "--strategies", "ddp", "--powersgd-rank", "2", "--out", str(tmp_path / "p"),
                  check=False)
    assert p.returncode == 2
    assert "parity needs two runs to compare but --strategies ddp gives only ddp" in p.stderr
    assert "powersgd_rank has no meaning there" in p.stderr and not (tmp_path / "p").exists()
    p = dpcompare("parity", "--np", "2", "--strategies", "ddp", "--model", "mlp", "--no-single",
                  "--out", str(tmp_path / "p"), check=False)
    assert p.returncode == 2 and "(--no-single)" in p.stderr


def _transformers() -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        missing("transformers is not installed (pip install -e '.[hf]'; the dev extra has it)")


def test_hf_architectures_build_offline_with_random_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    _transformers()
    from dpcompare.models import HF_ARCHITECTURES, hf

    def no_network(*a: object, **k: object) -> None:
        raise AssertionError("tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    c = hf.hf_config("gpt2")
    assert (c.n_layer, c.n_embd, c.vocab_size, c.resid_pdrop) == (12, 768, 50257, 0.0)
    assert hf.hf_config("bert-base-uncased").is_decoder
    # the same code path on small shapes (building GPT-2's 124 M parameters takes ~20 s here)
    monkeypatch.setitem(HF_ARCHITECTURES, "gpt2", ("GPT2Config", "GPT2LMHeadModel",
                                                   {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 300,
                                                    "bos_token_id": 0, "eos_token_id": 0}, ""))
    monkeypatch.setitem(HF_ARCHITECTURES, "bert-base-uncased", (
        "BertConfig", "BertLMHeadModel", {"is_decoder": True, "hidden_size": 32, "num_hidden_layers": 1,
                                          "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 300}, ""))
    for name in ("gpt2", "bert-base-uncased"):
        w = resolve_workload(TrainConfig(model=f"hf:{name}", dataset="tokens", seq_len=16, samples=16, seed=3)).workload
        check_workload(w)
        a, b = w.build_model(), w.build_model()
        assert a(torch.zeros(2, 16, dtype=torch.long)).shape == (2, 16, 300)
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    with pytest.raises(ConfigError, match="vocabulary of 300 tokens cannot hold the dataset's 356"):
        models.build_model("hf:gpt2", (16,), 256 + 100)


@pytest.mark.parametrize(("name", "says"), [
    ("meta-llama/Llama-2-7b-hf", "a Hugging Face hub id would need a download"),
    ("gpt2-xl", "'gpt2-xl' is not an architecture dpcompare can build from transformers' code"),
])
def test_hf_names_that_need_a_download_are_refused(name: str, says: str) -> None:
    from dpcompare.models import hf

    with pytest.raises(ConfigError) as e:
        hf.refuse_unknown(name)
    assert says in str(e.value) and "never downloads" in str(e.value) and "hf:gpt2" in str(e.value)


def test_import_dpcompare_stays_free_of_torch_and_names_the_api() -> None:
    code = ("import sys, dpcompare; assert 'torch' not in sys.modules; f = dpcompare.train; "
            "assert f.__module__ == 'dpcompare.api' and 'torch' not in sys.modules; print('ok')")
    assert run([sys.executable, "-c", code]).stdout.strip() == "ok"


def test_api_refuses_unknown_settings_and_compares_run_folders(tmp_path: Path) -> None:
    import json

    import dpcompare

    with pytest.raises(ConfigError, match="unknown setting\\(s\\) colour"):
        dpcompare.train(None, strategy="single", colour="red")
    for name, strategy, loss in (("a", "ddp", 1.5), ("b", "horovod", 1.5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps({
            "strategy": strategy, "world_size": 2, "final_train_loss": loss, "final_metric": 12.5,
            "metric": {"name": "perplexity", "higher_is_better": False}, "samples_per_sec": 100.0,
            "timing": {"step_ms_median": 20.0}}))
    rows = dpcompare.compare_runs([tmp_path / "a", tmp_path / "b"])
    assert [r["strategy"] for r in rows] == ["ddp", "horovod"] and {r["metric"] for r in rows} == {"perplexity"}
    with pytest.raises(ConfigError, match="no readable summary.json"):
        dpcompare.compare_runs([tmp_path])
