"""Error feedback for every lossy wire in the engine (docs/algorithm.md#error-feedback):
checkpoints, fragments, overlap.

Simulated workers (toy model): a run cut anywhere (mid-interval, mid-collective,
between fragments) and resumed from its state continues bit for bit, residual
included; a state of another wire, block size or top-k fraction is refused; a
boundary snapshot resumed with another number of workers starts from zero
residuals; a non-finite pseudo-gradient leaves its worker's residual untouched.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from toy import TIMING_FIELDS

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.state.checkpoint import ConfigMismatchError
from autoloco_hf.sync.communicators import make_communicator
from autoloco_hf.sync.workers.local_workers import LocalWorkers
from autoloco_hf.toy.pattern import adamw, batch_for, cosine, make_model
from autoloco_hf.wire import formats

STEPS, WARMUP, WORKERS = 36, 4, (0, 1)
FORMATS = {"int4": {}, "fp4": {}, "int2": {}, "int2+topk": {"topk_fraction": 0.05}}
MODES = {
    "blocking": {},
    "delayed": {"overlap": "delayed", "overlap_steps": 2},
    "eager": {"overlap": "eager"},
    "fragments": {"fragments": 2},
    "fragments-delayed": {"fragments": 2, "overlap": "delayed", "overlap_steps": 1},
    # the adaptive horizon: each rule moves H within the run,
    # so a cut lands inside intervals of another length
    "paper-rule": {"method": "autoloco", "controller": "paper", "h_base": 4, "q_h": 2, "h_max": 8},
    "default-rule": {"method": "autoloco", "h_base": 4, "h_max": 16},
}


def config(wire: str, **overrides) -> AutoLoCoConfig:
    name = wire.partition("+")[0]
    fields = dict(
        method="diloco", h_base=6, wire_dtype=name, error_feedback=True, int8_block_size=64
    )
    return AutoLoCoConfig(**{**fields, **FORMATS[wire], **overrides})


def runner(cfg: AutoLoCoConfig, workers: int = 2, seed: int = 0) -> LocalWorkers:
    return LocalWorkers(
        cfg,
        make_model(seed=seed),
        make_communicator(cfg, distributed=False, simulated_workers=workers),
        adamw,
        scheduler_factory=cosine(STEPS, WARMUP),
        total_steps=STEPS,
        warmup_steps=WARMUP,
    )


def train(run: LocalWorkers, first: int, last: int, workers=WORKERS) -> None:
    for step in range(first, last):
        run.train_step([batch_for(w, step, padded=True) for w in workers])


def records_of(run: LocalWorkers) -> list[dict]:
    return [
        {k: v for k, v in r.__dict__.items() if k not in TIMING_FIELDS} for r in run.engine.records
    ]


def _reloaded(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


CASES = [(w, m) for w in FORMATS for m in MODES]


@pytest.mark.parametrize("wire,mode", CASES)
def test_resume_anywhere_continues_bit_for_bit_with_the_residual(wire, mode) -> None:
    cfg = config(wire, **MODES[mode])
    full = runner(cfg)
    train(full, 0, STEPS)
    residuals = [f.residual for f in full.engine.error_feedback]
    if cfg.method == "autoloco":
        assert len({r.h_step for r in full.engine.records}) > 1, (
            "the rule should move H in this run"
        )
    assert all(r.abs().max() > 0 for r in residuals), "error feedback should hold something"
    for cut in (9, 20):  # mid-interval (and, overlapped, mid-collective or between fragments)
        first = runner(cfg)
        train(first, 0, cut)
        resumed = runner(cfg, seed=1)
        resumed.load_state_dict(_reloaded(first.state_dict()))
        train(resumed, cut, STEPS)
        for w in WORKERS:
            for p, q in zip(full.models[w].parameters(), resumed.models[w].parameters()):
                assert torch.equal(p, q), (wire, mode, cut)
            assert torch.equal(
                full.engine.error_feedback[w].residual, resumed.engine.error_feedback[w].residual
            )
        assert records_of(full) == records_of(resumed)


def test_fragments_own_disjoint_parts_of_the_residual() -> None:
    """After fragment 0's sync only its part of each residual has moved (one residual per fragment,
    docs/algorithm.md#error-feedback)."""
    cfg = config("int2", fragments=2)
    run = runner(cfg)
    (lo0, hi0), (lo1, hi1) = run.engine.fragment_pieces
    for step in range(STEPS):
        train(run, step, step + 1)
        if run.engine.error_feedback[0].residual[lo0:hi0].abs().max() > 0:
            break
    residual = run.engine.error_feedback[0].residual
    assert residual[lo0:hi0].abs().max() > 0 and residual[lo1:hi1].abs().max() == 0


@pytest.mark.parametrize(
    "field,other",
    [
        ("wire_dtype", dict(wire="int4")),
        ("int8_block_size", dict(int8_block_size=32)),
        ("topk_fraction", {}),
    ],
)
def test_a_state_with_a_residual_of_another_format_is_refused(field, other) -> None:
    saved = runner(config("int2+topk"))
    train(saved, 0, 8)
    kwargs = {"int8_block_size": other.get("int8_block_size", 64)}
    wire = other.get("wire", "int2" if field != "topk_fraction" else "int2")
    extra = FORMATS["int2+topk"] if field != "topk_fraction" else {}
    cfg = AutoLoCoConfig(
        method="diloco", h_base=6, wire_dtype=wire, error_feedback=True, **kwargs, **extra
    )
    with pytest.raises(
        ConfigMismatchError, match=rf"config\.{field}=.* when the checkpoint was written"
    ):
        runner(cfg).load_state_dict(_reloaded(saved.state_dict()))


@pytest.mark.parametrize("wire", FORMATS)
@pytest.mark.parametrize("workers", [1, 3])
def test_resume_with_another_number_of_workers_starts_from_zero_residuals(wire, workers) -> None:
    cfg = config(wire)
    run = runner(cfg)
    boundary = {}
    run.engine.listeners.append(
        lambda record: boundary.setdefault("state", run.engine.boundary_state())
    )
    train(run, 0, 12)
    assert run.engine.error_feedback[0].residual.abs().max() > 0
    state = _reloaded(boundary["state"])
    other = runner(cfg, workers=workers, seed=1)
    other.engine.resume_at_boundary(state)
    assert all(f.residual.abs().max() == 0 for f in other.engine.error_feedback)
    assert len(other.engine.error_feedback) == workers
    train(other, state["step"], STEPS, tuple(range(workers)))
    assert all(math.isfinite(r.mean_loss) for r in other.engine.records)
    assert any(f.residual.abs().max() > 0 for f in other.engine.error_feedback)


def test_a_non_finite_pseudo_gradient_leaves_the_residual_untouched() -> None:
    run = runner(config("int2"))
    train(run, 0, 6)  # one interval: residuals hold something
    engine = run.engine
    before = [f.residual.clone() for f in engine.error_feedback]
    train(run, 6, 11)
    with torch.no_grad():
        # worker 1 diverges just before the boundary
        next(run.models[1].parameters())[0].fill_(math.nan)
    deltas, _ = engine.contributions(engine.current_interval)
    assert torch.equal(engine.error_feedback[1].residual, before[1])  # nothing absorbed
    # zeroed before encoding, as today
    assert torch.isfinite(deltas[1]).all() and deltas[1].eq(0).all()
    # the finite worker's moved
    assert not torch.equal(engine.error_feedback[0].residual, before[0])


@pytest.mark.parametrize("wire", ["int4", "fp4", "int2", "int2+topk"])
def test_the_compiled_kernel_trains_bit_for_bit_like_eager(wire, monkeypatch) -> None:
    """codec_kernel="compiled" changes how the codes are computed, not one bit of the run.

    Every call of what ``torch.compile`` returned is counted: a codec that kept to the eager path
    would train the same run, so the count is what shows the compiled kernel ran.
    """
    kernel_calls = []
    real_compile = torch.compile

    def counted_compile(fn, **kwargs):
        compiled_fn = real_compile(fn, **kwargs)

        def run(*args):
            kernel_calls.append(args[0].shape)  # the blocks of one group
            return compiled_fn(*args)

        return run

    monkeypatch.setattr(torch, "compile", counted_compile)
    monkeypatch.setattr(formats, "_COMPILED", {})  # built afresh here, through the counted compile
    runs = {kernel: runner(config(wire, codec_kernel=kernel)) for kernel in ("eager", "compiled")}
    train(runs["eager"], 0, STEPS)
    assert kernel_calls == []
    train(runs["compiled"], 0, STEPS)
    assert len(kernel_calls) >= STEPS // 6  # at least once a sync (h_base 6)
    eager, compiled = runs["eager"], runs["compiled"]
    used = compiled.engine.comm.codec(compiled.engine.segment_sizes).format
    assert getattr(used, "inner", used).compiled  # the config reached the codec
    for w in WORKERS:
        for p, q in zip(eager.models[w].parameters(), compiled.models[w].parameters()):
            assert torch.equal(p, q), wire
        assert torch.equal(
            eager.engine.error_feedback[w].residual, compiled.engine.error_feedback[w].residual
        )
    assert records_of(eager) == records_of(compiled)
