"""``dpcompare predict``'s band, Open MPI's two speeds, the measured overlap and bf16, on synthetic traces and bench
files (no torch, no MPI, no timing)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dpcompare.errors import ConfigError
from dpcompare.lab.bench import analyse, mode_lines, two_modes
from dpcompare.prediction import interval, overlap, strategies, sweep
from dpcompare.prediction.network import Bench, Link, Network, load_profiles
from dpcompare.prediction.profile import (
    PHASES,
    Grad,
    LaunchSpread,
    Profile,
    Samples,
    launch_spread,
    pooled,
    with_spread,
)
from dpcompare.prediction.schedule import MB, Knobs

MS = 1e-3
NAMES = ("fc2.weight", "fc1.weight")


def noisy(n: int, seed: int, spread: float = 0.05, backward: float = 10 * MS, strategy: str = "ddp",
          scale: float = 1.0) -> Profile:
    """A profile of ``n`` traced rows drawn around 1 ms data, 4 ms forward, ``backward``, 3 ms optimizer (all ×
    ``scale``, each row × a normal factor of sd ``spread``); two gradients of 4 and 8 MiB, ready at 40 % and at the
    end of backward."""
    rng = np.random.default_rng(seed)
    base = np.array([1 * MS, 4 * MS, backward, 3 * MS]) * scale
    phases = base * rng.normal(1, spread, (n, 4))
    ready = np.stack([0.4 * phases[:, 2], phases[:, 2]], axis=1)
    samples = Samples(phases, NAMES, ready, np.zeros(n), np.zeros(n))
    med = np.median(phases, axis=0)
    rmed = np.median(ready, axis=0)
    return Profile(run=f"noisy{seed}", strategy=strategy, sharded=False, world_size=2,
                   **{k: float(v) for k, v in zip(PHASES, med, strict=True)},
                   grads=[Grad(NAMES[0], float(rmed[0]), 4 * MB), Grad(NAMES[1], float(rmed[1]), 8 * MB)],
                   samples=samples)


def link_net(hosts: int = 2, mib_ms: float = 1.0) -> Network:
    return Network(hosts, Link(0.0, MB / (mib_ms * MS)))


# -- the band --------------------------------------------------------------------------------------------------
def test_the_band_covers_the_truth_and_two_runs_of_the_procedure_agree_within_their_bands():
    truth = strategies.schedule("ddp")(noisy(10**5, 0, spread=0.0), Knobs()).run(link_net()).step
    bands = []
    for seed in (1, 2):  # the same procedure twice: two traces of 40 rows from the same machine
        p = noisy(40, seed)
        c = sweep.curve(p, "ddp", Knobs(), link_net(), [2, 4], "ddp", sweep.Noise(replicates=200))
        lo, hi = c.band(0)
        assert lo < c.steps[0].step < hi and lo <= truth <= hi, (lo, truth, hi)
        assert c.eff_bands[1][0] < c.efficiency(c.steps[0]) < c.eff_bands[1][1]
        bands.append((lo, hi))
    assert bands[0][0] <= bands[1][1] and bands[1][0] <= bands[0][1]  # they overlap
    d = c.step_dict(0)
    assert d["step_ms_low"] < d["step_ms"] < d["step_ms_high"] and c.band_info["traced_steps"] == 40
    assert not c.band_advice  # ±5 % sd per phase over 40 rows: a band well inside ±5 %


def test_floor_from_trace_never_predicts_the_own_strategy_below_its_traced_step():
    """Traced steps of ~30 ms on a fast link; the model alone gives ~22 ms on a link as fast. With the floor the
    point, every replicate of the band and the advice's alternatives stay at or above the traced step, from the
    traced host count on, for the run's own strategy only."""
    p = noisy(40, 3)
    rng = np.random.default_rng(0)
    steps = 0.030 * rng.normal(1, 0.05, len(p.samples))
    ranks = np.arange(len(steps)) % 2
    samples = dataclasses.replace(p.samples, step=steps, rank=ranks)
    p = dataclasses.replace(p, samples=samples, traced_step=samples.slowest_step(np.arange(len(steps))))
    assert p.traced_step == max(np.median(steps[ranks == 0]), np.median(steps[ranks == 1]))  # as a run reports it
    net = link_net(mib_ms=0.1)
    plain = sweep.curve(p, "ddp", Knobs(), net, [2, 4], "ddp", sweep.Noise(replicates=100))
    held = sweep.curve(p, "ddp", Knobs(), net, [2, 4], "ddp", sweep.Noise(floor_from_trace=True, replicates=100))
    other = sweep.curve(p, "horovod", Knobs(), net, [2, 4], "hvd", sweep.Noise(floor_from_trace=True, replicates=0))
    assert plain.steps[0].step < 0.8 * p.traced_step and plain.band(0)[1] < p.traced_step
    assert [s.step for s in held.steps] == [p.traced_step, p.traced_step] and held.base.step == plain.base.step
    lo, hi = held.band(0)
    assert lo >= 0.9 * p.traced_step and hi > lo  # the traced steps' own noise, drawn again
    assert held.steps[0].detail["floored_by_traced_step"]
    assert any("fell below the traced one" in n for n in held.notes) and not any("traced one" in n for n in plain.notes)
    assert "none of" in sweep.advise(held, p, net, 0.8)  # no knob gains by going under the floor
    assert other.steps[0].step < p.traced_step and other.floor_step == 0.0


def test_a_wide_band_asks_for_more_traced_steps():
    p = noisy(4, 3, spread=0.4)
    c = sweep.curve(p, "ddp", Knobs(), link_net(mib_ms=0.01), [2], "ddp", sweep.Noise(replicates=100))
    assert "wider than ±5 %" in c.band_advice and "trace more" in c.band_advice and "4 rank-steps" in c.band_advice


def test_a_hand_made_profile_has_a_point_band_and_no_band_when_asked_for_none():
    p = noisy(10, 4)
    none = sweep.curve(p, "ddp", Knobs(), link_net(), [2], "ddp", sweep.Noise(replicates=0))
    assert none.bands == [] and "step_ms_low" not in none.step_dict(0) and none.band(0) == (none.steps[0].step,) * 2


def test_pooled_launches_put_what_moved_between_them_in_the_band():
    """Two traced runs of one arm whose compute moved between launches (backward 10 and 13 ms, steps steady
    within each): each alone gives a band that misses the other; pooled, the band holds both."""
    a, b = noisy(30, 6, spread=0.01), noisy(30, 7, spread=0.01, backward=13 * MS)
    one = [sweep.curve(p, "ddp", Knobs(), link_net(), [2], "ddp", sweep.Noise(replicates=200)) for p in (a, b)]
    assert one[0].band(0)[1] < one[1].band(0)[0]  # the launches' bands miss each other
    both = pooled([a, b])
    assert len(both.samples) == 60 and list(np.unique(both.samples.launch)) == [0, 1]
    assert a.backward < both.backward < b.backward and "2 traced runs of this arm pooled" in both.notes[-1]
    c = sweep.curve(both, "ddp", Knobs(), link_net(), [2], "ddp", sweep.Noise(replicates=200))
    lo, hi = c.band(0)
    assert lo <= one[0].steps[0].step and one[1].steps[0].step <= hi, (lo, hi)
    assert pooled([a]) is a  # one run: itself, drawn as before
    rng1, rng2 = np.random.default_rng(0), np.random.default_rng(0)
    assert a.samples.drawn(rng1).tolist() == rng2.integers(0, 30, 30).tolist()


def test_the_launches_spread_pooled_over_arms_holds_a_launch_the_bootstrap_of_two_misses():
    """Eight arms, each traced in three launches whose compute moves by a lognormal factor (sd 0.15) from launch to
    launch, steady within one. Pooled over the first two launches of each arm, the spread is estimated with 8
    degrees of freedom, and the band (Student's t over it) holds the third launch's own step in more arms than a
    bootstrap that draws the two launches again."""
    rng = np.random.default_rng(3)
    arms = [[noisy(20, 100 * a + k, spread=0.01, scale=float(np.exp(rng.normal(0, 0.15)))) for k in range(3)]
            for a in range(8)]
    two = [pooled(launches[:2]) for launches in arms]
    spread = launch_spread(two)
    assert (spread.df, spread.arms, spread.launches) == (8, 8, 16) and 0.07 < spread.sd < 0.3, spread
    assert launch_spread([a[0] for a in arms]).df == 0  # one launch per arm: nothing to estimate it from

    def held(profiles: list[Profile]) -> int:
        """Arms whose band at two hosts holds their third launch's own step."""
        out = 0
        for p, launches in zip(profiles, arms, strict=True):
            lo, hi = sweep.curve(p, "ddp", Knobs(), link_net(), [2], "ddp", sweep.Noise(replicates=200)).band(0)
            out += lo <= sweep.curve(launches[2], "ddp", Knobs(), link_net(), [2], "ddp").steps[0].step <= hi
        return out

    spread_held, bootstrap_held = held(with_spread(two)), held(two)
    assert spread_held >= 7 and bootstrap_held < spread_held, (spread_held, bootstrap_held)
    assert all(p.spread == spread and "launch to launch the compute moved" in p.notes[-1] for p in with_spread(two))


def test_the_launches_part_of_the_band_is_for_a_new_launch():
    """The run a prediction is compared with is a launch of its own: the launches' part of the band spreads by
    sd·√(1 + 1/L) (a new launch's sd plus the L traced launches' mean's sd/√L), never less than sd."""
    spread, rng = LaunchSpread(sd=0.1, df=10**6, arms=2, launches=4), np.random.default_rng(0)
    for launches, want in ((1, 0.1 * np.sqrt(2)), (4, 0.1 * np.sqrt(1.25)), (10**6, 0.1)):
        logs = np.log([spread.factor(rng, launches) for _ in range(20000)])
        assert abs(np.std(logs) / want - 1) < 0.03, (launches, np.std(logs), want)


def test_the_bytes_time_at_one_host_is_on_the_link_inside_it():
    """One host of G ranks moves its collectives' bytes over the link inside it: the band keeps that part still,
    as it keeps the inter-host link's at many hosts."""
    intra = Link.of(0.0, 8e9)  # 1e9 bytes/s
    one = Network(1, Link.of(0.0, 8e8), per_host=4, intra=intra)
    assert one.bytes_time("all_reduce", 1e9) == pytest.approx(2 * 3 / 4)
    assert one.bytes_time("all_gather", 1e9) == pytest.approx(3 / 4)
    assert Network(1, Link.of(0.0, 8e8)).bytes_time("all_reduce", 1e9) == 0.0
    assert Network(2, Link.of(0.0, 8e8), per_host=4, intra=intra).bytes_time("all_reduce", 1e9) == pytest.approx(10.0)


def test_what_moves_between_launches_moves_all_but_the_bytes_time_on_the_link():
    """A launch on a slower machine runs its compute and its collectives' own costs slower, not the link: the
    launches' factor scales the step less its link-bound part (a ring all-reduce's 2(n−1)/n of the bytes at the
    link's rate; half that for FSDP's all-gathers and reduce-scatters), so a step the link sets gets a narrower
    launches' band than one the compute or the collectives' fixed costs set."""
    p = noisy(20, 5, spread=0.01)
    slow, fast = link_net(mib_ms=20.0), link_net(mib_ms=0.01)
    s = strategies.schedule("ddp")(p, Knobs()).run(slow)
    assert s.link_bound == pytest.approx(12 * 20 * MS) and s.link_bound < s.step  # 12 MiB, 2 ranks: 2·½ × 12 MiB
    moved = s.moved(1.5)
    assert moved.step == pytest.approx(s.link_bound + 1.5 * (s.step - s.link_bound))
    assert moved.compute == pytest.approx(1.5 * s.compute)
    # FSDP: two all-gathers of the parameters and a reduce-scatter of the gradients, each ½ × 12 MiB on the link
    assert strategies.schedule("fsdp")(p, Knobs()).run(slow).link_bound == pytest.approx(3 * 6 * 20 * MS)
    spread = with_spread([p], LaunchSpread(sd=0.1, df=20, arms=4, launches=8))[0]

    def half(net: Network) -> float:
        c = sweep.curve(spread, "ddp", Knobs(), net, [2], "ddp", sweep.Noise(replicates=200))
        lo, hi = c.band(0)
        return (hi - lo) / 2 / c.steps[0].step

    latency = Network(2, Link(0.1, MB / (0.01 * MS)))  # 0.1 s per message step: the library's cost, not the link's
    assert half(slow) < 0.6 * half(fast) < 0.6 * half(latency), (half(slow), half(fast), half(latency))


def test_who_wins_says_when_the_bands_overlap():
    p = noisy(6, 5, spread=0.3)
    # ddp and horovod on the same compute: their steps differ by less than the band
    curves = [sweep.curve(p, s, Knobs(), link_net(mib_ms=0.5), [2, 4], s, sweep.Noise(replicates=100))
              for s in ("ddp", "horovod")]
    lines = sweep.verdict(curves, [2, 4])
    assert "bands overlap with" in lines[0] and "not told apart" in lines[0]
    tight = [sweep.curve(p, s, Knobs(), link_net(mib_ms=0.5), [2, 4], s, sweep.Noise(replicates=0))
             for s in ("ddp", "horovod")]
    assert "overlap" not in sweep.verdict(tight, [2, 4])[0]


# -- Open MPI's two speeds ---------------------------------------------------------------------------------------
def bimodal(seed: int = 0, fast: float = 0.288, slow: float = 0.429, n_fast: int = 6, n_slow: int = 4) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(rng.normal(fast, 0.004, n_fast)) + list(rng.normal(slow, 0.004, n_slow))


def test_two_modes_are_seen_on_a_bimodal_sample_and_not_on_one_mode_or_too_few():
    m = two_modes(bimodal())
    assert m is not None and m["slow_share"] == pytest.approx(0.4) and m["labels"] == [0] * 6 + [1] * 4
    assert m["fast_s"] == pytest.approx(0.288, abs=0.005) and m["slow_s"] == pytest.approx(0.429, abs=0.005)
    rng = np.random.default_rng(1)
    assert two_modes(list(rng.normal(0.3, 0.01, 12))) is None
    assert two_modes(list(rng.normal(0.3, 0.01, 11)) + [0.5]) is None  # one stray time is not a mode
    assert two_modes(bimodal(n_fast=3, n_slow=2)) is None  # five times: too few to tell


def bench_file(tmp_path, times_32m: list[float], link: float = 1e9):
    raw = [{"backend": "mpi", "collective": "allreduce", "bytes": 2**20, "times_s": [0.0105, 0.0101, 0.0103] * 2},
           {"backend": "mpi", "collective": "allreduce", "bytes": 32 * 2**20, "times_s": times_32m}]
    doc = analyse(raw, 2, link, lab={"link_bps": link})
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    return path, doc


def test_the_bench_says_two_speeds_and_the_model_carries_the_mixture(tmp_path):
    times = bimodal()
    path, doc = bench_file(tmp_path, times)
    row = next(r for r in doc["rows"] if r["bytes"] == 32 * 2**20)
    labels = np.array(row["modes"]["labels"])
    t = np.array(times)
    expected = 0.6 * np.median(t[labels == 0]) + 0.4 * np.median(t[labels == 1])
    assert row["expected_s"] == pytest.approx(expected)
    assert any(line.startswith("two speeds: mpi all_reduce 33,554,432 bytes") and "(4 of 10)" in line
               for line in mode_lines(doc))
    bench = Bench.load(path)
    assert bench is not None and bench.bimodal and bench.repeats == 6
    at = {m: Network(2, Link(0.0, 1e9 / 8), profiles=bench.profiles(m)).cost("all_reduce", 32 * 2**20, "mpi")
          for m in ("expected", "fast", "slow")}
    assert at["expected"] == pytest.approx(expected) and at["fast"] < at["expected"] < at["slow"]
    assert load_profiles(path) == bench.profiles("expected")
    # the curve: the mixture's expected step, and the step in each mode beside it
    p = noisy(20, 6, strategy="horovod")
    p.config["horovod_ops"] = "mpi"
    c = sweep.curve(p, "horovod", Knobs(), Network(2, Link(0.0, 1e9 / 8), profiles=bench.profiles()), [2], "h",
                    sweep.Noise(bench, replicates=50))
    fast, slow = c.modes[1]
    assert fast < c.steps[0].step < slow and "slow_mode_step_ms" in c.step_dict(0)


def test_horovod_negotiates_at_the_fixed_cost_the_bench_measured(tmp_path):
    """The bench's smallest all-reduce (1 MiB in ~10.3 ms on 1 Gbit/s at 2 ranks: 8.4 ms of wire) leaves ~1.9 ms
    that a message of a few bytes pays too: each Horovod cycle's negotiation costs that; without a bench,
    2⌈log2 n⌉·α."""
    path, _ = bench_file(tmp_path, [0.29, 0.3, 0.31] * 2)
    net = Network(2, Link.of(5e-6, 1e9), profiles=load_profiles(path))
    wire = net.inter.time("all_reduce", 2**20, 2)
    fixed = net.fixed("mpi", "all_reduce")
    assert wire == pytest.approx(8.39e-3, rel=0.01) and fixed == pytest.approx(0.0103 - wire, abs=2e-4)
    p = noisy(10, 4, spread=0.0, strategy="horovod")
    sched = strategies.schedule("horovod")(p, Knobs())
    assert sched.negotiation(net) == fixed and net.fixed("gloo", "all_reduce") is None
    assert sched.negotiation(Network(2, Link.of(5e-6, 1e9))) == pytest.approx(2 * 5e-6)
    cycles = sched.run(net).detail["cycles"]
    plain = sched.run(dataclasses.replace(net, profiles={}))
    assert cycles >= 1 and sched.run(net).step > plain.step


def test_a_single_mode_bench_and_too_few_repeats_are_said(tmp_path):
    path, doc = bench_file(tmp_path, [0.30, 0.31, 0.30, 0.29, 0.30, 0.31])
    assert not Bench.load(path).bimodal and not [line for line in mode_lines(doc) if "two speeds" in line]
    _, few = bench_file(tmp_path, [0.30, 0.45, 0.30])
    assert any("too few to see two speeds" in line for line in mode_lines(few))


# -- overlap ------------------------------------------------------------------------------------------------------
def test_overlap_falls_back_to_the_stated_assumption():
    p = noisy(10, 7)
    c = sweep.curve(p, "ddp", Knobs(), link_net(), [2], "ddp")
    assert not c.overlap.measured and c.overlap.source.startswith("assumed, nothing measured")
    assert c.as_dict(0.8)["overlap"]["source"] == overlap.ASSUMED
    # a shaped run that traced no collective: still the assumption, and why
    o = overlap.measure(noisy(10, 8), p, strategies.schedule("ddp"), Knobs())
    assert not o.measured and "traced no collective" in o.source


def test_overlap_is_measured_from_a_slow_link_trace_and_corrects_the_step():
    ref = noisy(10, 9, spread=0.0)
    shaped = noisy(10, 9, spread=0.0, backward=14 * MS)  # backward 4 ms longer with communication in flight
    # the shaped run's all-reduces ran at 1 MiB/ms: the 4 MiB bucket (ready at 4 ms of ref's backward) takes 4 ms,
    # all of it hideable; the trace saw 2 ms of it inside backward's compute
    shaped.measured["allreduces"] = [(4 * MB, 4 * MS), (8 * MB, 8 * MS)]
    shaped = shaped.__class__(**{**shaped.__dict__, "samples": Samples(
        shaped.samples.phases, NAMES, shaped.samples.ready, np.full(10, 12 * MS), np.full(10, 2 * MS))})
    o = overlap.measure(shaped, ref, strategies.schedule("ddp"), Knobs(bucket_mb=4))
    assert o.measured and o.hide == pytest.approx(0.5) and o.slow == pytest.approx(2.0)
    assert "measured on noisy9" in o.source
    plain = sweep.curve(ref, "ddp", Knobs(bucket_mb=4), link_net(), [2], "ddp", sweep.Noise(replicates=0))
    fixed = sweep.curve(ref, "ddp", Knobs(bucket_mb=4), link_net(), [2], "ddp", sweep.Noise(replicates=0), o)
    s, f = plain.steps[0], fixed.steps[0]
    assert f.step == pytest.approx(s.step + s.hidden * (0.5 + 0.5 * 2.0))
    assert s.step <= s.no_overlap and f.no_overlap == s.no_overlap == pytest.approx(s.compute + s.comm)
    assert fixed.as_dict(0.8)["steps"][0]["no_overlap_ms"] == pytest.approx(s.no_overlap * 1e3, abs=1e-3)


# -- bf16, and the one fusion planner ---------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["ddp", "horovod", "fsdp"])
def test_bf16_is_modelled_like_fp16_and_halves_the_wire(strategy):
    p = noisy(5, 10)
    knobs = {c: sweep.knobs_of(dataclass_with(p, c), {}) for c in ("none", "fp16", "bf16")}
    assert knobs["bf16"].grad_compression == "bf16" and knobs["bf16"].wire == 0.5 == knobs["fp16"].wire
    steps = {c: strategies.schedule(strategy)(p, k).run(link_net()) for c, k in knobs.items()}
    assert steps["bf16"].step == steps["fp16"].step < steps["none"].step
    assert steps["bf16"].wire_bytes < steps["none"].wire_bytes
    assert "bf16 on the wire" in strategies.schedule(strategy)(p, knobs["bf16"]).describe_knobs()


def dataclass_with(p: Profile, compression: str) -> Profile:
    return p.__class__(**{**p.__dict__, "config": {"grad_compression": compression}})


def test_the_native_layer_and_predict_fuse_with_one_planner():
    from dpcompare import knobs
    from dpcompare.prediction.horovod import fuse

    sizes = [1, 3, 0.5, 0.5, 1, 0.25]
    grads = [Grad(str(i), 0.0, b * MB) for i, b in enumerate(sizes)]
    plan = knobs.horovod_fusion(range(6), [b * MB for b in sizes], threshold=2 * MB)
    assert [[int(g.name) for g in group] for group in fuse(grads, 2 * MB)] == plan == [[0], [1], [2, 3, 4], [5]]
    assert (
        Knobs().horovod_fusion_mb * MB == knobs.HOROVOD_FUSION_BYTES
        and Knobs().horovod_cycle_ms == knobs.HOROVOD_CYCLE_MS
    )


def test_overlap_from_a_run_whose_collectives_missed_backward_says_so(tmp_path):
    from test_predict import fake_run

    from conftest import dpcompare

    run, shaped = fake_run(tmp_path / "r"), fake_run(tmp_path / "shaped")  # its all-reduce starts after backward
    dpcompare("predict", str(run), "--hosts", "2", "--link", "1gbit", "--quiet", "--overlap-from", str(shaped),
              "--bootstrap", "20")
    out = json.loads((run / "prediction.json").read_text())
    said = out["curves"][0]["overlap"]
    assert not said["measured"] and "no communication ran during backward's compute" in said["source"]
    assert out["inputs"]["overlap_from"] == str(shaped) and out["inputs"]["bootstrap"] == 20


def test_the_bench_keeps_every_repeats_times_together():
    from dpcompare.lab.bench import _merged

    one = {"backend": "mpi", "collective": "allreduce", "bytes": 2**25}
    raw = [{**one, "times_s": [0.29, 0.28, 0.29]}, {**one, "bytes": 2**20, "times_s": [0.01] * 3},
           {**one, "times_s": [0.43, 0.42, 0.43]}]
    doc = analyse(_merged(raw), 2, 10**9)
    row = next(r for r in doc["rows"] if r["bytes"] == 2**25)
    assert row["times_s"] == [0.29, 0.28, 0.29, 0.43, 0.42, 0.43] and row["modes"]["labels"] == [0, 0, 0, 1, 1, 1]
    assert len(doc["rows"]) == 2


def test_the_sizes_timed_back_to_back_stay_apart_from_the_fits_and_are_said():
    from dpcompare.lab.bench import _merged, back_to_back_lines, tables

    one = {"backend": "mpi", "collective": "allreduce"}
    idle = [{**one, "bytes": b, "times_s": [t] * 3} for b, t in ((2**20, 0.0136), (2**22, 0.067))]
    raw = idle + [{**r, "times_s": [1.5 * r["times_s"][0]] * 3, "back_to_back": True} for r in idle]
    doc = analyse(_merged(raw), 2, 5 * 10**8, gap_ms=8.4)
    assert sum(bool(r.get("back_to_back")) for r in doc["rows"]) == 2 and len(doc["rows"]) == 4
    fit = doc["fits"][0]
    assert len(doc["fits"]) == 1 and fit["beta_s_per_byte"] == pytest.approx((0.067 - 0.0136) / (2**22 - 2**20))
    said = back_to_back_lines(doc)
    assert said == ["back to back (no idle gap): mpi all_reduce took 1 MiB 1.50×, 4 MiB 1.50× the time after the "
                    "8.4 ms gap (predict prices a collective that follows another from these)"]
    assert said[0] in tables(doc)


# -- the interval: the band widened by the model's own error -------------------------------------------------------
def test_the_conformal_widening_is_the_right_order_statistic_and_zero_inside_the_band():
    assert interval.score(100, 90, 110, 105) == 0 and interval.score(100, 90, 110, 130) == pytest.approx(0.2)
    assert interval.score(100, 90, 110, 80) == pytest.approx(0.1)
    scores = [0.0] * 27 + [0.05, 0.1, 0.3]  # n = 30: the ⌈31 × 0.9⌉ = 28th smallest
    assert interval.conformal(scores).widen == 0.05 and interval.conformal(scores, 0.95).widen == 0.3
    assert interval.conformal([0.2, 0.0]).widen == 0.2  # too few to leave any out: the largest
    with pytest.raises(ConfigError):
        interval.conformal([])


def test_a_curve_carries_the_interval_and_the_file_round_trips(tmp_path):
    me = interval.ModelError(0.1, 0.9, 24, "a test")
    c = sweep.curve(noisy(20, 5), "ddp", Knobs(), link_net(), [2], "ddp", sweep.Noise(replicates=50), model_error=me)
    (lo, hi), step = c.band(0), c.steps[0].step
    d = c.step_dict(0)
    assert d["interval_ms_low"] == pytest.approx((lo - 0.1 * step) * 1e3, abs=1e-3)
    assert d["interval_ms_high"] == pytest.approx((hi + 0.1 * step) * 1e3, abs=1e-3)
    assert c.as_dict(0.8)["model_error"]["widen"] == 0.1
    plain = sweep.curve(noisy(20, 5), "ddp", Knobs(), link_net(), [2], "ddp", sweep.Noise(replicates=0))
    assert "interval_ms_low" not in plain.step_dict(0) and plain.as_dict(0.8)["model_error"] is None
    path = interval.write(tmp_path / "me.json", me)
    assert interval.load(str(path)) == me and interval.load("none") is None
    assert interval.load(None) is interval.VALIDATED


def test_the_validation_merges_runs_widens_every_row_and_counts_overlapping_intervals(tmp_path):
    """bench/validate_predict.py analyse's plumbing on hand-made rows: two measure runs become rounds 1–4, the
    choosing set's scores give the widening, and the rounds' intervals overlap where their bands did not."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("validate_predict", Path(__file__).parents[1] / "bench" /
                                                  "validate_predict.py")
    vp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vp)  # type: ignore[union-attr]
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        (tmp_path / run / vp.RESULTS).write_text(json.dumps([{"round": k, "workload": "w"} for k in (1, 2)]))
    assert [r["round"] for r in vp.merged([tmp_path / "a", tmp_path / "b"])] == [1, 2, 3, 4]
    key = {"hosts": 2, "link": "1gbit", "strategy": "ddp", "workload": "mlp2048"}
    rows = [{**key, "round": k, "predicted_ms": p, "low_ms": p - 1, "high_ms": p + 1, "measured_ms": m,
             "choosing_set": True} for k, (p, m) in enumerate([(100, 100), (110, 121)], start=1)]
    me = vp.model_error(rows, None)  # scores 0 and 10/110 (121 measured, 111 the band's top): two rows, the largest
    assert me.widen == pytest.approx(10 / 110) and me.n == 2
    vp.widen(rows, me)
    assert all(r["in_interval"] for r in rows) and vp.rounds_agree(rows) == (0, 1)
    assert vp.rounds_agree(rows, "interval_low_ms", "interval_high_ms") == (1, 1)
    # the compute-matched diagnostic reads the measured runs' own forward phase beside their bench
    base = tmp_path / "round1" / "h2"
    for k, fwd in enumerate((12.0, 14.0)):
        (base / "1gbit" / f"ddp-mlp2048-r{k}").mkdir(parents=True)
        (base / "1gbit" / f"ddp-mlp2048-r{k}" / "summary.json").write_text(json.dumps({"timing": {"phases_ms": {
            "forward": fwd}}}))
    rec = {**key, "bench": str(base / "bench-1gbit.json"), "measured_ms": [100.0, 101.0]}
    assert vp.measured_forward_ms(rec) == 13.0 and vp.measured_forward_ms({**rec, "link": "200mbit"}) is None
    for r, (err, ratio) in zip(rows, ((4.0, 0.9), (-8.0, 1.3)), strict=True):
        r.update(family="mlp", matched_error_pct=err, forward_ratio=ratio, choosing_set=False)
    assert vp._matched_lines(rows, ["mlp"])[-1] == "| held out, all | 2 | 6.0 % | 8.0 % | -2.0 % | 1.10 (0.90–1.30) |"


def test_interleaved_traces_keep_their_own_compute_and_give_the_spread_together(tmp_path):
    """bench/validate_predict.py with --interleave: each configuration carries its own trace (taken right before its
    measurement); its profile is that trace's, and the launches' spread comes from every trace of the arm in the
    round (one per link: 2 arms × 3 links, 4 degrees of freedom)."""
    import importlib.util
    from pathlib import Path

    from test_predict import fake_run

    spec = importlib.util.spec_from_file_location("validate_predict", Path(__file__).parents[1] / "bench" /
                                                  "validate_predict.py")
    vp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vp)  # type: ignore[union-attr]
    # --min-seconds: a 40 ms step is traced and timed 50 times for 2 s, a 500 ms one its 6, none more than 64
    assert [vp.sized(6, ms, 2.0) for ms in (40.0, 500.0, 1.0, None)] == [50, 6, 64, 6] and vp.sized(6, 40.0, 0) == 6
    log = []
    for s in ("ddp", "horovod"):
        for link, slower in (("1gbit", 1.0), ("500mbit", 1.2), ("200mbit", 0.9)):
            t = fake_run(tmp_path / link / f"{s}-w-traced" / "traced-0", strategy=s, steps=4, slower=slower)
            log.append({"round": 1, "hosts": 2, "link": link, "strategy": s, "workload": "w", "trace": [str(t)]})
    profiles = vp.arms(log)
    assert len(profiles) == 6
    own = {r["link"]: profiles[vp.traces(r)] for r in log if r["strategy"] == "ddp"}
    assert own["500mbit"].data == pytest.approx(1.2 * own["1gbit"].data)  # each its own trace, not pooled
    assert {(p.spread.df, p.spread.arms, p.spread.launches) for p in profiles.values()} == {(4, 2, 6)}
