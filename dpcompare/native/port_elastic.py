"""The port's pass for Horovod Elastic: ``hvd.elastic.run``, ``TorchState`` and ``ElasticSampler`` on torchrun's
elastic agent.

A pass is ``(tree: libcst.Module) -> (tree, notes)``: the tree with its edits (comments and layout kept) and what
the port does differently, one line each. This one replaces the three names by small helpers it writes after the
script's imports (:data:`HELPERS`): a ``TorchState`` whose ``commit()`` has rank 0 write the state (model,
optimizer, samplers, counters) atomically to disk, and which restores the last commit when torchrun has
restarted the workers; an ``ElasticSampler`` that hands out the indices the commit had not yet processed; and
``elastic_run``, which calls the function and removes the commit when it returns. Other ``hvd.elastic`` names
are left as they are (``dpcompare migrate`` then says it cannot port them). Torch-free.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

ELASTIC = "horovod.torch.elastic"
#: Horovod Elastic's names the pass translates → the helper that stands for each in the port
NAMES = {f"{ELASTIC}.run": "elastic_run", f"{ELASTIC}.TorchState": "TorchState",
         f"{ELASTIC}.ElasticSampler": "ElasticSampler"}
#: where the port runs differently from Horovod Elastic (``dpcompare migrate`` lists them)
DIFFERENCES = [
    "hvd.elastic: run the port with torchrun's elastic agent (`torchrun --nnodes MIN:MAX --max-restarts N "
    "--rdzv-backend c10d ...`); Horovod keeps the surviving processes and restores the last commit in memory, "
    "torchrun restarts every worker, which resume from the last state.commit() that rank 0 wrote to disk "
    "($DPCOMPARE_ELASTIC_DIR, a folder every host must share; default: one per torchrun run id in the "
    "temporary folder), so the steps since that commit are redone, also when a host joins",
    "state.register_reset_callbacks: the callbacks run when restarted workers resume from a commit (Horovod "
    "runs them after each reset in the surviving processes); state.check_host_updates() does nothing "
    "(torchrun acts on a new host)",
    "elastic state: the commit keeps what TorchState holds (state_dict() of the model, optimizer and "
    "samplers; the other values must load with torch.load(weights_only=True)), not the random number "
    "generators: dropout and random augmentations differ after a restart",
]

HELPERS = '''

# Horovod Elastic on torchrun's elastic agent (written by dpcompare migrate). torchrun restarts every worker
# after a failure; they resume from the last state.commit(), which rank 0 wrote to elastic_commit_path().
def elastic_commit_path():
    """Where rank 0 keeps the last commit: $DPCOMPARE_ELASTIC_DIR (every host must see it), else a folder of
    this torchrun run's own in the temporary folder."""
    folder = os.environ.get("DPCOMPARE_ELASTIC_DIR") or os.path.join(
        tempfile.gettempdir(), f"port-elastic-{os.environ.get('USER') or os.getuid()}",
        os.environ.get("TORCHELASTIC_RUN_ID", "none"))
    return os.path.join(folder, "commit.pt")  # the name dpcompare's recorder reads


class TorchState:
    """Horovod's TorchState: the model, the optimizer and the values given by name, saved by commit() and
    restored from the last commit when torchrun has restarted the workers."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        values = {"model": model, "optimizer": optimizer, **kwargs}
        self._names = [name for name, value in values.items() if value is not None]
        for name in self._names:
            setattr(self, name, values[name])
        self._reset_callbacks = []
        self.restored = self._restore()

    def _restore(self):
        found = [os.path.exists(elastic_commit_path())]
        torch.distributed.broadcast_object_list(found, src=0)  # rank 0 decides for everyone
        if found[0]:
            if torch.distributed.get_rank() == 0:
                print(f"elastic: resuming from the last commit, {elastic_commit_path()}", file=sys.stderr)
            saved = torch.load(elastic_commit_path(), weights_only=True)
            for name in self._names:
                value = getattr(self, name)
                if hasattr(value, "load_state_dict"):
                    value.load_state_dict(saved[name])
                else:
                    setattr(self, name, saved[name])
        torch.distributed.barrier()  # nobody commits before every rank has read the last commit
        return found[0]

    def commit(self):
        """Rank 0 writes the state: into a temporary file, then renamed over the last commit."""
        if torch.distributed.get_rank() == 0:
            path = elastic_commit_path()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            saved = {}
            for name in self._names:
                value = getattr(self, name)
                saved[name] = value.state_dict() if hasattr(value, "state_dict") else value
            torch.save(saved, f"{path}.tmp")
            os.replace(f"{path}.tmp", path)

    def check_host_updates(self):
        """Nothing to do: torchrun restarts the workers when a host comes or goes."""

    def register_reset_callbacks(self, callbacks):
        """Horovod runs these after a reset; here, when restarted workers have resumed from a commit."""
        self._reset_callbacks.extend(callbacks)
        if self.restored:
            for callback in callbacks:
                callback()


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: this rank's share of the epoch's indices not yet processed (record_batch
    counts them; set_epoch starts a new epoch), in Horovod's order (shuffled with seed + epoch)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def reset(self):
        self.num_replicas = torch.distributed.get_world_size()
        self.rank = torch.distributed.get_rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining) / self.num_replicas)

    def set_epoch(self, epoch):
        self.epoch, self.processed_num = epoch, 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state):
        self.epoch, self.processed_num = state["epoch"], state["processed_num"]
        self.reset()

    def __iter__(self):
        total = self.num_samples * self.num_replicas
        padded = (self.remaining * (total // max(len(self.remaining), 1) + 1))[:total]
        return iter(padded[self.rank:total:self.num_replicas])

    def __len__(self):
        return self.num_samples


def elastic_run(func):
    """Horovod's elastic.run: call func; torchrun, not this wrapper, restarts the workers after a failure. The last
    commit is removed when func returns, so that the next run starts afresh."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        result = func(*args, **kwargs)
        torch.distributed.barrier()
        if torch.distributed.get_rank() == 0 and os.path.exists(elastic_commit_path()):
            os.remove(elastic_commit_path())
        return result
    return wrapper
'''
#: the modules the helpers use, imported after the script's imports when the script does not bind them
HELPER_MODULES = ("functools", "math", "os", "random", "sys", "tempfile", "torch")


class _Rename(cst.CSTTransformer):
    """Every use of a name of :data:`NAMES` (``hvd.elastic.run``, ``elastic.TorchState``, ``ElasticSampler``
    imported from ``horovod.torch.elastic``) becomes its helper's name."""

    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.renamed: set[str] = set()

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom
                         ) -> cst.ImportFrom | cst.RemovalSentinel:
        """``from horovod.torch.elastic import TorchState, X`` keeps X only (the helper stands for TorchState)."""
        module = get_full_name_for_node(original.module) if original.module else None
        if module != ELASTIC or isinstance(original.names, cst.ImportStar):
            return updated
        kept = [a for a in original.names if f"{ELASTIC}.{get_full_name_for_node(a.name)}" not in NAMES]
        if len(kept) == len(original.names):
            return updated
        if not kept:
            return cst.RemoveFromParent()
        return updated.with_changes(names=[*kept[:-1], kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)])

    def _helper(self, node: cst.CSTNode) -> str | None:
        names = {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}
        return next((NAMES[n] for n in sorted(names) if n in NAMES), None)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        helper = self._helper(original)
        if helper is None:
            return updated
        self.renamed.add(helper)
        return cst.Name(helper)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        helper = self._helper(original)
        if helper is not None:
            self.renamed.add(helper)
            return cst.Name(helper)
        return updated


def _bound_modules(tree: cst.Module) -> set[str]:
    """The modules of :data:`HELPER_MODULES` the script binds at module level (``import torch.nn`` binds torch)."""
    bound = set()
    for stmt in tree.body:
        for small in getattr(stmt, "body", ()) if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Import):
                for alias in small.names:
                    if alias.asname is None:
                        bound.add(str(get_full_name_for_node(alias.name)).split(".")[0])
    return bound & set(HELPER_MODULES)


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and \
        any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def _with_helpers(tree: cst.Module) -> cst.Module:
    """The helpers (and the imports they need) after the last import at the top level of ``tree``."""
    missing = [m for m in HELPER_MODULES if m not in _bound_modules(tree)]
    block = cst.parse_module("".join(f"import {m}\n" for m in missing) + HELPERS).body
    body = list(tree.body)
    last = max((i for i, stmt in enumerate(body) if _is_import(stmt)), default=-1)
    after = body[last + 1:]
    if after:  # two blank lines between the helpers and the script's next statement
        lines = list(after[0].leading_lines)
        while lines and lines[0].comment is None:
            lines.pop(0)
        after[0] = after[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *lines])
    return tree.with_changes(body=[*body[: last + 1], *block, *after])


def elastic_pass(tree: cst.Module) -> tuple[cst.Module, list[str]]:
    """``hvd.elastic.run``, ``TorchState`` and ``ElasticSampler`` → helpers for torchrun's elastic agent."""
    rename = _Rename()
    out = MetadataWrapper(tree).visit(rename)
    if not rename.renamed:
        return tree, []
    return _with_helpers(out), list(DIFFERENCES)


def port_elastic_source(source: str) -> tuple[str, list[str]]:
    """:func:`elastic_pass` on a script's text."""
    tree, notes = elastic_pass(cst.parse_module(source))
    return tree.code, notes
