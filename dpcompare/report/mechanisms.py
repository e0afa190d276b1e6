"""The report's "Why the phases differ": one card per strategy that ran, never one for an arm that did not.

A card says where the strategy's synchronisation sits and therefore in which phase its communication is
counted. The built-in strategies, the native layer (``compare --script``'s ``native`` arm) and the elastic modes
have a card here, keyed by the name the runs record; a plug-in strategy's card is what its class declared
(``environment.strategies``: its ``sync_mechanism`` or summary). ``THREADS`` names each library's own threads,
for the "what took the cores" sentence (:mod:`dpcompare.report.attribution`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from dpcompare.backends.catalog import ELASTIC_SUFFIX, elastic_base

#: name → (title, HTML paragraph): where each strategy's hooks sit and in which phase the waiting is counted
CARDS: dict[str, tuple[str, str]] = {
    "ddp": ("PyTorch DDP: hooks on the model",
            "<code>DistributedDataParallel</code> wraps the <em>model</em>. An autograd hook on every parameter "
            "all-reduces a bucket (25&nbsp;MB by default) asynchronously as soon as its gradients are ready during "
            "<code>loss.backward()</code>, while autograd computes the earlier layers' gradients. "
            "<code>backward()</code> returns only when every bucket is reduced: the communication that did not "
            "overlap is counted in <strong>backward</strong>, and <code>optimizer.step()</code> is a local update. "
            "With buffers (BatchNorm statistics) DDP also broadcasts rank 0's buffers at the start of every "
            "<strong>forward</strong>. gloo runs the collectives on its own threads."),
    "horovod": ("Horovod: hooks in the optimizer",
                "<code>hvd.DistributedOptimizer</code> wraps the <em>optimizer</em>. Per-parameter hooks enqueue an "
                "asynchronous all-reduce when a gradient is ready; Horovod's <em>background thread</em> negotiates "
                "which tensors are ready on every rank and fuses them (tensor fusion, 128&nbsp;MB, every "
                "HOROVOD_CYCLE_TIME). <code>backward()</code> returns without waiting; <code>optimizer.step()</code> "
                "calls <code>synchronize()</code> first, so the waiting is counted in <strong>optimizer</strong>. "
                "The background thread runs all the time, polling every cycle: on a machine with few cores it "
                "competes with the compute of every phase, the forward included."),
    "zero": ("ZeRO-1: DDP, then a sharded update",
             "DDP's hooks on the model (bucketed all-reduce in <strong>backward</strong>, buffers broadcast in "
             "forward), with torch's <code>ZeroRedundancyOptimizer</code>: each rank keeps the optimizer state of "
             "its shard of the parameters, updates only that shard and broadcasts it to the others, a collective "
             "counted in <strong>optimizer</strong>."),
    "fsdp": ("FSDP2: parameters gathered per layer",
             "<code>fully_shard</code> on each layer and the root: parameters, gradients and optimizer state are "
             "sharded. Each layer's parameters are all-gathered before its <strong>forward</strong> and again in "
             "<strong>backward</strong>, where its gradients are reduce-scattered; the optimizer updates the local "
             "shards without communicating."),
    "native": ("The native layer: Horovod's API on torch.distributed",
               "The script's <code>import horovod.torch</code> is dpcompare's layer: "
               "<code>DistributedOptimizer</code>'s hooks start torch.distributed all-reduces on fusion groups as "
               "gradients are ready, and <code>step()</code> waits for them, so the waiting is counted where "
               "Horovod counts it (<strong>optimizer</strong>). There is no background thread negotiating: the "
               "groups are fixed after the first steps, and gloo's threads run the collectives."),
    "single": ("One process: no communication",
               "The baseline: one process with the global batch, nothing communicated; every phase is compute."),
}

#: an elastic mode's paragraph, after its base strategy's card
ELASTIC: dict[str, str] = {
    "ddp": ("Elastic (torchrun): every process is restarted with the survivors when a host is lost, and resumes "
            "from the newest checkpoint (written every --commit-every steps)."),
    "horovod": ("Elastic (horovodrun, gloo controller): the surviving processes stay, roll back to their last "
                "in-memory commit (every --commit-every steps) and carry on at the smaller world size."),
}

#: name → the library's own threads, as the "what took the cores" sentence names them
THREADS: dict[str, str] = {
    "horovod": "Horovod's background thread",
    "ddp": "gloo's threads",
    "zero": "gloo's threads",
    "fsdp": "gloo's threads",
    "native": "gloo's threads",
}


def threads_of(strategy: str) -> str:
    """What a strategy's other threads are, in words ("Horovod's background thread"); generic for others."""
    return THREADS.get(elastic_base(strategy) or strategy, "its library's threads")


def _card(name: str, recorded: dict[str, Any]) -> str | None:
    base = elastic_base(name)
    card = CARDS.get(base or name)
    if card is not None:
        title, text = card
        if base:
            title, text = f"{title} · {name}", f"{text}</p><p>{ELASTIC.get(base, '')}"
        return f'<div class="card"><h3>{html.escape(title)}</h3><p>{text}</p></div>'
    facts = recorded.get(name) or {}
    said = facts.get("sync_mechanism") or facts.get("summary")
    if not said:
        return None
    return f'<div class="card"><h3>{html.escape(name)}</h3><p>{html.escape(str(said))}</p></div>'


def strategies_run(results: dict[str, Any], arms: Sequence[str]) -> list[str]:
    """The strategies of the arms, as the runs recorded them (elastic arms as ``ddp-elastic``), in arm order."""
    by_arm: dict[str, str] = {}
    for r in results.get("runs", []):
        name = str(r.get("strategy"))
        by_arm.setdefault(str(r.get("arm") or name), name + (ELASTIC_SUFFIX if r.get("elastic") else ""))
    return list(dict.fromkeys(by_arm.get(a, a) for a in arms))


def cards(results: dict[str, Any], arms: Sequence[str]) -> str:
    """The cards of the strategies that ran, two to a row; empty when none is known."""
    recorded = (results.get("environment") or {}).get("strategies") or {}
    made = [c for s in strategies_run(results, arms) if (c := _card(s, recorded))]
    if not made:
        return ""
    intro = ("<p>Every distributed strategy here averages the gradients of all processes every step; with the same seed, data "
             "order and averaging they compute the same model. They differ in <em>where</em> the synchronisation "
             "hooks sit and therefore <em>in which phase</em> the communication, and the waiting for it, is "
             "counted:</p>")
    return intro + '<div class="cols">' + "".join(made) + "</div>"
