"""perf.capture_loss: the oracle's price of time, each phase's charge, and that the parts add up."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from eerl.control.eerl import create_eerl_controller
from eerl.phases import ControllerState
from eerl_sim.bench.multinode import figures
from eerl_sim.bench.runner import ScenarioRun
from eerl_sim.scenario import load_scenario

from perf.capture_loss import DEFAULT, phase_charges, run_loss, time_price
from perf.promise import without_phase_noise

C, E = ControllerState.COMMITTED, ControllerState.EXPLORING


def test_the_price_of_time_is_the_frontiers_slope_below_the_threshold() -> None:
    """Three pairs along a line of 10 J per second: the price is 10; with the energy minimum already
    inside the threshold nothing is saved by going slower, and the price is 0."""
    wall = np.array([[100.0, 100.3, 100.6]])
    energy = np.array([[50.0, 47.0, 44.0]])
    assert time_price(energy, wall, 100.0, 1.0) == pytest.approx(10.0)
    flat = np.array([[10.0, 20.0, 30.0]])
    assert time_price(flat, wall, 100.0, 0.99) == 0.0


def test_each_phase_is_charged_its_energy_and_its_time_at_the_price_against_the_oracles_clock() -> None:
    """Columns: clock 1000 (the oracle's), 1100, and the default at the top. A phase at the oracle's
    clock costs nothing; a faster one costs its energy less the time it saved at the price; default
    phases go to their own group whatever the state."""
    duration = np.array([[10.0, 9.0, 8.0]] * 3)
    energy = np.array([[100.0, 110.0, 130.0]] * 3)
    column_of = {1000: 0, 1100: 1, None: 2}
    charges = phase_charges(
        [1000, 1100, None],
        [C, E, C],
        column_of=column_of,
        duration_s=duration,
        energy_j=energy,
        oracle_column=0,
        price=5.0,
    )
    assert charges == pytest.approx({C.value: 0.0, E.value: 10.0 - 5.0, DEFAULT: 30.0 - 10.0})


def test_the_parts_add_up_to_what_the_run_fell_short_of_the_oracle() -> None:
    """On a real (short, quiet) run the groups, the unspent throughput and the switches' rest sum to
    1 - capture, as perf.promise measures it, and the rest is small."""
    scenario = without_phase_noise(load_scenario("sync-h100"))
    run = ScenarioRun(scenario, iterations=40)
    threshold = 0.95
    loss = run_loss(run, threshold)
    default = run.default_totals()
    _, oracle = run.oracle(threshold)
    online = run.run_online(create_eerl_controller, threshold).totals
    capture = figures(online, default).savings / figures(oracle, default).savings
    assert sum(loss.values()) == pytest.approx(1.0 - capture, abs=1e-12)
    assert abs(loss["lock switches"]) < 0.002  # the table accounts for all but the clocks' switching
    assert loss["generation default"] > 0  # four baseline phases at least, each giving up the oracle's saving
    assert {"generation default", "training default", "unspent"} <= loss.keys()


def test_without_phase_noise_only_the_phase_noise_goes() -> None:
    """Single- and multi-node: the phase noise is 0, everything else (the segments' noise included) as it
    was."""
    for name in ("noisy-h100", "multinode-4-h100"):
        scenario = load_scenario(name)
        quiet = without_phase_noise(scenario)
        assert quiet.gpu.noise_phase_duration == quiet.gpu.noise_phase_power == 0.0
        assert quiet.gpu.noise_duration == scenario.gpu.noise_duration > 0
        gpu = dataclasses.replace(quiet.gpu, noise_phase_duration=scenario.gpu.noise_phase_duration)
        gpu = dataclasses.replace(gpu, noise_phase_power=scenario.gpu.noise_phase_power)
        assert gpu == scenario.gpu
        if scenario.workload.nodes is not None:
            assert quiet.workload.nodes is not None
            assert quiet.workload.nodes.noise_phase_duration == quiet.workload.nodes.noise_phase_power == 0.0
            assert quiet.workload.nodes.speed_sigma == scenario.workload.nodes.speed_sigma
    # The same draws of work, priced with and without each phase's noise (3 % on noisy-h100): the same
    # workloads, default durations apart by about that noise.
    noisy = ScenarioRun(load_scenario("noisy-h100"), iterations=8)
    quiet_run = ScenarioRun(without_phase_noise(load_scenario("noisy-h100")), iterations=8)
    for kind, durations in noisy.price_table().duration_s.items():
        assert all(
            noisy.sample(i).phase(kind).workload == quiet_run.sample(i).phase(kind).workload for i in range(8)
        )
        apart = np.log(durations[:, -1] / quiet_run.price_table().duration_s[kind][:, -1])
        assert 0.005 < float(np.std(apart)) < 0.06
