"""The report's "Why the phases differ": one card per strategy that ran, never one for an arm that did not.

A card says where the strategy's synchronisation sits and therefore in which phase its communication is
counted. Every fact comes from where the strategy is declared: a built-in strategy's catalog
:class:`~dpcompare.backends.catalog.Entry` (``card``, ``elastic_card``, ``threads``), or what results.json
recorded about an arm (``environment.strategies``: the native layer's card, a plug-in's ``sync_mechanism`` or
summary). :func:`threads_of` names each library's own threads, for the "what took the cores" sentence
(:mod:`dpcompare.report.attribution`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from dpcompare.backends.catalog import ELASTIC_SUFFIX, STRATEGIES, elastic_base

#: the words for the threads of a strategy that names none
OTHER_THREADS = "its library's threads"


def _recorded(results: dict[str, Any] | None) -> dict[str, Any]:
    return ((results or {}).get("environment") or {}).get("strategies") or {}


def threads_of(strategy: str, results: dict[str, Any] | None = None) -> str:
    """What a strategy's other threads are, in words ("Horovod's background thread"): from its catalog entry, else
    from what ``results`` recorded about it; generic for others."""
    entry = STRATEGIES.get(elastic_base(strategy) or strategy)
    said = entry.threads if entry else (_recorded(results).get(strategy) or {}).get("threads")
    return said or OTHER_THREADS


def _card(name: str, recorded: dict[str, Any]) -> str | None:
    base = elastic_base(name)
    entry = STRATEGIES.get(base or name)
    facts = recorded.get(name) or {}
    card = entry.card if entry else facts.get("card")
    if card:
        title, text = card
        if base and entry:
            title, text = f"{title} · {name}", f"{text}</p><p>{entry.elastic_card}"
        return f'<div class="card"><h3>{html.escape(title)}</h3><p>{text}</p></div>'
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
    recorded = _recorded(results)
    made = [c for s in strategies_run(results, arms) if (c := _card(s, recorded))]
    if not made:
        return ""
    intro = ("<p>Every distributed strategy here averages the gradients of all processes every step; with the same "
             "seed, data order and averaging they compute the same model. They differ in <em>where</em> the "
             "synchronisation hooks sit and therefore <em>in which phase</em> the communication, and the waiting for "
             "it, is counted:</p>")
    return intro + '<div class="cols">' + "".join(made) + "</div>"
