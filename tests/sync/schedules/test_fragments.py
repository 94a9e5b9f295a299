"""Streaming fragments (docs/algorithm.md#fragments): staggered
fragment syncs, per-fragment outer state, round statistics."""

from __future__ import annotations

import io
import itertools
import math
import re

import pytest
import torch
from _dist import run_gloo
from test_overlap import config as overlap_config
from test_overlap import runner_for  # the same toy run (STEPS 40, warm-up 4)
from toy import TIMING_FIELDS

import autoloco_hf.sync.schedules.factory as factory
from autoloco_hf import AutoLoCoConfig, ConfigError
from autoloco_hf.algorithm.schedule import FunctionSchedule
from autoloco_hf.sync.communicators import ProcessGroupCommunicator, SimulatedCommunicator
from autoloco_hf.sync.engine.fragments import (
    fragment_event_offset,
    on_local_tensors,
    split_fragments,
)
from autoloco_hf.sync.schedules.streaming import FragmentSchedule
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import batch_for
from autoloco_hf.wire.accounting import payload_bytes

STEPS, WARMUP = 40, 4


def config(**overrides) -> AutoLoCoConfig:
    """test_overlap's configuration of these trajectories,
    with 2 fragments unless told otherwise."""
    return overlap_config(**{"fragments": 2, **overrides})


def train(
    runner: LocalWorkers, first: int, last: int, workers: tuple[int, ...], each_step=None
) -> None:
    for step in range(first, last):
        runner.train_step([batch_for(w, step, padded=True) for w in workers])
        if each_step is not None:
            each_step(runner)


def simulated(cfg: AutoLoCoConfig, each_step=None) -> LocalWorkers:
    runner = runner_for(cfg, SimulatedCommunicator(2, wire_dtype=cfg.wire_dtype))
    train(runner, 0, STEPS, (0, 1), each_step)
    return runner


def records_of(runner: LocalWorkers) -> list[dict]:
    return [
        {k: v for k, v in r.__dict__.items() if k not in TIMING_FIELDS}
        for r in runner.engine.records
    ]


def same_params(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


# ------------------------------------------------------------------ layout and timing
def test_fragments_are_contiguous_whole_tensors_balanced_by_bytes():
    sizes = [512, 256, 16, 512, 32]
    two = split_fragments(sizes, 2)
    assert [(f.first, f.last, f.span) for f in two] == [(0, 2, (0, 768)), (2, 5, (768, 1328))]
    four = split_fragments([100] * 8, 4)
    assert [f.span for f in four] == [(0, 200), (200, 400), (400, 600), (600, 800)]
    # never empty
    assert [(f.first, f.last) for f in split_fragments([1000, 1, 1], 3)] == [(0, 1), (1, 2), (2, 3)]
    assert split_fragments(sizes, 1)[0].span == (0, 1328)
    # the largest fragment is as small as whole tensors allow
    # (nearest-to-k/F cuts alone would give 544 here)
    assert [f.span for f in split_fragments(sizes, 4)] == [
        (0, 512),
        (512, 784),
        (784, 1296),
        (1296, 1328),
    ]
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 9, (1,), generator=generator))
        layout = torch.randint(1, 50, (n,), generator=generator).tolist()
        count = int(torch.randint(1, n + 1, (1,), generator=generator))
        split = split_fragments(layout, count)
        assert [f.first for f in split] + [n] == [0] + [f.last for f in split] and all(
            f.numel > 0 for f in split
        )
        smallest = min(
            max(sum(layout[a:b]) for a, b in zip((0, *cuts), (*cuts, n)))
            for cuts in itertools.combinations(range(1, n), count - 1)
        )
        assert max(f.numel for f in split) == smallest, (layout, count)
    with pytest.raises(
        ValueError, match="fragments=6 but the model has 5 parameter tensors: use fragments <= 5"
    ):
        split_fragments(sizes, 6)


def test_fragment_f_syncs_at_ceil_of_f_plus_one_h_over_f_and_all_at_the_budget_end():
    assert [fragment_event_offset(f, 4, 10, last_round=False) for f in range(4)] == [3, 5, 8, 10]
    assert [fragment_event_offset(f, 3, 7, last_round=False) for f in range(3)] == [3, 5, 7]
    assert [fragment_event_offset(f, 1, 7, last_round=False) for f in range(1)] == [7]
    assert [fragment_event_offset(f, 4, 6, last_round=True) for f in range(4)] == [6, 6, 6, 6]


def test_config_validates_fragments_in_one_line():
    assert AutoLoCoConfig().fragments == 1
    config(overlap="delayed", overlap_steps=1)  # 2 fragments x (1 + 1) steps fit in h_min = 4
    # one residual per fragment (docs/algorithm.md#error-feedback)
    assert config(wire_dtype="int8", error_feedback=True).error_feedback
    cases = [
        (dict(fragments=0), "fragments=0 is invalid: it must be >= 1"),
        (
            dict(overlap="delayed", overlap_steps=2),
            "fragments=2 is invalid: .* at least 6 steps .* plans 4",
        ),
        (dict(fragments=5), "fragments=5 is invalid: .* use fragments <= 4 or longer intervals"),
        (
            dict(overlap="eager"),
            "overlap='eager' is invalid: with fragments=2, eager overlap does not combine",
        ),
        (dict(method="ddp"), "fragments=2 is invalid: DDP averages gradients every step"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            config(**overrides)


# ------------------------------------------------------------------ F = 1 is today's engine
@pytest.mark.parametrize(
    "overrides", [{}, {"overlap": "delayed", "overlap_steps": 1, "wire_dtype": "int8"}]
)
def test_the_fragment_schedule_with_one_fragment_is_todays_engine_bit_for_bit(
    overrides, monkeypatch
):
    cfg = config(fragments=1, **overrides)
    today = simulated(cfg)
    monkeypatch.setattr(factory, "make_sync_schedule", lambda c: FragmentSchedule(c.overlap))
    streamed = simulated(cfg)
    assert isinstance(streamed.engine.sync, FragmentSchedule)
    assert records_of(streamed) == records_of(today)
    assert len({r["decision"] for r in records_of(today)}) > 1, (
        "the controller should take decisions"
    )
    for w in (0, 1):
        assert same_params(streamed.models[w], today.models[w])


# ------------------------------------------------------------------ the schedule
@pytest.mark.parametrize("overlap", ["none", "delayed"])
def test_each_fragment_is_synchronized_at_its_offset_and_the_run_ends_on_one_model(overlap):
    cfg = config(method="diloco", overlap=overlap, overlap_steps=1, overlap_mix=0.0)
    seen = {}

    def each_step(runner):
        first, second = (list(m.parameters()) for m in runner.models)
        seen[runner.step] = [
            all(
                torch.equal(p, q) for p, q in zip(first[f.first : f.last], second[f.first : f.last])
            )
            for f in runner.engine.fragments
        ]

    runner = simulated(cfg, each_step)
    # H = 4, F = 2: fragment 0 synchronized at steps 2, 6, ..., fragment 1 at
    # the boundaries 4, 8, ...; a delayed result (alpha = 0: copied) is
    # written one step later; the replicas drift apart again at the next step
    delay = 1 if overlap == "delayed" else 0
    for step in range(2, 38):  # the warm-up's first step has learning rate 0
        assert seen[step] == [step % 4 == (2 + delay) % 4, step % 4 == delay], step
    # the budget's last interval [36, 40) synchronizes both fragments at its end
    assert [seen[s] for s in (38, 39, 40)] == [[False, False], [False, False], [True, True]]
    assert [r.start_step for r in runner.engine.records] == list(range(0, STEPS, 4))


def test_each_fragment_has_its_own_slice_of_the_outer_state_and_moves_only_at_its_sync():
    cfg = config(method="diloco")
    outer_at = {}
    runner = simulated(
        cfg, lambda r: outer_at.setdefault(r.step, r.engine.outer.params.detach().clone())
    )
    first, second = (slice(*f.span) for f in runner.engine.fragments)
    for step in range(9, 18):
        before, after = outer_at[step - 1], outer_at[step]
        moved = [
            not torch.equal(before[first], after[first]),
            not torch.equal(before[second], after[second]),
        ]
        assert moved == [step % 4 == 2, step % 4 == 0], step
    assert len(runner.engine.outer.optimizer.param_groups) == 2


def test_bytes_per_sync_event_are_one_fragment_of_a_whole_model_sync():
    torch.manual_seed(0)
    models = [torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)]) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    for wire in ("fp32", "int8"):
        comm = SimulatedCommunicator(2, wire_dtype=wire, block_size=8)
        events = []
        average = comm.average

        def counted(
            flats,
            scalars,
            segment_sizes,
            wire_dtype=None,
            check=None,
            average=average,
            events=events,
        ):
            events.append(flats[0].numel())
            return average(flats, scalars, segment_sizes, wire_dtype, check)

        comm.average = counted
        cfg = AutoLoCoConfig(
            method="diloco", h_base=8, fragments=4, wire_dtype=wire, int8_block_size=8
        )
        engine = factory.make_engine(
            cfg, models, FunctionSchedule(lambda s: 1e-2, 16), comm, total_steps=16
        )
        for _ in range(16):
            for m in models:
                with torch.no_grad():
                    for p in m.parameters():
                        p.add_(0.01 * torch.randn_like(p))
            engine.after_optimizer_step(tokens=[8, 8], losses=[1.0, 1.0])
        whole = sum(p.numel() for p in models[0].parameters())
        assert events == [whole // 4] * 8  # 2 intervals x 4 fragments, a quarter of the model each
        whole_bytes = payload_bytes(1, whole, wire, block_size=8)
        assert (
            engine.fragment_payload_bytes == [payload_bytes(1, whole // 4, wire, block_size=8)] * 4
        )
        assert max(engine.fragment_payload_bytes) <= whole_bytes / 4 * 1.02
        assert engine.totals.syncs == 2 and engine.records[0].payload_bytes == sum(
            engine.fragment_payload_bytes
        )


# ------------------------------------------------------------------ the controller's statistics
def test_interval_statistics_are_the_sums_of_the_fragments_parts():
    """Fragments measured on the same models give the whole model's D_t, C_t, tokens and loss
    (docs/algorithm.md#fragments-and-the-rule)."""
    whole = runner_for(config(fragments=1, h_base=8, q_h=4, h_max=12), SimulatedCommunicator(2))
    split = runner_for(config(fragments=2, h_base=8, q_h=4, h_max=12), SimulatedCommunicator(2))
    for runner in (whole, split):
        train(runner, 0, 3, (0, 1))  # inside the first interval, before fragment 0's sync at step 4
        for w in (0, 1):
            assert same_params(runner.models[w], whole.models[w])
    interval = whole.engine.current_interval
    result = whole.engine.comm.average(
        *whole.engine.contributions(interval), whole.engine.segment_sizes
    )
    reference = whole.engine.aggregate(result, 1.0)
    parts = []
    for fragment in split.engine.fragments:
        last = fragment.index == len(split.engine.fragments) - 1
        deltas, messages = split.engine.contributions(interval, fragment=fragment, counted=last)
        sizes = split.engine.segment_sizes[fragment.first : fragment.last]
        parts.append(split.engine.collect(split.engine.comm.average(deltas, messages, sizes)))
    combined = split.engine.combine(parts, 1.0, None)
    assert len(split.engine.fragments) == 2
    for name in ("drift_energy", "coherence", "disagreement", "normalized_drift"):
        assert math.isclose(
            getattr(combined.stats, name), getattr(reference.stats, name), rel_tol=1e-12
        ), name
    assert combined.stats.drift_energy > 0 and 0 < combined.stats.coherence < 2
    assert (combined.control.totals.tokens, combined.mean_loss) == (
        reference.control.totals.tokens,
        reference.mean_loss,
    )
    assert combined.valid and combined.all_finite


# ------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("overlap", ["none", "delayed"])
def test_resume_in_the_middle_of_a_round_continues_the_same_trajectory(overlap):
    cfg = config(h_base=8, q_h=4, h_max=12, fragments=4, overlap=overlap, overlap_steps=1)
    full = simulated(cfg)
    # interval [8, 16): fragments synchronized at 10, 12, 14, 16; stop after fragment 1's sync (13),
    # or with its delayed result still in flight (12, merged at 13)
    cut = 12 if overlap == "delayed" else 13
    first = runner_for(cfg, SimulatedCommunicator(2))
    train(first, 0, cut, (0, 1))
    interval = first.engine.current_interval
    assert (interval.start_step, interval.h_step, first.engine.sync.next_fragment) == (8, 8, 2)
    if overlap == "delayed":
        assert first.engine.in_flight is not None and first.engine.in_flight.fragment == 1
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = runner_for(cfg, SimulatedCommunicator(2), seed=1)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    train(resumed, first.step, STEPS, (0, 1))
    for w in (0, 1):
        assert same_params(full.models[w], resumed.models[w])
    assert records_of(full) == records_of(resumed)


def test_resume_refuses_a_checkpoint_with_another_number_of_fragments():
    first = runner_for(config(fragments=2), SimulatedCommunicator(2))
    with pytest.raises(
        ValueError,
        match="config.fragments=2 when the checkpoint was written, this run has fragments=1",
    ):
        runner_for(config(fragments=1), SimulatedCommunicator(2)).load_state_dict(
            first.state_dict()
        )


# ------------------------------------------------------------------ simulation == gloo processes
def _run_case(rank: int, overlap: str, wire: str, controller: str) -> dict:
    outer = []
    runner = runner_for(
        config(overlap=overlap, overlap_steps=1, wire_dtype=wire, controller=controller),
        ProcessGroupCommunicator(wire_dtype=wire),
        seed=rank,
        on_record=lambda r: outer.append(
            (
                runner.engine.outer.params.detach().clone(),
                runner.engine.outer.momentum_buffer.clone(),
            )
        ),
    )
    train(runner, 0, STEPS, (rank,))
    params = [p.detach().clone() for p in runner.models[0].parameters()]
    return {"params": params, "records": records_of(runner), "outer": outer}


# the paper's rule, and the default rule (descent, its drift
# guard's anchors measured per fragment round)
GLOO_CASES = [
    ("none", "fp32", "paper"),
    ("delayed", "int8", "paper"),
    ("delayed", "fp32", "descent"),
]


def _process_worker(rank: int, world_size: int) -> dict:
    """Every case, one after the other, in one pair of
    processes: their start-up is paid once, not per case."""
    return {case: _run_case(rank, *case) for case in GLOO_CASES}


@pytest.fixture(scope="module")
def gloo_runs() -> list[dict]:
    return run_gloo(_process_worker, 2, timeout=600)


@pytest.mark.parametrize(("overlap", "wire", "controller"), GLOO_CASES)
def test_two_gloo_processes_equal_two_simulated_workers(gloo_runs, overlap, wire, controller):
    outer_sim = []
    cfg = config(overlap=overlap, overlap_steps=1, wire_dtype=wire, controller=controller)
    sim = runner_for(
        cfg,
        SimulatedCommunicator(2, wire_dtype=wire),
        on_record=lambda r: outer_sim.append(
            (sim.engine.outer.params.detach().clone(), sim.engine.outer.momentum_buffer.clone())
        ),
    )
    train(sim, 0, STEPS, (0, 1))
    results = [run[(overlap, wire, controller)] for run in gloo_runs]

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "wire_bytes"} for r in rows]

    for rank, result in enumerate(results):
        for p, q in zip(result["params"], sim.models[rank].parameters()):
            assert torch.equal(p, q), f"rank {rank} parameters differ from simulated worker {rank}"
        assert strip(result["records"]) == strip(records_of(sim))
        assert len(result["outer"]) == len(outer_sim) >= 4
        for (theta, momentum), (theta_sim, momentum_sim) in zip(result["outer"], outer_sim):
            assert torch.equal(theta, theta_sim) and torch.equal(momentum, momentum_sim)


def test_a_non_finite_fragment_skips_its_outer_step_and_the_interval_is_invalid():
    cfg = config(method="diloco")
    runner = runner_for(cfg, SimulatedCommunicator(2))
    train(runner, 0, 6, (0, 1))  # interval [4, 8): fragment 0 synced at 6, fragment 1 at 8
    theta = runner.engine.outer.params.detach().clone()
    with torch.no_grad():
        runner.models[1].head.bias.fill_(math.nan)  # fragment 1, worker 1
    train(runner, 6, 8, (0, 1))
    first, second = runner.engine.fragments
    assert not runner.engine.records[1].outer_step_applied
    assert torch.equal(
        runner.engine.outer.params.detach()[slice(*second.span)], theta[slice(*second.span)]
    )
    for model in runner.models:
        assert all(torch.isfinite(p).all() for p in model.parameters())
    train(runner, 8, STEPS, (0, 1))
    assert all(r.outer_step_applied for r in runner.engine.records[2:])


def test_every_fragment_sync_checks_agreement_before_its_payload():
    """Worker 1 claims another horizon: the first fragment's
    sync (step 2 of the first interval) stops the run."""
    from autoloco_hf.sync.control import WorkerDisagreement

    runner = runner_for(config(method="diloco"), SimulatedCommunicator(2))
    payload_sent = []
    average = SimulatedCommunicator.average

    def tampered(self, flats, scalars, segment_sizes, wire_dtype=None, check=None):
        scalars = [scalars[0], scalars[1].clone()]
        scalars[1][-3] += 2.0  # worker 1's h_step
        result = average(self, flats, scalars, segment_sizes, wire_dtype, check)
        payload_sent.append(True)
        return result

    theta_0 = runner.engine.outer.params.detach().clone()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SimulatedCommunicator, "average", tampered)
        labels = runner.engine.comm.worker_labels()
        with pytest.raises(
            WorkerDisagreement, match=re.escape(f"(h_step: {labels[0]}=4, {labels[1]}=6)")
        ):
            train(runner, 0, 4, (0, 1))
    assert (
        runner.step == 2 and not payload_sent and torch.equal(runner.engine.outer.params, theta_0)
    )


# ------------------------------------------------------------------
# worker groups: each rank syncs its shard
def _worker_groups(rank: int, world_size: int) -> dict:
    from test_hierarchical import R, _run

    from autoloco_hf.integrations.groups import build_topology

    topo = build_topology(R)
    # F = 4 on the toy model's 5 tensors: fragments (0, 512), (512, 784),
    # (784, 1296), (1296, 1328); shard 0 is (0, 664): it meets fragments 0 and
    # 1 only, shard 1 fragments 1 to 3 (fragment 0: control messages only)
    settings = {
        "blocking": dict(fragments=4),
        "delayed": dict(fragments=2, overlap="delayed", overlap_steps=1),
    }
    return {
        (name, hier): _run(topo, "fp32", hier, **kw)
        for name, kw in settings.items()
        for hier in (False, True)
    }


def test_worker_groups_sync_their_shard_of_each_fragment_as_the_unsharded_run():
    """2 workers x 2 ranks (hierarchical_sync): each rank syncs where each
    fragment meets its shard; FP32 parameters bit for bit those of the layout
    where every rank syncs the whole fragment, statistics to rounding."""
    runs = run_gloo(_worker_groups, 4, timeout=300)
    for rank, result in enumerate(runs):
        for name in ("blocking", "delayed"):
            flat, hier = result[name, False], result[name, True]
            assert len(flat["records"]) >= 8 and [r[:2] for r in hier["records"]] == [
                r[:2] for r in flat["records"]
            ]
            assert [r[4] for r in hier["records"]] == [r[4] for r in flat["records"]]
            for (_, _, d_flat, c_flat, _), (_, _, d_hier, c_hier, _) in zip(
                flat["records"], hier["records"]
            ):
                assert math.isclose(d_hier, d_flat, rel_tol=1e-12) and math.isclose(
                    c_hier, c_flat, abs_tol=1e-9
                )
            for p_flat, p_hier in zip(flat["params"], hier["params"]):
                assert torch.equal(p_hier, p_flat), (rank, name)
            assert (
                hier["outer_numel"] == flat["model_numel"] // 2
                and hier["wire_bytes"] * 2 == flat["wire_bytes"]
            )
            partner = runs[rank ^ 1][name, True]["params"]  # the other rank of the same worker
            assert all(torch.equal(a, b) for a, b in zip(hier["params"], partner))


def test_fsdp2_ranks_cut_their_local_shards_at_the_worker_models_tensor_boundaries():
    """A rank's own shard sizes would put the cut elsewhere
    (after tensor 2, not 1): the worker's sizes decide."""
    # this rank holds no row of tensor 2
    worker_sizes, rank_sizes = [100, 100, 10, 90], [50, 50, 0, 90]
    assert [(f.first, f.last) for f in split_fragments(rank_sizes, 2)] == [(0, 2), (2, 4)]
    local = on_local_tensors(split_fragments(worker_sizes, 2), rank_sizes)
    assert [(f.first, f.last) for f in local] == [(0, 1), (1, 4)]
    assert [f.span for f in local] == [(0, 50), (50, 190)]

    # as if tensor 3 were mostly on the other ranks
    class ShardsOfLargerTensors(SimulatedCommunicator):
        def worker_tensor_sizes(self, local_sizes):
            return [512, 256, 16, 2000, 32]

    engine = runner_for(config(), ShardsOfLargerTensors(2)).engine
    # by its own sizes (0, 2), (2, 5)
    assert [(f.first, f.last) for f in engine.fragments] == [(0, 3), (3, 5)]
    assert [f.span for f in engine.fragments] == [(0, 784), (784, 1328)]
