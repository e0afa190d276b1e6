"""Every name of ``horovod.torch`` a script may use: whether the native layer runs it, and its native equivalent.

One table for the layer's refusals (:class:`Unsupported`, one line naming the call and what to use), for
``dpcompare migrate``'s listing and for docs/from-horovod.md. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpcompare.errors import DpcompareError
from dpcompare.versions import docs_page

#: the Horovod release whose semantics the layer reproduces (and the one scripts/setup.sh builds)
HOROVOD_VERSION = "0.28.1"
#: the ways to run one script: real Horovod, the native layer, its DDP port (``dpcompare script --as``)
SCRIPT_ARMS = ("horovod", "native", "ddp")
#: the script arm that runs dpcompare's own layer (no strategy of the catalog: it needs ``--script``)
LAYER_ARM = "native"
#: the script arm that runs the script's DDP port (``dpcompare migrate``), not the script itself
PORT_ARM = "ddp"
_NATIVE_COMMUNICATION = {
    "backward": "fused all-reduce of the gradients, started from per-parameter hooks as each group of gradients "
                "(fixed after step 2 from rank 0's timings) becomes ready",
    "optimizer": "wait for the all-reduces still running, and reduce unused parameters' zero gradients",
}
#: the launcher of each script arm's elastic mode
#: (``compare --script ... --strategies horovod-elastic,native-elastic``):
#: the script under real Horovod Elastic (horovodrun with a host discovery script), under the layer on torchrun's
#: elastic agents, or its DDP port (``ddp-elastic``: migrate's elastic helpers) on torchrun's elastic agents
SCRIPT_ELASTIC = {"horovod": "horovodrun", "native": "torchrun", "ddp": "torchrun"}


def script_elastic_base(name: str) -> str | None:
    """The script arm whose elastic mode ``name`` (``native-elastic``) names, or None."""
    base = name.removesuffix("-elastic")
    return base if name.endswith("-elastic") and base in SCRIPT_ELASTIC else None

#: what results.json records about the script arms that are no strategy of the catalog (horovod and ddp are): the
#: facts of a catalog :class:`~dpcompare.backends.catalog.Entry`, the report's card and threads wording included
SCRIPT_ARM_FACTS: dict[str, dict[str, object]] = {
    "native": {"summary": "dpcompare's horovod.torch on torch.distributed (gloo on CPU, nccl on CUDA), the "
                          "script unchanged",
               "sync_mechanism": _NATIVE_COMMUNICATION["backward"], "communication": _NATIVE_COMMUNICATION,
               "card": ("The native layer: Horovod's API on torch.distributed",
                        "The script's <code>import horovod.torch</code> is dpcompare's layer: "
                        "<code>DistributedOptimizer</code>'s hooks start torch.distributed all-reduces on fusion "
                        "groups as gradients are ready, and <code>step()</code> waits for them, so the waiting is "
                        "counted where Horovod counts it (<strong>optimizer</strong>). There is no background thread "
                        "negotiating: the groups are fixed after the first steps, and gloo's threads run the "
                        "collectives."),
               "threads": "gloo's threads"},
}


@dataclass(frozen=True)
class Call:
    native: str                 # what to write in native PyTorch (DDP, torch.distributed, torchrun)
    supported: bool = True      # does the layer run it
    note: str = ""              # what differs, when something does


class Unsupported(DpcompareError):
    """A Horovod call the native layer does not run: raised at the call, one line, exit code 2 under the runner."""


class UnsupportedImport(Unsupported, ImportError):
    """``import horovod.tensorflow`` and the like: an ImportError too, so ``try: import ... except ImportError``
    in a script behaves as it would where that Horovod part was not built."""


_RANKS = "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE"
_AR = "dist.all_reduce(t) (sums in place), then t /= dist.get_world_size() for Average"
_TIMELINE = ("the layer writes Horovod's timeline format on rank 0 (HOROVOD_TIMELINE=FILE, or start_timeline with "
             "HOROVOD_TIMELINE set before init, as Horovod); no negotiation to show: NEGOTIATE spans are instants")
_ROWS = "split the first dimension as Horovod does: the first rows % size ranks get one row more"
_SETS = "every rank calls it, in the same order, as in Horovod"

#: ``hvd.NAME`` → what it is natively. Names of the optimizer (``optimizer.synchronize``) start with ``optimizer.``.
CALLS: dict[str, Call] = {
    # process facts
    "init": Call('dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo"), started by torchrun, '
                 "and dist.destroy_process_group() registered with atexit, as Horovod shuts down at exit",
                 note="init(process_sets=[...] or \"dynamic\") runs; init(comm=...) (an MPI communicator) is refused"),
    "shutdown": Call("dist.destroy_process_group()"),
    "is_initialized": Call("dist.is_initialized()"),
    "rank": Call("dist.get_rank()"),
    "size": Call("dist.get_world_size()"),
    "local_rank": Call('int(os.environ["LOCAL_RANK"])', note=_RANKS),
    "local_size": Call('int(os.environ["LOCAL_WORLD_SIZE"])', note=_RANKS),
    "cross_rank": Call('dist.get_rank() // int(os.environ["LOCAL_WORLD_SIZE"]) (the node index)'),
    "cross_size": Call('dist.get_world_size() // int(os.environ["LOCAL_WORLD_SIZE"]) (the number of nodes)'),
    "is_homogeneous": Call("True when every node runs as many processes (torchrun --nproc-per-node)"),
    "mpi_built": Call("dist.is_mpi_available()", note="the layer answers False: it talks gloo and NCCL, not MPI"),
    "mpi_enabled": Call("dist.is_mpi_available()", note="the layer answers False"),
    "mpi_threads_supported": Call("no equivalent needed", note="the layer answers False"),
    "gloo_built": Call("dist.is_gloo_available()"),
    "gloo_enabled": Call("dist.is_gloo_available()"),
    "nccl_built": Call("torch.cuda.nccl.version() when dist.is_nccl_available()",
                       note="the layer answers as Horovod does, an int: the NCCL version where it uses NCCL (a GPU "
                            "visible), else 0"),
    "cuda_built": Call("torch.version.cuda is not None", note="the layer answers True where a GPU is visible"),
    "rocm_built": Call("torch.version.hip is not None", note="the layer answers True where a GPU is visible"),
    "ddl_built": Call("no equivalent (IBM DDL)", note="the layer answers False"),
    "ccl_built": Call("no equivalent needed (oneCCL: the torch-ccl plug-in's backend)", note="the layer answers False"),
    "start_timeline": Call("torch.profiler.profile(...) (a Chrome trace of every op, the collectives included)",
                           note=_TIMELINE),
    "stop_timeline": Call("prof.export_chrome_trace(path) at the end of the profiled region", note=_TIMELINE),
    # collectives
    "allreduce": Call(_AR), "allreduce_": Call(_AR), "allreduce_async": Call(_AR + "; async_op=True"),
    "allreduce_async_": Call(_AR + "; async_op=True"),
    "grouped_allreduce": Call("dist.all_reduce on each tensor (or on one flat copy)"),
    "grouped_allreduce_": Call("dist.all_reduce on each tensor"),
    "grouped_allreduce_async": Call("dist.all_reduce(..., async_op=True) on each tensor"),
    "grouped_allreduce_async_": Call("dist.all_reduce(..., async_op=True) on each tensor"),
    "sparse_allreduce_async": Call("dist.all_gather of the indices and the values"),
    "allgather": Call("dist.all_gather(parts, t) then torch.cat(parts) (equal first dimensions)"),
    "allgather_async": Call("dist.all_gather(parts, t, async_op=True)"),
    "grouped_allgather": Call("dist.all_gather on each tensor"),
    "grouped_allgather_async": Call("dist.all_gather(..., async_op=True) on each tensor"),
    "broadcast": Call("dist.broadcast(t.clone(), src=root_rank)"), "broadcast_": Call("dist.broadcast(t, "
                                                                                      "src=root_rank)"),
    "broadcast_async": Call("dist.broadcast(t.clone(), src=root_rank, async_op=True)"),
    "broadcast_async_": Call("dist.broadcast(t, src=root_rank, async_op=True)"),
    "alltoall": Call("dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes)",
                     note="the received splits: all-gather the splits first (the layer does)"),
    "alltoall_async": Call("dist.all_to_all_single(..., async_op=True)"),
    "reducescatter": Call("dist.reduce_scatter(output, list(t.split(rows))), then / size for Average", note=_ROWS),
    "reducescatter_async": Call("dist.reduce_scatter(..., async_op=True)", note=_ROWS),
    "grouped_reducescatter": Call("dist.reduce_scatter on each tensor (or on one flat copy of each rank's rows)"),
    "grouped_reducescatter_async": Call("dist.reduce_scatter(..., async_op=True) on each tensor"),
    "poll": Call("work.is_completed() on the work async_op=True returned"),
    "synchronize": Call("work.wait() on the work async_op=True returned"),
    "join": Call("torch.distributed.algorithms.Join([model]) around the loop",
                 note="as Horovod's: a rank that joined answers the others' hvd.allreduce calls with zeros (their "
                      "allgather and broadcast raise) and join() returns the last rank to join; the "
                      "DistributedOptimizer's gradients are not answered"),
    "barrier": Call("dist.barrier()"),
    # objects and state
    "broadcast_parameters": Call("nothing: DDP(model) broadcasts rank 0's parameters and buffers when it wraps"),
    "broadcast_optimizer_state": Call(
        "nothing when every rank builds the same optimizer; dist.broadcast_object_list to share a loaded state",
        note="on a fresh optimizer Horovod first runs one step() with zero gradients (moves weights under weight "
             "decay, starts Adam's step count at 1); the layer does the same, a DDP port does not"),
    "broadcast_object": Call("dist.broadcast_object_list([obj], src=root_rank)"),
    "allgather_object": Call("dist.all_gather_object(out, obj)"),
    # training
    "DistributedOptimizer": Call(
        "model = DDP(model) and the plain optimizer",
        note="Horovod all-reduces zero gradients for parameters unused in a step; DDP leaves them None"),
    "Compression": Call("ddp.register_comm_hook(None, default_hooks.fp16_compress_hook) for fp16",
                        note="Horovod sums in fp16 and then divides; DDP's hook divides first"),
    "Compressor": Call("a DDP communication hook"),
    "Average": Call("dist.ReduceOp.SUM, then divide by dist.get_world_size()"),
    "Sum": Call("dist.ReduceOp.SUM"), "Min": Call("dist.ReduceOp.MIN"), "Max": Call("dist.ReduceOp.MAX"),
    "Product": Call("dist.ReduceOp.PRODUCT"),
    "Adasum": Call("no native equivalent: DDP averages",
                   note="hvd.allreduce and hvd.grouped_allreduce run it as Horovod's CPU path computes it, at a "
                        "power-of-two number of ranks"),
    "DistributedOptimizer(op=Adasum)": Call(
        "no native equivalent: use Average (DDP's default)", supported=False,
        note="Horovod's Adasum optimizer takes a local step per parameter and sums the parameters' deltas with "
             "Adasum; the layer does not reproduce that optimizer"),
    "SyncBatchNorm": Call("torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) (GPU)"),
    "HorovodInternalError": Call("torch.distributed.DistBackendError"),
    "ProcessSet": Call("dist.new_group(ranks), passed as group= to each collective", note=_SETS),
    "add_process_set": Call("dist.new_group(ranks)", note="needs HOROVOD_DYNAMIC_PROCESS_SETS=1, as Horovod; " + _SETS),
    "remove_process_set": Call("dist.destroy_process_group(group)", note=_SETS),
    "global_process_set": Call("dist.group.WORLD (the default)"),
    "elastic": Call("torchrun --nnodes MIN:MAX --max-restarts N with the script's own checkpoints",
                    note="the layer runs hvd.elastic on torchrun's elastic agent: a commit is written for the "
                         "restarted workers, which resume from it (" + docs_page("elastic") + "); migrate's port does "
                                                                                              "the same "
                         "with helpers it writes (TorchState, ElasticSampler, elastic_run)"),
    # the optimizer's methods
    "optimizer.synchronize": Call("nothing: DDP has averaged the gradients when backward() returns"),
    "optimizer.skip_synchronize": Call("nothing: call optimizer.step() directly"),
    "optimizer.set_backward_passes_per_step": Call("with model.no_sync(): for all but the last micro-batch"),
}

#: ``import horovod.X`` modules the layer answers, and those it refuses (with their native road)
MODULES: dict[str, Call] = {
    "horovod": Call("torch.distributed"),
    "horovod.torch": Call("torch.distributed and DistributedDataParallel"),
    "horovod.tensorflow": Call("tf.distribute.MultiWorkerMirroredStrategy", supported=False),
    "horovod.keras": Call("tf.distribute.MultiWorkerMirroredStrategy", supported=False),
    "horovod.mxnet": Call("no native PyTorch road: port the model to PyTorch first", supported=False),
    "horovod.spark": Call("pyspark.ml.torch.distributor.TorchDistributor", supported=False),
    "horovod.ray": Call("ray.train.torch.TorchTrainer", supported=False),
    "horovod.runner": Call("torchrun, mpirun or `dpcompare script --np N`", supported=False,
                           note="horovod.runner.util.threads.in_thread, which Horovod's test utilities import, runs"),
    "horovod.torch.elastic": Call(CALLS["elastic"].native),
}

#: ``horovod.run(...)`` (the top-level launcher function)
RUN = Call("start the script with torchrun, mpirun or `dpcompare script --np N`", supported=False)


def unsupported(call: str, key: str | None = None) -> Unsupported:
    """The one-line refusal of ``call`` (``hvd.alltoall``, ``hvd.allreduce(op=hvd.Adasum)``...); ``key`` names its
    entry in :data:`CALLS` when the call's own name is not it."""
    key = key or call.split("(")[0].rsplit(".", 1)[-1]
    native = CALLS[key].native if key in CALLS else "torch.distributed"
    return Unsupported(f"{call} is not supported by dpcompare's native Horovod layer; natively: {native}")


def module_refusal(module: str) -> UnsupportedImport:
    top = next((m for m in sorted(MODULES, key=len, reverse=True) if module == m or module.startswith(m + ".")),
               None)
    call = MODULES.get(top or "", Call("torch.distributed", supported=False))
    err = UnsupportedImport(f"import {module}: dpcompare's native Horovod layer covers horovod.torch only; "
                            f"natively: {call.native}")
    err.name = module
    return err
