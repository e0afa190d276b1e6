"""``dpcompare predict``: the α-β formulas, each schedule on hand-made compute profiles, the trace reader and
the command on a hand-made trace (no torch, no MPI)."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest

from dpcompare.argtypes import parse_rate_bits
from dpcompare.errors import ConfigError
from dpcompare.prediction import strategies, sweep
from dpcompare.prediction.command import parse_host_counts
from dpcompare.prediction.network import Link, Network, load_calibration, parse_duration
from dpcompare.prediction.profile import PROBE_APPLY_BELOW, PROBE_MIN_STEPS, UNTRACED_MODES, Grad, Profile
from dpcompare.prediction.schedule import MB, Knobs, fill

from conftest import dpcompare

MS = 1e-3


def profile(grads, backward, forward=2 * MS, optimizer=1 * MS, strategy="ddp", **kw) -> Profile:
    return Profile(run="hand-made", strategy=strategy, sharded=False, world_size=1, data=0.0, forward=forward,
                   backward=backward, optimizer=optimizer, grads=[Grad(n, r, b) for n, r, b in grads], **kw)


def net(hosts=2, mib_ms=2.0, alpha=0.0) -> Network:
    """A link on which moving 1 MiB takes ``mib_ms`` ms (so an all-reduce of N MiB at n=2 takes N·mib_ms)."""
    return Network(hosts, Link(alpha, MB / (mib_ms * MS)))


# -- the α-β model ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 8])
def test_alpha_beta_formulas(n):
    link, nbytes = Link(alpha=5e-6, bandwidth=1e9), 1e8
    assert link.time("all_reduce", nbytes, n) == pytest.approx(2 * (n - 1) * 5e-6 + 2 * (n - 1) / n * 0.1)
    assert link.time("all_gather", nbytes, n) == pytest.approx((n - 1) * 5e-6 + (n - 1) / n * 0.1)
    assert link.time("reduce_scatter", nbytes, n) == link.time("all_gather", nbytes, n)
    assert link.time("broadcast", nbytes, n) == pytest.approx(math.log2(n) * 5e-6 + 0.1)
    assert link.time("all_reduce", nbytes, 1) == 0.0
    assert Network(n, link).cost("all_reduce", nbytes) == link.time("all_reduce", nbytes, n)


def test_hierarchy_prices_the_host_link_once_and_the_inside_on_the_fast_link():
    inter, intra = Link(5e-6, 25e9 / 8), Link(1e-6, 300e9)
    net8 = Network(2, inter, per_host=4, intra=intra)
    assert net8.ranks == 8
    expected = (
        intra.time("reduce_scatter", 1e8, 4) + inter.time("all_reduce", 1e8, 2) + intra.time("all_gather", 1e8, 4)
    )
    assert net8.cost("all_reduce", 1e8) == pytest.approx(expected)
    # one host of 4 ranks: only the intra-host part
    assert net8.with_hosts(1).cost("all_reduce", 1e8) == pytest.approx(intra.time("all_reduce", 1e8, 4), rel=1e-9)


def test_units():
    assert parse_rate_bits("25gbit") == 25 * 10**9 and parse_rate_bits("200Mbit/s") == 2 * 10**8
    assert parse_rate_bits("300gbyte") == 2400 * 10**9 and Link.of(0.0, 25 * 10**9).bandwidth == 25e9 / 8
    assert parse_duration("5us") == pytest.approx(5e-6) and parse_duration("0.2ms") == pytest.approx(2e-4)
    assert parse_host_counts("2,4,8,...,1024") == [2 ** k for k in range(1, 11)]
    assert parse_host_counts("1,3,...,27") == [1, 3, 9, 27] and parse_host_counts("4, 2") == [2, 4]
    for bad in ("25gbps", "fast", "0gbit"):
        with pytest.raises(ConfigError, match="unit"):
            parse_rate_bits(bad)
    with pytest.raises(ConfigError, match="--host-counts"):
        parse_host_counts("2,...")


def test_fill_never_splits_a_gradient_and_closes_at_the_cap():
    grads = [Grad(str(i), i, b * MB) for i, b in enumerate([0.5, 0.7, 3, 30, 1])]
    groups = fill(grads, [1 * MB, 25 * MB])
    assert [[g.name for g in b] for b in groups] == [["0", "1"], ["2", "3"], ["4"]]


# -- the schedules ----------------------------------------------------------------------------------------
def test_ddp_two_buckets_one_hidden():
    # a 1 MiB gradient ready at 1 ms fills the first (1 MB) bucket: all-reduced 1–3 ms, inside backward;
    # a 4 MiB one ready when backward ends (10 ms) fills the second: 8 ms, all exposed
    p = profile([("b", 1 * MS, 1 * MB), ("a", 10 * MS, 4 * MB)], backward=10 * MS)
    s = strategies.schedule("ddp")(p, Knobs(first_bucket_mb=1)).predict(net())
    assert s.ops == 2 and s.detail["buckets"] == 2
    assert s.compute == pytest.approx(13 * MS)
    assert s.exposed == pytest.approx(8 * MS) and s.hidden == pytest.approx(2 * MS)
    assert s.step == pytest.approx(21 * MS)
    # fp16 halves both; without a small first bucket both gradients share one, all exposed
    half = strategies.schedule("ddp")(p, Knobs(first_bucket_mb=1, grad_compression="fp16")).predict(net())
    assert half.exposed == pytest.approx(4 * MS) and half.hidden == pytest.approx(1 * MS)
    one = strategies.schedule("ddp")(p, Knobs()).predict(net())
    assert one.ops == 1 and one.exposed == pytest.approx(10 * MS) and one.hidden == pytest.approx(0.0, abs=1e-12)


def test_ddp_one_big_bucket_hides_nothing():
    p = profile([("c", 1 * MS, 0.25 * MB), ("b", 2 * MS, 0.25 * MB), ("a", 10 * MS, 4 * MB)], backward=10 * MS)
    s = strategies.schedule("ddp")(p, Knobs()).predict(net())
    assert s.ops == 1 and s.hidden == pytest.approx(0.0, abs=1e-12) and s.exposed == pytest.approx(9 * MS)


def test_ddp_broadcasts_buffers_in_forward():
    p = profile([("a", 1 * MS, 1 * MB)], backward=10 * MS, buffer_bytes=0.5 * MB)
    s = strategies.schedule("ddp")(p, Knobs()).predict(net())
    assert s.ops == 2 and s.exposed == pytest.approx(0.5 * 2 * MS)  # the broadcast: N/B, never hidden


def test_horovod_fusion_merges_three_tensors():
    p = profile([("c", 0.1 * MS, 1 * MB), ("b", 0.2 * MS, 1 * MB), ("a", 0.3 * MS, 1 * MB)], backward=5 * MS,
                strategy="horovod")
    s = strategies.schedule("horovod")(p, Knobs(horovod_cycle_ms=1)).predict(net())
    assert s.detail["cycles"] == 1 and s.detail["fused_allreduces"] == 1
    # the cycle wakes at 1 ms, one 3 MiB all-reduce (6 ms) ends at 7 ms; backward's compute ends at 5 ms
    assert s.detail["wait_in_step_ms"] == pytest.approx(2.0)
    assert s.exposed == pytest.approx(2 * MS) and s.hidden == pytest.approx(4 * MS)
    # a 2 MB fusion buffer takes two all-reduces of 2 and 1 MiB
    small = strategies.schedule("horovod")(p, Knobs(horovod_cycle_ms=1, horovod_fusion_mb=2)).predict(net())
    assert small.detail["fused_allreduces"] == 2 and small.comm == pytest.approx(6 * MS)


@pytest.mark.parametrize("config, device, backend", [
    ({}, "cpu", "mpi"), ({"mpi_allreduce": "recursive-doubling"}, "cpu", "mpi-rd"),
    ({"mpi_allreduce": "ring"}, "cpu", "mpi-ring"), ({"horovod_ops": "gloo"}, "cpu", "gloo"), ({}, "cuda:0", "nccl")])
def test_horovod_prices_the_library_and_algorithm_its_run_used(config, device, backend):
    """``--mpi-allreduce recursive-doubling`` is priced with `lab bench`'s mpi-rd record, not Open MPI's default."""
    p = profile([("a", 0.1 * MS, 1 * MB)], backward=1 * MS, strategy="horovod", config=config, device=device)
    assert strategies.schedule("horovod")(p, Knobs()).backend() == backend
    slow = Network(2, Link(0.0, MB / MS), calibrated={("mpi", "all_reduce"): (0.0, 0.5)})
    ms = strategies.schedule("horovod")(p, Knobs(horovod_cycle_ms=1)).predict(slow).comm / MS
    assert ms == pytest.approx(2.0 if backend == "mpi" else 1.0)  # only Open MPI's default record is slow


def test_horovod_fusion_never_exceeds_its_threshold():
    from dpcompare.prediction.horovod import fuse

    grads = [Grad(str(i), 0.0, b * MB) for i, b in enumerate([1, 3, 0.5, 0.5, 1, 0.25])]
    assert [[g.name for g in b] for b in fuse(grads, 2 * MB)] == [["0"], ["1"], ["2", "3", "4"], ["5"]]


def test_horovod_cycle_splits_late_tensors_into_a_second_allreduce():
    p = profile([("c", 0.1 * MS, 1 * MB), ("b", 0.2 * MS, 1 * MB), ("a", 3.5 * MS, 1 * MB)], backward=4 * MS,
                strategy="horovod")
    s = strategies.schedule("horovod")(p, Knobs(horovod_cycle_ms=1)).predict(net())
    assert s.detail["cycles"] == 2 and s.detail["fused_allreduces"] == 2
    # first: 1 → 5 ms (2 MiB); the late tensor is ready at 3.5 ms but the thread is busy: 5 → 7 ms
    assert s.detail["wait_in_step_ms"] == pytest.approx(3.0)


def test_horovod_negotiation_costs_latency_per_cycle():
    p = profile([("a", 0.1 * MS, 1 * MB)], backward=4 * MS, strategy="horovod")
    fast = strategies.schedule("horovod")(p, Knobs()).predict(net(hosts=8, alpha=0))
    slow = strategies.schedule("horovod")(p, Knobs()).predict(net(hosts=8, alpha=10e-6))
    assert slow.comm - fast.comm == pytest.approx(2 * 3 * 10e-6 + 2 * 7 * 10e-6)


def test_zero_adds_the_parameter_gather_and_shrinks_the_optimizer():
    p = profile([("a", 10 * MS, 4 * MB)], backward=10 * MS, optimizer=8 * MS)
    ddp = strategies.schedule("ddp")(p, Knobs()).predict(net(hosts=4))
    zero = strategies.schedule("zero")(p, Knobs()).predict(net(hosts=4))
    gather = Link(0.0, MB / (2 * MS)).time("all_gather", 4 * MB, 4)
    assert zero.step == pytest.approx(ddp.step - 6 * MS + gather)
    assert zero.ops == ddp.ops + 1


def test_fsdp_gathers_twice_and_scatters_once_per_unit():
    grads = [("l2.bias", 1 * MS, 0.5 * MB), ("l2.weight", 1 * MS, 0.5 * MB), ("l1.weight", 6 * MS, 1 * MB)]
    p = profile(grads, backward=6 * MS, strategy="fsdp")
    s = strategies.schedule("fsdp")(p, Knobs()).predict(net())
    assert s.detail["units"] == 2 and s.ops == 6
    # per unit (1 MiB): two all-gathers and a reduce-scatter at n=2, each (n−1)/n · 1 MiB = 1 ms
    assert s.comm == pytest.approx(6 * MS)
    assert s.step > s.compute


def test_efficiency_falls_with_hosts_and_the_80_percent_answer():
    p = profile([("b", 2 * MS, 2 * MB), ("a", 10 * MS, 8 * MB)], backward=10 * MS)
    hosts = parse_host_counts("2,4,...,1024")
    c = sweep.curve(p, "ddp", Knobs(), Network(1, Link(5e-6, 25e9 / 8)), hosts, "ddp")
    eff = [c.efficiency(s) for s in c.steps]
    assert all(a >= b for a, b in zip(eff, eff[1:], strict=False)) and eff[-1] < eff[0] <= 1.0
    assert c.below(0.8) == next(s.hosts for s in c.steps if c.efficiency(s) < 0.8)
    assert c.below(0.0) is None


def test_advice_names_a_bucket_that_helps():
    # ten 2 MiB gradients, one a millisecond, fp16 on the wire (1 MiB each, 0.2 ms at n=2): a 25 MB bucket
    # fills only when backward ends (2 ms exposed); a 12.5 MB one is all-reduced from 7 ms, inside backward
    p = profile([(f"g{i}", (i + 1) * MS, 2 * MB) for i in range(10)], backward=10 * MS)
    c = sweep.curve(p, "ddp", Knobs(bucket_mb=25, grad_compression="fp16"), net(mib_ms=0.2), [2], "ddp")
    line = sweep.advise(c, p, net(mib_ms=0.2), 0.8)
    assert line.startswith("ddp at 2 hosts: --bucket-mb 12.5 would cut exposed communication from 2.00 to 0.60 ms")
    c = sweep.curve(p, "ddp", Knobs(bucket_mb=8, grad_compression="bf16"), net(mib_ms=0.2), [2], "ddp")
    assert "none of --bucket-mb, --grad-compression" in sweep.advise(c, p, net(mib_ms=0.2), 0.8)


# -- reading traces, the command ----------------------------------------------------------------------------
def fake_run(folder, strategy="ddp", with_bytes=True, world_size=2, steps=3, slower=1.0, untraced=(0, 0.0)):
    """A trace.json + summary.json as `train --trace` writes them: per rank and step, phases, 3 gradient ticks
    (``slower``: every phase that many times longer); ``untraced``: (steps after the traced window, their
    forward in ms) per rank."""
    events = [{"name": "model_buffers", "ph": "M", "pid": 0, "args": {"bytes": 1024}}]
    sizes = {"fc2.bias": 40, "fc2.weight": 4 * MB, "fc1.weight": 8 * MB}
    for rank in range(world_size):
        for k in range(steps):
            t0 = k * 30_000.0 + rank * 10
            phases = [
                (n, d * slower)
                for n, d in (("data", 1000), ("forward", 4000), ("backward", 12_000), ("optimizer", 3000))
            ]
            events.append({"name": f"step {k}", "cat": "step", "ph": "X", "ts": t0, "dur": 20_000, "pid": rank,
                           "tid": 0, "args": {"step": k}})
            t = t0
            for name, dur in phases:
                events.append({"name": name, "cat": "phase", "ph": "X", "ts": t, "dur": dur, "pid": rank, "tid": 0,
                               "args": {"step": k}})
                if name == "backward":
                    for (pname, b), off in zip(sizes.items(), (1000, 5000, 10_000), strict=True):
                        ev = {"name": pname, "cat": "grad_ready", "ph": "i", "s": "t", "ts": t + off, "pid": rank,
                              "tid": 1}
                        if with_bytes:
                            ev["args"] = {"bytes": b}
                        events.append(ev)
                    events.append({"name": "all-reduce bucket 0", "cat": "allreduce", "ph": "X", "ts": t + 10_500,
                                   "dur": 1000, "pid": rank, "tid": 100,
                                   "args": {"bytes": 12 * MB, "tensors": list(sizes)}})
                t += dur
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trace.json").write_text(json.dumps({"traceEvents": events, "otherData": {
        "strategy": strategy, "world_size": world_size, "batch_size": 32,
        "untraced_steps": [{"rank": r, "steps": untraced[0], "phases_ms": {"forward": untraced[1]}}
                           for r in range(world_size) if untraced[0]]}}))
    (folder / "summary.json").write_text(json.dumps({"strategy": strategy, "world_size": world_size,
                                                     "device": "cpu", "config": {"bucket_mb": 0.0}}))
    return folder


def test_profile_reads_phases_ticks_and_bytes(tmp_path):
    p = strategies.profile(fake_run(tmp_path / "r"))
    assert (p.forward, p.backward, p.optimizer, p.data) == pytest.approx((4 * MS, 10 * MS, 3 * MS, 1 * MS))
    assert [(g.name, round(g.ready * 1e3, 3), g.nbytes) for g in p.grads] == [
        ("fc2.bias", 1.0, 40), ("fc2.weight", 5.0, 4 * MB), ("fc1.weight", 10.0, 8 * MB)]
    assert p.buffer_bytes == 1024 and p.batch == 32 and not p.notes
    old = strategies.profile(fake_run(tmp_path / "old", with_bytes=False))  # before ticks carried bytes
    assert [g.nbytes for g in old.grads] == [4 * MB] * 3 and "bucket bytes" in old.notes[0]


def test_the_tracing_s_own_cost_is_taken_out_where_it_slowed_the_run_and_steps_ran_after_the_traced_window(tmp_path):
    """Traced forward 4 ms, the 16 steps after the window 3 ms (0.75, under 0.9: the tracing slowed the run): by
    default (auto) every phase, ready moment and bootstrap row is 0.75 times as long and the note says so; never
    keeps the compute as traced and says the ratio. At 0.95 auto leaves the compute alone and says nothing, always
    scales it; with too few untraced steps the compute stays as traced."""
    run = fake_run(tmp_path / "r", untraced=(16, 3.0))
    p = strategies.profile(run)
    assert (p.data, p.forward, p.backward, p.optimizer) == pytest.approx((0.75 * MS, 3 * MS, 7.5 * MS, 2.25 * MS))
    assert [round(g.ready * 1e3, 3) for g in p.grads] == [0.75, 3.75, 7.5]
    assert p.resampled(np.random.default_rng(0)).forward == pytest.approx(3 * MS)
    assert p.measured["probe"] == {"mode": "auto", "ratio": pytest.approx(0.75), "applied": True}
    assert "×0.75" in p.notes[-1]
    kept = strategies.profile(run, untraced="never")
    assert kept.forward == pytest.approx(4 * MS) and kept.measured["probe"]["applied"] is False
    assert "0.75×" in kept.notes[-1] and "--untraced-compute auto" in kept.notes[-1]
    alike = fake_run(tmp_path / "alike", untraced=(16, 3.8))  # 0.95: noise, as traced unless always
    assert strategies.profile(alike).forward == pytest.approx(4 * MS) and not strategies.profile(alike).notes
    assert strategies.profile(alike, untraced="always").forward == pytest.approx(3.8 * MS)
    few = strategies.profile(fake_run(tmp_path / "few", untraced=(PROBE_MIN_STEPS - 1, 3.0)), untraced="always")
    assert few.forward == pytest.approx(4 * MS) and few.notes[-1].startswith("compute as traced")
    assert few.measured["probe"] == {"mode": "always", "ratio": None, "applied": False}


def test_untraced_compute_flag_names_the_profile_s_modes_and_threshold():
    """The parser stays numpy-free, so its choices and help spell the profile's modes and threshold: kept alike."""
    from dpcompare import cli

    predict = cli.build_parser().get_default("commands")["predict"]
    act = next(a for a in predict.options if a.dest == "untraced_compute")
    assert tuple(act.choices) == UNTRACED_MODES and act.default == "auto"
    assert f"{PROBE_APPLY_BELOW}×" in act.help


def test_predict_command_on_a_compare_folder(tmp_path):
    fake_run(tmp_path / "cmp" / "runs" / "ddp-np2-r0")
    fake_run(tmp_path / "cmp" / "runs" / "ddp-np2-r1")  # a repeat: the same curve, both runs' steps pooled
    p = dpcompare("predict", str(tmp_path / "cmp"), "--host-counts", "2,4,...,64", "--link", "1gbit",
                  "--strategies", "ddp,horovod,zero,fsdp")
    out = json.loads((tmp_path / "cmp" / "prediction.json").read_text())
    assert [c["strategy"] for c in out["curves"]] == ["ddp", "horovod", "zero", "fsdp"]
    assert [s["hosts"] for s in out["curves"][0]["steps"]] == [2, 4, 8, 16, 32, 64]
    assert (tmp_path / "cmp" / "prediction.png").stat().st_size > 10_000
    assert "fastest at" in p.stdout and "efficiency on 1gbit" in p.stdout and "would cut" in p.stdout
    assert out["who_wins"] and out["knob_advice"]
    # every figure with its band (the hand-made steps are identical: a band of no width), the overlap's source
    first = out["curves"][0]["steps"][0]
    assert first["step_ms_low"] == first["step_ms"] == first["step_ms_high"] and "95 % band" in p.stdout
    assert out["curves"][0]["band"]["traced_steps"] == 12 and first["no_overlap_ms"] >= first["step_ms"]
    assert out["overlap"][0].startswith("assumed, nothing measured") and "overlap of communication" in p.stdout
    # and its interval: the band widened on each side by the validated model error's share of the step
    w = out["curves"][0]["model_error"]["widen"]
    assert first["interval_ms_low"] == pytest.approx(first["step_ms"] * (1 - w), abs=1e-3) and w > 0
    assert first["interval_ms_high"] == pytest.approx(first["step_ms"] * (1 + w), abs=1e-3)
    assert "90 % interval" in p.stdout and out["interval"][0].startswith("90 % interval: the band widened by")
    # who wins: the curve with the shortest step at every host count, read from the curves themselves
    steps = {c["label"]: [s["step_ms"] for s in c["steps"]] for c in out["curves"]}
    best = {min(steps, key=lambda k: steps[k][i]) for i in range(6)}
    assert best == {"horovod (on ddp-np2)"} and out["who_wins"] == [
        "fastest at 2–64 hosts: horovod (on ddp-np2)", "no crossover between 2 and 64 hosts"]
    # the knob advice: one per curve, in its words; fp16 halves DDP's all-reduced bytes, so its exposed time
    advice = [re.match(r"(.+) at 2 hosts: --[a-z-]+(?: fp16)? would cut exposed communication from ([\d.]+) to "
                       r"([\d.]+) ms "
                       r"\(step -(\d+) %, efficiency (\d+) % → (\d+) %\)$", a) for a in out["knob_advice"]]
    assert all(advice) and [m[1] for m in advice] == list(steps), out["knob_advice"]  # type: ignore[index]
    cut = {m[1]: (float(m[2]), float(m[3]), int(m[5]), int(m[6])) for m in advice}  # type: ignore[index]
    assert cut["ddp (ddp-np2)"][1] == pytest.approx(cut["ddp (ddp-np2)"][0] / 2, rel=0.01)
    assert all(after < before and eff_after > eff for before, after, eff, eff_after in cut.values())
    ddp, hvd = out["curves"][0]["traced_run"], out["curves"][1]["traced_run"]
    assert ddp["world_size"] == 2 and ddp["compute_ms"] == 18.0
    # the model at np=2 on the trace's own all-reduce speed (12 MiB in 1 ms): one bucket ready at 10 ms, done at 11
    chk = ddp["self_check"]
    assert chk["model_step_ms"] == pytest.approx(19.0, abs=0.01) and chk["traced_step_ms"] == 20.0
    assert hvd["self_check"] is None and "self-check at the traced size" in p.stdout


def test_floor_from_trace_keeps_the_traced_all_reduce_time_and_the_traced_step_on_a_faster_link(tmp_path):
    """The hand-made trace's bucket took 1 ms at np=2; on a 1000 Gbit/s link the wire alone would take 0.1 ms. The
    model's step with that floor (19 ms) is still below the traced step (20 ms), which the floor then gives."""
    run = fake_run(tmp_path / "r")
    steps = {}
    for flag in ((), ("--floor-from-trace",)):
        dpcompare("predict", str(run), "--host-counts", "2", "--link", "1000gbit", "--latency", "0us", "--quiet", *flag)
        out = json.loads((run / "prediction.json").read_text())
        steps[bool(flag)] = out["curves"][0]["steps"][0]
    assert out["inputs"]["floor_from_trace"] is True
    assert steps[True]["comm_ms"] == pytest.approx(1.0, abs=0.01)
    assert steps[False]["comm_ms"] == pytest.approx(0.1, abs=0.02)
    assert steps[False]["step_ms"] == pytest.approx(18.2, abs=0.1) and "floored_by_traced_step" not in steps[False]
    assert steps[True]["step_ms"] == pytest.approx(20.0) and steps[True]["floored_by_traced_step"] is True
    assert any("fell below the traced one (20.0 ms at np=2)" in n for n in out["curves"][0]["notes"])


def test_the_floor_line_holds_against_operations_that_waited_and_a_trace_link_has_latency():
    """A traced all-reduce that waited for a late peer is slower by the wait, never faster: the floor's median line
    stays on the library's own cost where least squares followed the waits; the link read off it pays α."""
    from dpcompare.prediction.network import floor_from, trace_link

    rng = np.random.default_rng(0)
    sizes = rng.integers(1_000, 2_000_000, 300).astype(float)
    own = 1e-3 + sizes * 2e-9  # 1 ms + 2 ns/byte
    waited = own + np.where(rng.random(300) < 0.3, rng.uniform(5e-3, 30e-3, 300), 0.0)
    a, b, n = floor_from(list(zip(sizes, waited, strict=True)), 2)
    assert n == 2 and a == pytest.approx(1e-3, rel=0.25) and b == pytest.approx(2e-9, rel=0.25)
    link = trace_link(list(zip(sizes, waited, strict=True)), 2)
    assert link.time("all_reduce", 1_000, 2) == pytest.approx(1e-3, rel=0.3)  # a small one pays the fixed cost
    assert trace_link([(1e6, 0.01)] * 3, 2).alpha == 0.0  # one size: a bandwidth, no latency


def test_predict_refusals_are_one_line(tmp_path):
    run = fake_run(tmp_path / "r")
    for args, words in (
        (["--ranks-per-host", "4"], "--intra-link"),
        (["--link", "fast"], "link rate"),
        (["--strategies", "adam"], "no model of strategy"),
        (["--model-error", str(tmp_path / "none.json")], "not a model-error file"),
        ([], "no trace.json"),
    ):
        target = str(run) if words != "no trace.json" else str(tmp_path / "nothing")
        p = dpcompare("predict", target, *args, check=False)
        assert p.returncode == 2 and words in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_calibration_scales_the_link_per_backend_and_collective(tmp_path):
    path = tmp_path / "bench.json"
    # gloo all-reduce reached 95 % of a 1 Gbit/s link; mpi's 70 %, from points (fitted)
    n, a, bw = 2, 50e-6, 0.7e9 / 8
    pts = [[s, 2 * (n - 1) * a + 2 * (n - 1) / n * s / bw] for s in (1e5, 1e6, 1e7)]
    path.write_text(json.dumps({"link_bps": 1e9, "fits": [
        {"backend": "gloo", "collective": "allreduce", "latency_s": 20e-6, "bandwidth_bps": 0.95e9},
        {"backend": "mpi", "collective": "all_reduce", "points": pts, "ranks": 2}]}))
    cal = load_calibration(path)
    assert cal[("gloo", "all_reduce")] == pytest.approx((20e-6, 0.95))
    assert cal[("mpi", "all_reduce")] == pytest.approx((a, 0.7))
    net25 = Network(4, Link(5e-6, 25e9 / 8), calibrated=cal)
    assert net25.cost("all_reduce", 1e8, "mpi") == pytest.approx(Link(a, 0.7 * 25e9 / 8).time("all_reduce", 1e8, 4))
    assert net25.cost("all_gather", 1e8, "mpi") == Link(5e-6, 25e9 / 8).time("all_gather", 1e8, 4)  # not calibrated
    # the file `dpcompare lab bench --out` writes: alpha_s is the whole fixed cost, busbw comparable with the link
    lab = tmp_path / "lab.json"
    lab.write_text(json.dumps({"schema": "dpcompare.lab.bench/1", "lab": {"link_bps": 200e6}, "ranks": 3, "fits": [
        {"backend": "gloo", "collective": "allreduce", "alpha_s": 8e-4, "busbw_Bps": 0.95 * 200e6 / 8},
        {"backend": "mpi", "collective": "allgather", "alpha_s": 4e-4, "busbw_Bps": 0.5 * 200e6 / 8}]}))
    cal = load_calibration(lab)
    assert set(cal) == {("gloo", "all_reduce"), ("mpi", "all_gather")}
    assert cal[("gloo", "all_reduce")] == pytest.approx((2e-4, 0.95)) and cal[("mpi", "all_gather")] == pytest.approx(
        (2e-4, 0.5))
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ConfigError, match="lab bench"):
        load_calibration(tmp_path / "empty.json")


def test_a_bench_file_is_fitted_over_every_size_by_default(tmp_path):
    """Rows whose speed per byte grows with the size (Open MPI in the lab): the bench's own fits (α from the
    smallest sizes, B from the largest) make a 4 MiB all-reduce too fast; the fit over the range does not."""
    n, link = 2, 1e9
    rows = [(2**18, 0.026), (2**20, 0.074), (2**22, 0.147), (2**24, 0.359)]  # measured, 1 Gbit/s, mpi
    doc = {"schema": "dpcompare.lab.bench/1", "lab": {"link_bps": link}, "ranks": n,
           "rows": [{"backend": "mpi", "collective": "allreduce", "bytes": b, "time_s": t} for b, t in rows],
           "fits": [{"backend": "mpi", "collective": "allreduce", "alpha_s": 0.010,
                     "busbw_Bps": (2**24 - 2**22) / (0.359 - 0.147)}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    ends, whole = load_calibration(path, fit="ends"), load_calibration(path)
    at = {k: Network(n, Link(0.0, link / 8), calibrated=c).cost("all_reduce", 2**22, "mpi")
          for k, c in (("ends", ends), ("range", whole))}
    assert at["ends"] < 0.8 * 0.147 and at["range"] == pytest.approx(0.147, rel=0.2)


def test_floor_from_the_trace_bounds_an_all_reduce_from_below():
    """A library that took 100 ms + 10 ms/MiB on the traced run's unlimited link takes no less on a fast one,
    the link's time on a slow one; at more ranks the floor grows with the ring's factors."""
    from dpcompare.prediction.network import floor_from

    f = floor_from([(MB, 0.110), (4 * MB, 0.140), (16 * MB, 0.260)], ranks=2)
    assert f == pytest.approx((0.100, 0.010 / MB, 2))
    fast, slow = (Network(2, Link(0.0, r), floors={"mpi": f}) for r in (1e12, 1e6))
    assert fast.cost("all_reduce", 4 * MB, "mpi") == pytest.approx(0.140)
    assert fast.cost("all_reduce", 4 * MB, "gloo") == pytest.approx(Link(0.0, 1e12).time("all_reduce", 4 * MB, 2))
    assert slow.cost("all_reduce", 4 * MB, "mpi") == pytest.approx(Link(0.0, 1e6).time("all_reduce", 4 * MB, 2))
    assert fast.with_hosts(4).cost("all_reduce", 4 * MB, "mpi") == pytest.approx(0.300 + 0.040 * 1.5)
    assert fast.cost("all_gather", 4 * MB, "mpi") < 0.001 and floor_from([(MB, 0.05)] * 3, 2) == (0.05, 0.0, 2)
    # from a profile: under the trace's own strategy's backend (horovod → mpi)
    p = profile([("w", 1 * MS, MB)], 2 * MS, strategy="horovod",
                measured={"allreduces": [(MB, 0.110), (4 * MB, 0.140)]})
    p.world_size = 2
    assert set(strategies.trace_floors(p)) == {"mpi"}


def test_the_wait_for_the_last_rank_delays_ddp_s_bucket_on_a_slow_link_and_stays_in_the_floor_on_a_fast_one():
    """Three ranks traced one 1 MiB all-reduce per step, issued at 0, 4 and 6 ms and ending together at 10 ms:
    waits 6, 2 and 0 ms (median 2). With the wait placed before the bucket and taken out of its floor, a link
    faster than the floor prices the step as the floor alone did; on a slow link the wait comes on top of the wire,
    where the floor's max() hid it."""
    from dpcompare import trace as tr
    from dpcompare.prediction.profile import _allreduce_wait

    events = []
    for step in (1, 2):
        t0 = step * 100_000.0
        for rank, issued in ((0, 0.0), (1, 4_000.0), (2, 6_000.0)):
            events.append({"name": "step", "cat": tr.CAT_STEP, "ph": "X", "ts": t0, "dur": 20_000.0, "pid": rank,
                           "tid": 0, "args": {"step": step}})
            events.append({"name": "all-reduce bucket 0", "cat": tr.CAT_COMM, "ph": "X", "ts": t0 + issued,
                           "dur": 10_000.0 - issued, "pid": rank, "tid": 100, "args": {"bytes": MB}})
    assert _allreduce_wait(events) == pytest.approx(0.002)
    assert _allreduce_wait([e for e in events if e["pid"] == 0]) is None  # nothing matched across ranks

    p = profile([("w", 5 * MS, MB)], 5 * MS)
    p.world_size = 3
    floor = {"gloo": (0.006, 0.0, 3)}  # the traced spans' median: own 4 ms + the median wait 2 ms
    for mib_ms, hidden in ((0.1, True), (20.0, False)):
        plain = Network(3, Link(0.0, MB / (mib_ms * MS)), floors=floor)
        waited = dataclasses.replace(plain, waits={"gloo": 0.002})
        before, after = (strategies.schedule("ddp")(p, Knobs()).run(n).step for n in (plain, waited))
        assert after == pytest.approx(before if hidden else before + 0.002)
    p.measured["allreduce_wait_s"] = 0.002
    assert strategies.trace_waits(p) == {"gloo": 0.002}


def test_straggler_from_trace_needs_the_floor(tmp_path):
    run = fake_run(tmp_path / "r")
    p = dpcompare("predict", str(run), "--host-counts", "2", "--link", "1gbit", "--straggler-from-trace", "--quiet",
                  check=False)
    assert p.returncode == 2 and "add --floor-from-trace" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_labels_keep_arms_apart_and_repeats_together(tmp_path):
    from dpcompare.prediction.command import source

    assert source(tmp_path / "ddp-np2-r0", 2) == source(tmp_path / "ddp-np2-r3-s7", 2) == "ddp-np2"
    assert source(tmp_path / "ddp-bucket5-np2-r0", 2) == "ddp-bucket5-np2"
    assert source(tmp_path / "mine", 4) == "mine, np=4"


def test_the_traced_repeats_of_an_arm_are_pooled_into_one_curve(tmp_path):
    """A comparison traced with --repeats 2: one curve per arm, from both repeats' steps; the other arm alone."""
    from dpcompare import cli

    fake_run(tmp_path / "cmp" / "runs" / "ddp-np2-r0", steps=6)
    fake_run(tmp_path / "cmp" / "runs" / "ddp-np2-r1", steps=6, slower=1.3)
    fake_run(tmp_path / "cmp" / "runs" / "horovod-np2-r0", strategy="horovod", steps=6)
    assert (
        cli.main(["predict", str(tmp_path / "cmp"), "--host-counts", "2,4", "--out", str(tmp_path / "p"), "--quiet"])
        == 0
    )
    curves = {c["strategy"]: c for c in json.loads((tmp_path / "p" / "prediction.json").read_text())["curves"]}
    assert set(curves) == {"ddp", "horovod"}
    ddp, hvd = curves["ddp"], curves["horovod"]
    assert any("2 traced runs of this arm pooled (24 rank-steps)" in n for n in ddp["notes"])
    assert not any("pooled" in n for n in hvd["notes"])
    assert ddp["traced_run"]["pooled_runs"][1].endswith("ddp-np2-r1")
    assert (ddp["band"]["traced_steps"], ddp["band"]["traced_runs"], hvd["band"]["traced_runs"]) == (24, 2, 1)
    assert "within each of 2 traced runs" in ddp["band"]["method"] and hvd["band"]["traced_steps"] == 12
    # the launches' spread comes from the arm traced twice (one degree of freedom; computes of 18.0 and 16.5 ms,
    # the second's backward ending at the same gradient ticks: sd of the logs |ln(16.5/18)|/√2 = 6.2 %) and
    # widens every arm's band, the arm traced once included
    spread = ddp["band"]["launch_spread"]
    assert spread == hvd["band"]["launch_spread"] and (spread["df"], spread["arms"], spread["launches"]) == (1, 1, 2)
    assert spread["sd_pct"] == pytest.approx(6.15, abs=0.01)
    assert any("launch to launch the compute moved" in n for n in hvd["notes"])


def test_a_traced_comparison_is_projected_and_the_report_shows_it(tmp_path):
    from dpcompare.prediction.command import project
    from dpcompare.report.projection import section

    assert project(tmp_path, 25 * 10**9) is None and section(tmp_path) == ""  # nothing traced: no section
    fake_run(tmp_path / "runs" / "ddp-np2-r0")
    fake_run(tmp_path / "runs" / "horovod-np2-r0", strategy="horovod")
    where = project(tmp_path, 10**10)  # bits/s, as compare's --project-link parses it
    doc = json.loads((where / "prediction.json").read_text())
    assert doc["inputs"]["link"] == "10gbit" and [c["strategy"] for c in doc["curves"]] == ["ddp", "horovod"]
    assert doc["inputs"]["hosts"][0] == 2 and doc["inputs"]["hosts"][-1] == 1024
    text = section(tmp_path)
    assert "Projected to a cluster" in text and "data:image/png;base64," in text and "10gbit link" in text
    assert "95 % band" in text and "overlap: assumed" in text
    assert text.count("<tr><td>") == 2 and "1024 hosts" in text and "a model, not a measurement" in text.lower()
    assert "<th>1024 hosts</th>" in text  # short headings (the legend says what a cell holds): the table fits its card


def test_a_bench_profile_gives_back_every_measured_size_and_follows_the_curve_between(tmp_path):
    """`predict --calibration` reads the share of the link off the measured sizes (Open MPI's speed per byte
    changes with the size as it switches algorithms): no straight line's intercept paid by every small op, and
    between two sizes the time on the line between their times."""
    from dpcompare.prediction.network import load_profiles, share_at

    n, link = 2, 1e9
    rows = [(2**18, 0.0021), (2**20, 0.0087), (2**22, 0.051), (2**24, 0.216)]
    doc = {"schema": "dpcompare.lab.bench/1", "lab": {"link_bps": link}, "ranks": n,
           "rows": [{"backend": "mpi", "collective": "allreduce", "bytes": b, "time_s": t} for b, t in rows]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    net = Network(n, Link(0.0, link / 8), calibrated=load_calibration(path), profiles=load_profiles(path))
    for b, t in rows:
        assert net.cost("all_reduce", b, "mpi") == pytest.approx(t)
    profile = load_profiles(path)[("mpi", "all_reduce")]
    # between two sizes the time is on the straight line between theirs (the α-β law and a tbf burst are linear in
    # bytes; interpolating the share would carry a burst-fast small size's speed into the sizes past it)
    assert net.cost("all_reduce", 5 * 2**19, "mpi") == pytest.approx((0.0087 + 0.051) / 2)
    assert share_at(profile, 2**30) == share_at(profile, 2**24)  # beyond the sizes: the nearest end's share
    assert net.cost("all_reduce", 1, "gloo") == pytest.approx(1 / (link / 8))  # no record: the plain link


def test_project_link_is_a_rate_or_none():
    import argparse

    from dpcompare.compare.cmdline import project_link_arg

    assert project_link_arg("25gbit") == 25 * 10**9 and project_link_arg("none") is None
    with pytest.raises(argparse.ArgumentTypeError, match="not a link rate"):
        project_link_arg("fast")


# -- a shaped link's burst -------------------------------------------------------------------------------------
def burst_net(burst: float, hosts: int = 2) -> Network:
    """A 0.5 MiB/ms link whose calibration timed Open MPI's and gloo's all-reduces at ten times the link (what a full
    tbf bucket does to small messages), with a bucket of ``burst`` bytes."""
    fast = ((1.0, float(2**30)), (10.0, 10.0))
    return Network(
        hosts,
        Link(0.0, MB / (2 * MS)),
        profiles={("mpi", "all_reduce"): fast, ("gloo", "all_reduce"): fast},
        burst=burst,
    )


def test_back_to_back_all_reduces_pay_for_the_burst_they_find_empty():
    """Eight 0.25 MiB all-reduces one after another: with a 1 MiB bucket the first ones go at the calibrated speed,
    then the bucket is empty and the rest go at the link's; a bucket of none changes nothing."""
    p = profile([(f"g{i}", 0.1 * MS, MB // 4) for i in range(8)], backward=1 * MS, strategy="horovod")
    knobs = Knobs(horovod_cycle_ms=1, horovod_fusion_mb=0.25)
    plain, shaped = (strategies.schedule("horovod")(p, knobs).predict(burst_net(b)) for b in (0, MB))
    assert plain.ops == shaped.ops == 8 + 1 and plain.comm == pytest.approx(8 * 0.05 * MS)
    beyond = (8 * MB / 4 - MB) / (MB / (2 * MS))  # the bytes past the burst at the link's rate: 2 ms
    assert beyond < shaped.comm < beyond + plain.comm and shaped.step > plain.step
    # DDP: two buckets far apart find it refilled; back to back, the second pays
    apart = profile([("b", 1 * MS, 2 * MB), ("a", 20 * MS, 2 * MB)], backward=20 * MS)
    together = profile([("b", 20 * MS, 2 * MB), ("a", 20 * MS, 2 * MB)], backward=20 * MS)
    ddp = strategies.schedule("ddp")
    k = Knobs(bucket_mb=2)
    assert ddp(apart, k).predict(burst_net(MB)).comm == pytest.approx(ddp(apart, k).predict(burst_net(0)).comm)
    assert ddp(together, k).predict(burst_net(MB)).comm > ddp(together, k).predict(burst_net(0)).comm + 1.5 * MS


def test_an_all_reduce_that_follows_another_is_priced_from_the_sizes_timed_back_to_back(tmp_path):
    """`lab bench` times each size after an idle gap and again back to back; an operation that starts sooner than
    that gap after the previous one ended costs what the bench timed back to back (Open MPI at two hosts: slower),
    one that starts later what it timed after the gap; a file without those rows prices both alike."""
    from dpcompare.prediction.network import BACK_TO_BACK, Bench, load_bucket, load_profiles

    link, burst = 5e8, 262144
    rows = [(2**20, 0.0136, 0.0174), (2**22, 0.067, 0.101)]
    doc = {"lab": {"link_bps": link}, "ranks": 2, "gap_ms": 8.4, "burst_bytes": burst,
           "rows": [{"backend": "mpi", "collective": "allreduce", "bytes": b, "time_s": t} for b, t, _ in rows]
           + [{"backend": "mpi", "collective": "allreduce", "bytes": b, "time_s": t, "back_to_back": True}
              for b, _, t in rows]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    assert set(load_profiles(path)) == {("mpi", "all_reduce"), ("mpi" + BACK_TO_BACK, "all_reduce")}
    assert set(load_profiles(path, back_to_back=False)) == {("mpi", "all_reduce")}
    assert set(Bench.load(path, back_to_back=False).rows) == {("mpi", "all_reduce")}

    def priced(back_to_back: bool) -> float:
        burst_read, gap = load_bucket(path)
        net = Network(2, Link(0.0, link / 8), profiles=load_profiles(path, back_to_back=back_to_back),
                      burst=burst_read, gap_s=gap)
        assert net.gap == pytest.approx(0.0084)  # the bench's recorded gap
        bucket = net.bucket()
        first = bucket.cost("all_reduce", 2**22, "mpi", 0.0)
        follows = bucket.cost("all_reduce", 2**22, "mpi", first)  # at once
        later = bucket.cost("all_reduce", 2**22, "mpi", first + follows + 10 * net.gap)  # refilled, after the gap
        assert first == pytest.approx(0.067) == pytest.approx(later)
        return follows

    # back to back: the bench's time, whose bucket was as it found it (no tokens charged again)
    assert priced(True) == pytest.approx(0.101)
    # the idle time, and the tokens the first one left lacking (it took about its bytes' time: ~0.1 ms of them)
    assert priced(False) == pytest.approx(0.067, abs=2e-4)


def test_the_burst_and_the_gap_come_from_the_bench_file(tmp_path):
    from dpcompare.prediction.network import load_bucket

    (tmp_path / "new.json").write_text(json.dumps({"burst_bytes": 262144, "gap_ms": 21.0}))
    (tmp_path / "old.json").write_text(json.dumps({"gap_ms": 21.0, "lab": {"link_bps": 200_000_000}}))
    (tmp_path / "other.json").write_text(json.dumps({"fits": []}))
    assert load_bucket(tmp_path / "new.json") == (262144, pytest.approx(0.021))
    assert load_bucket(tmp_path / "old.json") == (pytest.approx(262500), pytest.approx(0.021))  # half of 21 ms
    assert load_bucket(tmp_path / "other.json") == (0, None) == load_bucket(tmp_path / "missing.json")


def test_a_prediction_for_another_link_than_the_bench_s_keeps_the_bench_s_gap(tmp_path):
    """The bench at 200 Mbit/s idled 21 ms before each operation; predicted for 1 Gbit/s (where the same burst
    refills in 4.2 ms) an all-reduce that starts 10 ms after the previous one ended is still one the bench timed
    back to back, not one after its idle gap (which a gap worked out from ``--link`` would have said)."""
    import argparse

    from dpcompare.prediction.command import _network

    rows = [(2**20, 0.010, 0.020), (2**22, 0.040, 0.080)]
    doc = {"lab": {"link_bps": 2e8}, "ranks": 2, "gap_ms": 21.0, "burst_bytes": 262144,
           "rows": [{"backend": "mpi", "collective": "all_reduce", "bytes": b, "time_s": t} for b, t, _ in rows]
           + [{"backend": "mpi", "collective": "all_reduce", "bytes": b, "time_s": t, "back_to_back": True}
              for b, _, t in rows]}
    (tmp_path / "bench.json").write_text(json.dumps(doc))
    a = argparse.Namespace(latency="0us", ranks_per_host=1, intra_link=None, calibration=str(tmp_path / "bench.json"),
                           link=10**9)
    net = _network(a).with_hosts(2)
    assert net.gap == pytest.approx(0.021)
    bucket = net.bucket()
    first = bucket.cost("all_reduce", 2**22, "mpi", 0.0)
    follows = bucket.cost("all_reduce", 2**22, "mpi", first + 0.010)
    assert follows == pytest.approx(0.080 * 2e8 / 1e9)  # the back-to-back share of the link, at 1 Gbit/s
    assert follows > 1.5 * first


def test_a_narrow_terminal_leaves_out_columns_and_never_cuts_a_cell():
    from rich.console import Console

    from dpcompare.prediction import interval, output

    p = profile([("w", 5 * MS, 40 * MB)], backward=10 * MS)
    c = sweep.curve(p, "ddp", Knobs(), net(), [2, 64, 1024], "ddp (a long label for a run folder)",
                    model_error=interval.VALIDATED)
    for width, must_drop in ((200, []), (90, ["hidden", "no overlap"])):
        console = Console(width=width, record=True, highlight=False)
        output.show(console, [c], {}, 0.8)
        text = console.export_text()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        assert "…" not in text and all(len(ln) <= width for ln in lines), text
        assert "1024" in text and "90 % interval" in text  # the host count and the interval always stay
        dropped = re.search(r"left out to fit \d+ columns: (.+) \(all in prediction.json\)", text)
        assert (dropped[1].split(", ")[:len(must_drop)] if dropped else []) == must_drop, text
