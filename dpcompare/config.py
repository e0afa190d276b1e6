"""The run configuration shared by ``train``, ``parity`` and ``compare``: one source of truth for options.

Each :class:`TrainConfig` field carries, in its metadata, the flag that sets it, its help, its argparse
type or choices, its group in ``--help`` and whether a resume should report it as changed. The command
line (:mod:`dpcompare.options`), the flags handed to child jobs (``train_argv``) and the resume report
are all derived from these fields, so a new knob is one field here plus the backend code that honours it.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpcompare import argtypes as t
from dpcompare.versions import docs_page

#: the groups of ``--help`` (by concern; dpcompare.cli puts the options a first user needs in a group of their own)
TRAINING, HOW_LONG, WHERE = "the training job", "how long", "where it runs"
KNOBS = "communication knobs (each strategy refuses the ones it cannot honour)"
OUTPUT = "output and checkpoints"
NETWORK = WHERE


def opt(default: Any, help: str | Callable[[], str], *, flag: str | None = None,
        type: Callable[[str], Any] | None = None,
        choices: Callable[[], list[str]] | list[str] | None = None, group: str = TRAINING, resume: bool = False,
        metavar: str | None = None, hidden: bool = False, renamed_from: tuple[str, ...] = (),
        deprecated: str | None = None) -> Any:
    """A config field with its command-line description.

    ``flag`` defaults to ``--field-name``; a boolean field that defaults to True needs a ``--no-...`` flag.
    ``resume=True``: a resumed run that changes this setting says so. ``help``/``choices`` may be callables
    (evaluated when the parser is built) for lists that come from registries. ``renamed_from``: the flag's old
    spellings, which still work for one release with a warning. ``deprecated``: what replaces the flag itself,
    which still works for one release, hidden, with a warning naming it.
    """
    return field(default=default, metadata={"flag": flag, "help": help, "type": type, "choices": choices,
                                            "group": group, "resume": resume, "metavar": metavar,
                                            "hidden": hidden, "renamed_from": renamed_from, "deprecated": deprecated})


def _names(module: str, table: str, intro: str | None = None, kind: type[list] = list) -> Callable[[], Any]:
    """The names in ``module.table``, read when the parser is built (the table imports no torch): a ``kind`` list,
    or with ``intro`` a help text that ends listing them."""
    def names() -> Any:
        found = kind(getattr(importlib.import_module(module), table))
        return found if intro is None else intro + ", ".join(found)
    return names


def _described(module: str, table: str, intro: str = "", outro: str = "") -> Callable[[], str]:
    """--help listing every entry of ``module.table`` (name → (..., one line)) between ``intro`` and ``outro``."""
    def text() -> str:
        rows = getattr(importlib.import_module(module), table).items()
        return intro + "; ".join(f"{n}: {getattr(row, 'summary', row[-1])}" for n, row in rows) + outro
    return text


def _models_help() -> str:
    return (_described("dpcompare.models", "MODELS")() + "; hf:NAME: a Hugging Face architecture with random weights "
            "(needs [hf], never downloads; see `dpcompare workloads`); MODULE:FACTORY or path/to/file.py:FACTORY: "
            "your own nn.Module builder, trained on a built-in --dataset")


def _datasets_help() -> str:
    return (_described("dpcompare.data.catalog", "DATASETS")() + "; "
            + _described("dpcompare.data.catalog", "TEXT_DATASETS")() + "; MODULE:FACTORY: your own (train, test) "
            "datasets for a built-in --model. A language model trains on pydoc unless another text dataset is named")


@dataclass
class TrainConfig:
    # -- training ---------------------------------------------------------------------------------
    strategy: str = opt("single", _described("dpcompare.backends.catalog", "STRATEGIES",
                                             "how gradients are synchronised: ", "; MODULE:CLASS or path/to/file.py:"
                                             "CLASS: your own Strategy subclass "
                                             f"({docs_page('layout', 'how-to-add-a-strategy')})"),
                        type=t.strategy_arg, choices=_names("dpcompare.backends.catalog", "STRATEGIES",
                                                            kind=t.PluginNames), resume=True)
    workload: str | None = opt(None, "your own training job instead of --model/--dataset: a dpcompare Workload (or a "
                                     "function returning one) at MODULE:ATTR or path/to/file.py:ATTR, e.g. "
                                     "my_pkg.bench:workload; see `dpcompare workloads`", type=t.workload_arg,
                               metavar="MODULE:ATTR", resume=True)
    model: str = opt("convnet", _models_help, type=t.model_arg, metavar="MODEL", resume=True)
    dataset: str = opt("digits", _datasets_help, type=t.dataset_arg, metavar="DATASET", resume=True)
    seq_len: int = opt(128, "text datasets: tokens per training sample (the model reads seq-len bytes and predicts "
                            "each next one)", type=t.positive_int, metavar="T", resume=True)
    data_dir: str | None = opt(None, "folder holding mnist/cifar10 in torchvision's layout, or imagefolder's "
                                     "train/<class>/ and val/<class>/ image folders (never downloaded)")
    epochs: int = opt(5, "epochs to train", type=t.nonneg_int, group=HOW_LONG)
    batch_size: int = opt(32, "batch size PER PROCESS; the global batch is this × processes", type=t.positive_int,
                          resume=True)
    lr: float = opt(0.05, "learning rate", type=t.positive_float, resume=True)
    scale_lr: bool = opt(False, "multiply --lr by the number of processes (linear scaling), the same for every "
                                "strategy", resume=True)
    optimizer: str = opt("sgd", "sgd (with --momentum), adam (--weight-decay as an L2 term on every parameter) or "
                                "adamw (decoupled --weight-decay in two parameter groups: decay on every parameter "
                                "of 2 or more dimensions outside a normalisation layer, such as Linear and conv "
                                "weights and embedding tables; no decay on biases, on any other 1-D parameter, nor "
                                "on the parameters of BatchNorm, LayerNorm, GroupNorm, InstanceNorm and RMSNorm "
                                "layers)", choices=["sgd", "adam", "adamw"], resume=True)
    momentum: float = opt(0.9, "SGD momentum", type=t.nonneg_float, resume=True)
    weight_decay: float = opt(0.0, "weight decay (adamw: on its decay group only)", type=t.nonneg_float,
                              resume=True)
    clip_grad_norm: float = opt(0.0, "clip the gradients to this global 2-norm before every optimizer step, taken "
                                     "over the averaged gradients of the whole model on every process (after "
                                     "Horovod's synchronize(), over every shard under zero and fsdp); 0: off",
                                type=t.nonneg_float, metavar="X", resume=True)
    lr_schedule: str = opt("constant", "the learning rate per optimizer step, after --lr-warmup-steps: constant; "
                                       "cosine: torch's CosineAnnealingLR from --lr down to 0 over the run's "
                                       "remaining steps; step: torch's StepLR, × --lr-gamma every --lr-step-every "
                                       "steps", choices=["constant", "cosine", "step"], resume=True)
    lr_warmup_steps: int = opt(0, "first optimizer steps of a linear warm-up (torch's LinearLR) from --lr/(N+1) to "
                                  "--lr, before --lr-schedule (SequentialLR); 0: none", type=t.nonneg_int,
                               metavar="N", resume=True)
    lr_step_every: int = opt(0, "--lr-schedule step: optimizer steps between decays, counted after the warm-up",
                             type=t.nonneg_int, metavar="N", resume=True)
    lr_gamma: float = opt(0.1, "--lr-schedule step: the factor of each decay", type=t.positive_float, metavar="G",
                          resume=True)
    seed: int = opt(42, "seeds weights and sampling", type=int, resume=True)
    width: int = opt(256, "hidden units of mlp", type=t.positive_int, resume=True)
    input_shape: tuple[int, ...] = opt((3, 32, 32), "C,H,W of synthetic samples; imagefolder resizes images to H,W, "
                                                    "C 1 (grayscale) or 3 (RGB)", type=t.shape, resume=True)
    samples: int = opt(1024, "synthetic dataset size", type=t.positive_int)
    augment: bool = opt(False, "cifar10/imagefolder: random crop (pad 4) + horizontal flip, the same for every "
                               "strategy (seeded by --seed, epoch and sample)", resume=True)
    sync_bn: bool = opt(False, "synchronise BatchNorm statistics across processes (torch.nn.SyncBatchNorm / "
                               "hvd.SyncBatchNorm; GPUs only)", resume=True)
    device: str = opt("auto", "auto: one GPU per process when CUDA is available, else CPU",
                      choices=["auto", "cpu", "cuda"], resume=True, group=WHERE)
    deterministic: bool = opt(False, "on a GPU: PyTorch's deterministic algorithms "
                                     "(torch.use_deterministic_algorithms, "
                                     "cuDNN's deterministic mode, CUBLAS_WORKSPACE_CONFIG), so that a rerun gives the "
                                     "same bits; slower. parity turns it on unless --device cpu; no effect on the CPU",
                              resume=True)
    threads: int = opt(0, "torch CPU threads per process; 0: the cores it may use (its CPU affinity) ÷ the processes "
                          "sharing them", type=t.nonneg_int,
                      group=WHERE, metavar="N")
    max_steps: int = opt(0, "stop after this many optimizer steps (0: run every epoch; with --epochs 0: only this)",
                         type=t.nonneg_int, group=HOW_LONG, metavar="N")
    warmup_steps: int = opt(5, "first steps left out of timing", type=t.nonneg_int, group=HOW_LONG,
                            metavar="N")
    min_timed_steps: int = opt(0, "time at least N steps after warm-up: when the epochs give fewer, keep stepping "
                                  "through further batches after the last epoch, for timing only (accuracy and "
                                  "loss stay those of the epochs)", flag="--min-steps", type=t.nonneg_int,
                               metavar="N", group=HOW_LONG)
    eval_every: int = opt(0, "evaluate the test accuracy every K optimizer steps as well as after every epoch (the "
                             "eval curve and --target-accuracy use these points); 0: after every epoch only",
                          type=t.nonneg_int, metavar="K", group=HOW_LONG)
    target_accuracy: float = opt(0.0, "record the training time and steps until the workload's test metric (the "
                                      "test accuracy, a fraction, e.g. 0.95, for the built-in models) first reaches "
                                      "A (at or above it; at or below it for a metric where lower is better) in "
                                      "summary.json's time_to_accuracy_s and steps_to_accuracy; start-up and "
                                      "evaluation time are not counted; 0: off",
                                 type=t.nonneg_float, metavar="A", group=HOW_LONG)
    record_step_loss: bool = opt(False, "write OUT/step_losses.json (for parity)", hidden=True)
    emulate_ranks: int = opt(0, "one process only (parity's reference): take each step as N processes would, "
                                "the global batch as N per-process batches of --batch-size (each --accumulate "
                                "micro-batches, here accumulate = N × K), each under the random state and BatchNorm "
                                "statistics that process would have; 0: off", type=t.nonneg_int, hidden=True,
                             metavar="N")
    count_allreduces: bool = opt(False, "count gradient all-reduces into summary.json's comm (tests; may add a "
                                        "Python hook)", hidden=True)
    # -- communication knobs (translated by the strategy plugins; see dpcompare.knobs) --------------
    grad_compression: str = opt("none", "gradients on the wire: fp16/bf16 cast before the all-reduce (ddp: "
                                        "fp16_compress_hook or dpcompare's bf16 hook; horovod: Compression.fp16 or "
                                        "dpcompare's bf16 Compressor)", choices=["none", "fp16", "bf16"],
                                group=KNOBS, resume=True)
    accumulate: int = opt(1, "micro-batches per optimizer step (gradient accumulation; ddp: no_sync() for K-1 of "
                             "them, horovod: backward_passes_per_step=K); the global batch is batch × processes × K",
                          type=t.positive_int, group=KNOBS, resume=True, metavar="K")
    bucket_mb: float = opt(0.0, "gradient bucket size in MB (ddp: bucket_cap_mb, library default 25; horovod: "
                                "HOROVOD_FUSION_THRESHOLD, library default 128 MiB); 0: the library's default",
                           type=t.nonneg_float, group=KNOBS, resume=True, metavar="MB")
    horovod_cycle_ms: float = opt(0.0, "horovod only: HOROVOD_CYCLE_TIME, ms between fusion cycles; 0: Horovod's "
                                       "default", type=t.nonneg_float, group=KNOBS, resume=True, metavar="MS")
    horovod_ops: str = opt("default", "horovod only: HOROVOD_CPU_OPERATIONS, the CPU all-reduce implementation "
                                      "(gloo needs `horovodrun --gloo`)", choices=["default", "mpi", "gloo"],
                           group=KNOBS, resume=True)
    mpi_allreduce: str = opt("default", _names("dpcompare.launch.openmpi", "MPI_ALLREDUCE",
                                               "horovod over Open MPI only: the all-reduce algorithm Open MPI's "
                                               "tuned collectives use (coll_tuned_allreduce_algorithm with dynamic "
                                               "rules); default: Open MPI's choice by message size, which on "
                                               "a shaped lab link reached 89-105 %% of it at most sizes and "
                                               f"63-66 %% at some ({docs_page('lab')}); one of "),
                             choices=_names("dpcompare.launch.openmpi", "MPI_ALLREDUCE"), group=KNOBS, resume=True,
                             metavar="ALGORITHM")
    adasum: bool = opt(False, "horovod only: combine gradients with Adasum (op=hvd.Adasum) instead of averaging; "
                              "needs a power-of-two number of processes", group=KNOBS, resume=True)
    powersgd_rank: int = opt(0, "ddp only: PowerSGD low-rank gradient compression of this rank (powerSGD_hook, "
                                "lossy, from the second step); 0: off", type=t.nonneg_int, group=KNOBS, resume=True,
                             metavar="R")
    static_graph: bool = opt(False, "ddp only: DistributedDataParallel(static_graph=True)", group=KNOBS,
                             resume=True)
    find_unused_parameters: str = opt("auto", "ddp and zero: DistributedDataParallel(find_unused_parameters=...), "
                                              "which lets trainable parameters go without a gradient at the cost of "
                                              "a traversal of the autograd graph every step; auto: on exactly when "
                                              "the plug-in's pre-check (one batch, forward and backward on the CPU) "
                                              "finds such parameters", choices=["auto", "on", "off"], group=KNOBS,
                                      resume=True)
    amp: str = opt("none", "autocast forward and loss in bf16 or fp16 (fp16 with a gradient scaler on GPU)",
                   choices=["none", "bf16", "fp16"], group=KNOBS, resume=True)
    # -- output and checkpoints -------------------------------------------------------------------
    out: str | None = opt(None, "output folder (default: runs/<strategy>-np<N>)", group=OUTPUT)
    checkpoint_every: int = opt(0, "write OUT/checkpoints/epoch-<N>.pt every N epochs and at the end (0: never)",
                                type=t.nonneg_int, group=OUTPUT, metavar="N")
    keep_last: int = opt(3, "keep the newest N checkpoints in OUT/checkpoints and delete older ones after each write "
                            "(the final one and --keep-every multiples are kept too; 0: keep all) (default: 3)",
                         type=t.nonneg_int, group=OUTPUT, metavar="N")
    keep_every: int = opt(0, "also keep every checkpoint whose epoch is a multiple of M (0: none) (default: 0)",
                          type=t.nonneg_int, group=OUTPUT, metavar="M")
    save_final: bool = opt(False, "write a checkpoint after the last step even without --checkpoint-every",
                           group=OUTPUT)
    checkpoint_steps: int = opt(0, "also write OUT/checkpoints/step-<S>.pt every N optimizer steps, mid-epoch ones "
                                   "included (--resume continues from that very step, at any world size); 0: never",
                                type=t.nonneg_int, group=OUTPUT, metavar="N")
    commit_every: int = opt(0, "elastic run: keep the training state every N optimizer steps, so that a lost host "
                               "costs at most the steps since: horovod (under horovodrun's elastic mode) commits it "
                               "in memory and the survivors roll back to it; ddp writes OUT/checkpoints/step-<S>.pt, "
                               "which torchrun's restart resumes from (with --resume auto); compare's NAME-elastic "
                               "arms set it (default there: 10); 0: not elastic", type=t.nonneg_int, group=OUTPUT,
                            metavar="N")
    step_log: bool = opt(False, "write OUT/steps.jsonl, a line per step (compare --fault watches it)", hidden=True)
    resume: str | None = opt(None, "continue from a checkpoint of any strategy and world size; auto: newest in OUT",
                             group=OUTPUT, metavar="PATH|auto")
    init_from: str | None = opt(None, "start from a state_dict (plain, or DDP's module.-prefixed keys) instead of "
                                      "random weights", group=OUTPUT, metavar="PATH")
    overwrite: bool = opt(False, "replace an earlier run's files in OUT", group=OUTPUT)
    tensorboard: bool = opt(True, "do not write TensorBoard events to OUT/tensorboard (even when --trackers names it)",
                            flag="--no-tensorboard", group=OUTPUT,
                            deprecated="--trackers none (or a list without tensorboard)")
    log: str = opt("tensorboard", _described("dpcompare.argtypes", "TRACKERS",
                                             "where the reporting rank also logs epoch metrics, step-time phases, "
                                             "the config and the versions, comma-separated: ",
                                             "; none: only dpcompare's own files. The one switch for TensorBoard "
                                             "(default: %(default)s)"),
                   type=t.tracker_list, choices=lambda: t.NameList(_names("dpcompare.argtypes", "TRACKERS")()),
                   group=OUTPUT, metavar="LIST", flag="--trackers", renamed_from=("--log",))
    mlflow_uri: str | None = opt(None, "--trackers mlflow: the tracking store: a folder (it gets mlflow.db), a "
                                       "FILE.db, sqlite:///FILE.db or a server's http(s):// address (default: "
                                       "$MLFLOW_TRACKING_URI, else OUT/mlflow.db)",
                                 group=OUTPUT, metavar="URI")
    progress: str = opt("auto", "auto: a progress bar on a terminal, one line per epoch otherwise",
                        choices=["auto", "bar", "lines", "none"], group=OUTPUT)
    trace: int = opt(0, "record N steps after the warm-up on every rank and write OUT/trace.json (Chrome trace: "
                        "phases, gradient-ready ticks, all-reduces; open in ui.perfetto.dev or draw it with "
                        "`dpcompare timeline OUT`); summary.json gains their communication figures",
                     type=t.nonneg_int, group=OUTPUT, metavar="N")
    # -- network ----------------------------------------------------------------------------------
    iface: str | None = opt(None, "network interface for gloo/NCCL (sets GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME); "
                                  "default: the one that reaches rank 0", group=WHERE)
    timeout: float = opt(300.0, "seconds a collective may wait for a lost process before failing; a step that "
                                "runs this long ends a non-elastic run (a peer lost or on a crawling link)",
                         type=t.positive_float, group=WHERE)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["input_shape"] = list(self.input_shape)
        return d


def resume_relevant() -> tuple[str, ...]:
    """Settings whose change on resume is worth a line (others, like --out, are expected to differ)."""
    return ("world_size", *(f.name for f in dataclasses.fields(TrainConfig) if f.metadata.get("resume")))
