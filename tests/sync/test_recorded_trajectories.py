"""Recorded-trajectory regression tests: today's interval records and final parameters, per method.

Each scenario is a short deterministic simulated run (:class:`LocalWorkers` +
:class:`SimulatedCommunicator`, the toy model of ``autoloco_hf.toy.pattern``). Its interval
records are committed as ``tests/sync/fixtures/<name>.jsonl`` and its run totals
and final outer parameters as ``<name>.final.json``; the test reruns the
scenario and fails on the first interval and field that differ. Any change of
the trajectory (horizons, decisions, phases, tokens, bytes, statistics, the
outer step) fails here, so an unintended one is caught and an intended one is
made visible.

After an intended change, regenerate and commit the fixtures (review the diff)::

    python tests/sync/test_recorded_trajectories.py --regenerate [--only NAME ...]

What is compared (see ``tests/sync/fixtures/README.md``):

* only the keys the fixture holds (a record field added later does not fail the
  test; a recorded field that disappears does), never the timing fields (names
  ending in ``seconds``);
* integers, strings, booleans and ``None`` exactly;
* floats and the SHA-256 of the final FP32 parameters exactly when the run
  happens where the fixture was recorded (same torch version, machine and CPU
  capability); elsewhere float kernels may round differently in the last bit,
  so floats are compared with ``FLOAT_RTOL_ELSEWHERE`` (z-scores: ``Z_SCORE_ATOL_ELSEWHERE``)
  and the hash is skipped.

Runs use one intra-op thread (restored afterwards); the results were checked to
be the same with two.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.state.records import read_jsonl
from autoloco_hf.sync.communicators import make_communicator
from autoloco_hf.sync.workers.local_workers import LocalWorkers

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REGENERATE = "python tests/sync/test_recorded_trajectories.py --regenerate"
# Elsewhere (another torch build, machine or CPU capability), measured: statistics move by up to
# 4e-4 relative and the z-scores, differences of nearly equal numbers over a spread, by up to 7e-4
# absolute (fixtures/README.md).
FLOAT_RTOL_ELSEWHERE = 1e-2
FLOAT_ATOL_ELSEWHERE = 1e-6
Z_SCORE_ATOL_ELSEWHERE = 1e-2
Z_SCORES = frozenset({"z_drift", "z_coherence"})
HEAD_ELEMENTS = 4  # leading elements of the final parameters written out as floats


@dataclass(frozen=True)
class Scenario:
    """One recorded run; ``pins`` says what its fixture is there to show."""

    name: str
    config: AutoLoCoConfig
    steps: int
    pins: str
    warmup_steps: int = 0
    workers: int = 2
    padded: bool = False  # token density varies over time (autoloco_hf.toy.pattern: batch_for)


SCENARIOS = (
    Scenario(
        "diloco",
        AutoLoCoConfig(method="diloco", h_base=4),
        steps=32,
        warmup_steps=4,
        workers=3,
        pins="fixed horizon, Nesterov outer step, FP32 all-reduce of 3 workers",
    ),
    Scenario(
        "autoloco",
        AutoLoCoConfig(method="autoloco", controller="paper", h_base=4, q_h=2, h_max=10),
        steps=160,
        warmup_steps=8,
        padded=True,
        pins="all controller phases, proposals and adoptions 4 -> 10 "
        "reference steps, token mapping",
    ),
    Scenario(
        "qsr",
        AutoLoCoConfig(method="qsr", h_base=4),
        steps=80,
        warmup_steps=8,
        pins="H_base in warm-up, then intervals growing as the learning rate decays",
    ),
    Scenario(
        "linear",
        AutoLoCoConfig(method="linear", linear_increment=3),
        steps=60,
        pins="intervals 3, 6, 9, ... and a truncated last one",
    ),
    Scenario(
        "autoloco_int8",
        AutoLoCoConfig(
            method="autoloco",
            controller="paper",
            h_base=4,
            q_h=1,
            h_max=8,
            wire_dtype="int8",
            int8_block_size=256,
        ),
        steps=120,
        warmup_steps=8,
        padded=True,
        pins="INT8 owner-reduce wire (blocks of 256), adaptive horizon whose step "
        "length follows token density",
    ),
    Scenario(
        "diloco_bf16",
        AutoLoCoConfig(method="diloco", h_base=4, wire_dtype="bf16"),
        steps=32,
        warmup_steps=4,
        pins="BF16 owner-reduce wire",
    ),
)
BY_NAME = {s.name: s for s in SCENARIOS}


def is_timing(key: str) -> bool:
    """Wall-clock fields differ on every run and are neither recorded nor compared."""
    return key.endswith("seconds")


def environment() -> dict[str, str]:
    """What decides whether float results can be bit-identical to the recording."""
    return {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernels": kernel_fingerprint(),
    }


def kernel_fingerprint() -> str:
    """SHA-256 of the toy model after three AdamW steps on
    fixed batches: the float kernels the scenarios use.

    Two machines with the same torch build and CPU capability can still round differently (another
    CPU model's matmul blocking); this tells them apart where the three fields above cannot.
    """
    from autoloco_hf.toy.pattern import adamw, batch_for, make_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = make_model()
        optimizer = adamw(model.parameters())
        for step in range(3):
            model(**batch_for(0, step)).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    finally:
        torch.set_num_threads(threads)
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def run(scenario: Scenario) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train the scenario; returns its records (timing fields dropped) and its final summary."""
    from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model

    runner = LocalWorkers(
        scenario.config,
        make_model(),
        make_communicator(scenario.config, distributed=False, simulated_workers=scenario.workers),
        optimizer_factory=adamw,
        scheduler_factory=cosine(scenario.steps, scenario.warmup_steps),
        total_steps=scenario.steps,
        warmup_steps=scenario.warmup_steps,
    )
    threads = torch.get_num_threads()
    # fast on a shared CI machine; the toy model's results do not depend on it
    torch.set_num_threads(1)
    try:
        for step in range(scenario.steps):
            runner.train_step(
                [batch_for(w, step, scenario.padded) for w in range(scenario.workers)]
            )
    finally:
        torch.set_num_threads(threads)
    # through JSON, as the engine writes records, so that values compare as they are stored
    records = [
        {k: v for k, v in json.loads(r.to_json()).items() if not is_timing(k)}
        for r in runner.engine.records
    ]
    params = runner.engine.outer.params.detach().to(torch.float32).contiguous()
    final = {
        "totals": {k: v for k, v in runner.engine.totals.as_dict().items() if not is_timing(k)},
        "params_sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
        "params_numel": params.numel(),
        "params_sum": float(params.double().sum()),
        "params_norm": float(params.double().norm()),
        "params_head": [float(x) for x in params[:HEAD_ELEMENTS]],
    }
    return records, final


def _same(key: str, recorded: Any, got: Any, exact: bool) -> bool:
    if isinstance(recorded, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        if math.isnan(recorded) or math.isnan(got):
            return math.isnan(recorded) and math.isnan(got)
        if exact:
            return recorded == got
        atol = Z_SCORE_ATOL_ELSEWHERE if key in Z_SCORES else FLOAT_ATOL_ELSEWHERE
        return math.isclose(recorded, got, rel_tol=FLOAT_RTOL_ELSEWHERE, abs_tol=atol)
    if isinstance(recorded, list) and isinstance(got, list):
        return len(recorded) == len(got) and all(
            _same(key, a, b, exact) for a, b in zip(recorded, got)
        )
    return type(recorded) is type(got) and recorded == got


def first_difference(
    recorded: list[dict[str, Any]], got: list[dict[str, Any]], exact: bool, what: str = "interval"
) -> str | None:
    """A one-line description of the first differing entry and key, or ``None`` when they agree.

    Only the keys of ``recorded`` are compared: a key that
    ``got`` adds is ignored, a key it lacks is a difference.
    """
    for i, (want, have) in enumerate(zip(recorded, got)):
        where = f"{what} {i}" + (
            f" (start_step {want['start_step']})" if "start_step" in want else ""
        )
        for key, value in want.items():
            if is_timing(key):
                continue
            if key not in have:
                return f"{where}: field {key!r} is recorded but no longer produced"
            if not _same(key, value, have[key], exact):
                return f"{where}, field {key!r}: recorded {value!r}, got {have[key]!r}"
    if len(recorded) != len(got):
        return f"{len(recorded)} {what}s recorded, got {len(got)}"
    return None


def fixture_paths(name: str) -> tuple[Path, Path]:
    return FIXTURES / f"{name}.jsonl", FIXTURES / f"{name}.final.json"


def write_fixture(scenario: Scenario) -> None:
    records, final = run(scenario)
    records_path, final_path = fixture_paths(scenario.name)
    FIXTURES.mkdir(exist_ok=True)
    with open(records_path, "w") as f:
        f.writelines(json.dumps(r, allow_nan=True) + "\n" for r in records)
    with open(final_path, "w") as f:
        json.dump({"pins": scenario.pins, "environment": environment(), **final}, f, indent=1)
        f.write("\n")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_run_reproduces_the_recorded_trajectory(scenario: Scenario) -> None:
    records_path, final_path = fixture_paths(scenario.name)
    assert records_path.exists() and final_path.exists(), (
        f"no fixture for {scenario.name!r}: run `{REGENERATE}`"
    )
    recorded_final = json.loads(final_path.read_text())
    # fixtures recorded without "kernels": never exact
    exact = recorded_final["environment"] == environment()
    records, final = run(scenario)
    hint = (
        f"the trajectory of {scenario.name!r} changed "
        f"({'exact' if exact else f'rel_tol {FLOAT_RTOL_ELSEWHERE}'} comparison). If the change is "
        f"intended, run `{REGENERATE} --only {scenario.name}` and commit the diff."
    )
    params = {k: v for k, v in recorded_final.items() if k.startswith("params_")}
    # last-bit differences elsewhere change the hash; the sum, norm and head still pin the values
    if not exact:
        params.pop("params_sha256")
    for difference in (
        first_difference(read_jsonl(str(records_path)), records, exact),
        first_difference([recorded_final["totals"]], [final["totals"]], exact, what="run totals"),
        first_difference([params], [final], exact, what="final outer parameters"),
    ):
        if difference is not None:
            pytest.fail(f"{difference}\n{hint}", pytrace=False)


def test_fixtures_show_what_they_pin() -> None:
    """A regenerated fixture must still exercise its method:
    adaptation, growing intervals, the wire format."""
    runs = {s.name: read_jsonl(str(fixture_paths(s.name)[0])) for s in SCENARIOS}
    for name in ("autoloco", "autoloco_int8"):
        rows = runs[name]
        decisions = {r["decision"] for r in rows}
        assert {"propose", "adopt"} <= decisions, (
            f"{name}: no adopted proposal in {sorted(decisions)}"
        )
        assert {"warmup", "calibration", "variability", "monitoring", "candidate"} <= {
            r["phase"] for r in rows
        }
        assert len({r["h_tok"] for r in rows}) >= 3, f"{name}: the horizon did not adapt"
        assert len({r["tokens"] // r["h_step"] for r in rows}) > 1, (
            f"{name}: the token density never changed"
        )
    assert len({r["h_step"] for r in runs["autoloco_int8"][:-1]}) > 1, (
        "the step length did not follow the density"
    )
    qsr = [r["h_step"] for r in runs["qsr"][:-1]]
    assert qsr[0] == 4 and qsr == sorted(qsr) and qsr[-1] > 2 * qsr[0], (
        f"qsr intervals do not grow: {qsr}"
    )
    assert [r["h_step"] for r in runs["linear"][:-1]] == [3, 6, 9, 12, 15]
    assert {r["h_step"] for r in runs["diloco"]} == {4}
    fp32 = runs["diloco"][0]["payload_bytes"]
    assert runs["diloco_bf16"][0]["payload_bytes"] * 2 == fp32, (
        "BF16 must send half the FP32 payload"
    )
    assert 0 < runs["autoloco_int8"][0]["wire_bytes"] < fp32 / 2, (
        "INT8 must send about a quarter of FP32"
    )


def test_first_difference_names_interval_and_field() -> None:
    recorded = [
        {"start_step": 0, "h_step": 4, "mu": 0.5},
        {"start_step": 4, "h_step": 4, "mu": 0.5},
    ]
    assert (
        first_difference(recorded, [dict(r, added_later=1) for r in recorded], exact=True) is None
    )
    changed = [recorded[0], dict(recorded[1], h_step=6)]
    assert (
        first_difference(recorded, changed, exact=True)
        == "interval 1 (start_step 4), field 'h_step': recorded 4, got 6"
    )
    gone = [recorded[0], {"start_step": 4, "h_step": 4}]
    assert "field 'mu' is recorded but no longer produced" in first_difference(
        recorded, gone, exact=True
    )
    assert first_difference(recorded, recorded[:1], exact=True) == "2 intervals recorded, got 1"
    nudged = [recorded[0], dict(recorded[1], mu=0.5 * (1 + 1e-9))]
    assert first_difference(recorded, nudged, exact=False) is None
    assert "field 'mu'" in first_difference(recorded, nudged, exact=True)
    moved = [recorded[0], dict(recorded[1], mu=0.5 * (1 + 2 * FLOAT_RTOL_ELSEWHERE))]
    assert "field 'mu'" in first_difference(recorded, moved, exact=False)
    assert (
        first_difference([{"z_drift": 0.0}], [{"z_drift": Z_SCORE_ATOL_ELSEWHERE / 2}], exact=False)
        is None
    )
    assert (
        first_difference([{"mu": 0.0}], [{"mu": Z_SCORE_ATOL_ELSEWHERE / 2}], exact=False)
        is not None
    )
    assert first_difference([{"loss": math.nan}], [{"loss": math.nan}], exact=True) is None
    assert first_difference([{"z": None}], [{"z": 0.0}], exact=False) is not None
    assert first_difference([{"seconds": 1.0}], [{"seconds": 2.0}], exact=True) is None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Regenerate the recorded-trajectory fixtures after an intended change."
    )
    parser.add_argument(
        "--regenerate",
        action="store_true",
        required=True,
        help="rerun the scenarios and rewrite the fixtures",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BY_NAME),
        help="regenerate this scenario only (repeatable)",
    )
    args = parser.parse_args(argv)
    for name in args.only or list(BY_NAME):
        write_fixture(BY_NAME[name])
        print(f"wrote {', '.join(str(p) for p in fixture_paths(name))}")


if __name__ == "__main__":
    main()
