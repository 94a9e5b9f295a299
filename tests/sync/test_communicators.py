"""Real gloo process groups against the one-process simulation
(docs/algorithm.md#interval-statistics, 7, 8.1, 8.4).

Two and three ``torch.distributed`` gloo processes run
:class:`ProcessGroupCommunicator`; the same contributions go through
:class:`SimulatedCommunicator` in the test process. Checked:

* the decoded mean is bit-identical (compared as int32 bit patterns, so -0.0 vs 0.0
  or a different NaN would count) for fp32 with N = 2 (one addition order) and for
  every lossy wire (bf16, int8, int4, fp4, int2, int2 + top-k) with N = 2 and 3 (owner-reduce adds
  in worker order 0..N-1 on both paths);
  fp32 with N = 3 is only close: gloo's all-reduce picks its own addition order;
* every rank holds the same mean, and the input buffer is left unchanged;
* the mean is within the codec's error bound of the exact mean;
* the float64 scalar sums equal the simulated sums;
* wire bytes equal a hand-computed count for a concrete layout, and equal what the
  communicator actually hands to the collectives (counted by wrapping ``dist``).

The gloo processes run once per world size (module-scoped fixture, ~5 s each).
"""

from __future__ import annotations

import pytest
import torch
from _dist import run_gloo

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.sync.communicators import (
    ProcessGroupCommunicator,
    SimulatedCommunicator,
    collective_device,
    make_communicator,
)
from autoloco_hf.wire.codec import WireCodec, num_int8_blocks
from autoloco_hf.wire.formats.base import true_divide

BS = 4096  # the default INT8 block size, used by both communicators below

# A hand-checkable layout: a segment longer than one block, a short one, one exactly a
# block, a tiny one (9,406 elements; owner parts cut through segments 0 and 2).
HAND = [5000, 300, 4096, 10]


def _model_layout() -> list[int]:
    """Segment sizes shaped like a small transformer (59 tensors, 325,056 elements)."""
    hidden, ffn, vocab, layers = 64, 256, 1000, 6
    sizes = [vocab * hidden]
    for _ in range(layers):
        # norm, q, k, v, o
        sizes += [hidden, hidden * hidden, hidden * hidden, hidden * hidden, hidden * hidden]
        sizes += [hidden, ffn * hidden, ffn * hidden, hidden * ffn]  # norm, gate, up, down
    sizes += [hidden, vocab * hidden]  # final norm, head
    return sizes


# tiny: N = 3 leaves an owner part empty
LAYOUTS = {"hand": HAND, "model": _model_layout(), "tiny": [1, 1]}
WIRES = ("fp32", "bf16", "int8", "int4", "fp4", "int2", "int2+topk")
LOSSY = WIRES[1:]


def _kw(wire: str) -> dict:
    """Communicator arguments of a wire name; ``+topk``: 2 % of every block
    (docs/algorithm.md#low-bit-wires)."""
    name, _, topk = wire.partition("+")
    return {"wire_dtype": name, "topk_fraction": 0.02 if topk else None}


def _contributions(segments: list[int], n: int, seed: int) -> list[torch.Tensor]:
    """Pseudo-gradient-like buffers: a shared and a private
    part, per-segment magnitudes 1e-6..1, one zero segment."""
    g = torch.Generator().manual_seed(seed)
    magnitudes = [10.0 ** -int(torch.randint(0, 7, (1,), generator=g)) for _ in segments]
    if len(segments) > 2:
        magnitudes[1] = 0.0  # e.g. a frozen tensor: all-zero INT8 blocks (scale 1)
    scale = torch.cat([torch.full((s,), m) for s, m in zip(segments, magnitudes)])
    shared = torch.randn(sum(segments), generator=g)
    return [
        ((0.5 * shared + torch.randn(sum(segments), generator=g)) * scale).contiguous()
        for _ in range(n)
    ]


def _scalars(n: int, seed: int) -> list[torch.Tensor]:
    """Per-worker float64 summaries with fractional parts
    (squared norms, losses) and integers (tokens, h)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        frac = torch.rand(4, dtype=torch.float64, generator=g) * torch.tensor(
            [1e3, 1e-3, 7.0, 1e9], dtype=torch.float64
        )
        ints = torch.randint(0, 10**6, (5,), generator=g).to(torch.float64)
        out.append(torch.cat([frac, ints]))
    return out


def _cases(n: int) -> dict[str, tuple[list[int], list[torch.Tensor], list[torch.Tensor]]]:
    return {
        name: (segments, _contributions(segments, n, seed=10 * n + i), _scalars(n, seed=10 * n + i))
        for i, (name, segments) in enumerate(LAYOUTS.items())
    }


class _CountingDist:
    """``torch.distributed`` as the communicator sees it, counting what leaves this rank."""

    def __init__(self, dist) -> None:
        self._dist = dist
        self.sent_bytes = 0  # all_to_all_single payload addressed to other ranks
        self.fp32_all_reduce_elements = 0

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def all_to_all_single(
        self,
        output,
        input,
        output_split_sizes=None,
        input_split_sizes=None,
        group=None,
        async_op=False,
    ):
        me = self._dist.get_rank(group)
        self.sent_bytes += (sum(input_split_sizes) - input_split_sizes[me]) * input.element_size()
        return self._dist.all_to_all_single(
            output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
        )

    def all_reduce(self, tensor, *args, **kwargs):
        if tensor.dtype == torch.float32:
            self.fp32_all_reduce_elements += tensor.numel()
        return self._dist.all_reduce(tensor, *args, **kwargs)


def _average_on_ranks(rank: int, world_size: int, cases: dict) -> dict:
    """Runs in every gloo process: one communicator per wire,
    reused across layouts (the codec is rebuilt)."""
    out = {}
    for wire in WIRES:
        comm = ProcessGroupCommunicator(**_kw(wire))
        real_dist = comm.dist
        for name, (segments, contributions, scalars) in cases.items():
            counter = comm.dist = _CountingDist(real_dist)
            flat = contributions[rank].clone()
            res = comm.average([flat], [scalars[rank].clone()], segments)
            out[name, wire] = {
                "mean": res.mean,
                "sums": res.scalar_sums,
                "rows": res.scalar_rows,
                "wire_bytes": res.traffic.wire_bytes,
                "sent_bytes": counter.sent_bytes,
                "fp32_all_reduce_elements": counter.fp32_all_reduce_elements,
                "input_unchanged": torch.equal(flat, contributions[rank]),
                "timings_non_negative": min(
                    res.traffic.encode_seconds,
                    res.traffic.collective_seconds,
                    res.traffic.decode_seconds,
                )
                >= 0,
            }
    # a per-call wire override must use the codec of the requested wire, not the communicator's
    segments, contributions, scalars = cases["hand"]
    comm = ProcessGroupCommunicator(wire_dtype="fp32")
    res = comm.average(
        [contributions[rank].clone()], [scalars[rank].clone()], segments, wire_dtype="int8"
    )
    out["hand", "fp32->int8"] = {"mean": res.mean, "wire_bytes": res.traffic.wire_bytes}
    # persistent owner-reduce buffers: a second sync of the
    # same layout must not see the first one's data
    for wire in ("bf16", "int8"):
        comm = ProcessGroupCommunicator(wire_dtype=wire)
        first = comm.average(
            [contributions[rank] * -3.0], [scalars[rank].clone()], segments
        ).mean.clone()
        second = comm.average([contributions[rank].clone()], [scalars[rank].clone()], segments).mean
        out["hand", wire + " reused"] = {
            "first": first,
            "mean": second.clone(),
            "same_buffer": second is next(iter(comm._owners.values())).mean,
        }
    made = make_communicator(
        AutoLoCoConfig(method="diloco", wire_dtype="int8", int8_block_size=64), distributed=True
    )
    out["made"] = (
        type(made).__name__,
        made.num_workers,
        made.rank,
        made.wire_dtype,
        made.block_size,
    )
    return out


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"N{n}")
def gloo(request):
    n = request.param
    cases = _cases(n)
    return n, cases, run_gloo(_average_on_ranks, n, cases, timeout=240)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def _bit_identical_wires(n: int) -> list[str]:
    return list(WIRES) if n == 2 else list(LOSSY)


def test_decoded_mean_bit_identical_to_simulation(gloo) -> None:
    n, cases, ranks = gloo
    for name, (segments, contributions, scalars) in cases.items():
        for wire in _bit_identical_wires(n):
            sim = SimulatedCommunicator(n, **_kw(wire)).average(contributions, scalars, segments)
            for r, res in enumerate(ranks):
                got = res[name, wire]["mean"]
                assert got.dtype == torch.float32 and got.shape == (sum(segments),)
                mismatch = int((_bits(got) != _bits(sim.mean)).sum())
                assert mismatch == 0, (
                    f"{name} {wire} N={n} rank {r}: {mismatch} elements differ from the simulation"
                )


def test_every_rank_gets_the_same_mean_and_keeps_its_input(gloo) -> None:
    n, cases, ranks = gloo
    for name in cases:
        for wire in WIRES:
            for r, res in enumerate(ranks):
                assert torch.equal(
                    _bits(res[name, wire]["mean"]), _bits(ranks[0][name, wire]["mean"])
                ), (name, wire, r)
                assert res[name, wire]["input_unchanged"], (name, wire, r)
                assert res[name, wire]["timings_non_negative"], (name, wire, r)


def test_fp32_beyond_two_ranks_equals_simulation_up_to_addition_order(gloo) -> None:
    """N = 2 is bit-identical (test above); from N = 3 on gloo chooses its own addition order."""
    n, cases, ranks = gloo
    for name, (segments, contributions, scalars) in cases.items():
        sim = (
            SimulatedCommunicator(n, wire_dtype="fp32")
            .average(contributions, scalars, segments)
            .mean
        )
        mean_abs = torch.stack(contributions).abs().mean(dim=0)
        # N - 1 FP32 additions in either order and one division: a few ulp of sum |c_i| / N
        assert ((ranks[0][name, "fp32"]["mean"] - sim).abs() <= 4 * 2.0**-24 * mean_abs).all(), name


def _element_scales(codec: WireCodec, flat: torch.Tensor, num_parts: int) -> torch.Tensor:
    """The INT8 block scale each element gets when ``flat``
    is sent as the owner parts of ``num_parts`` workers."""
    out = torch.empty(codec.numel, dtype=torch.float32)
    for s, e in codec.partition(num_parts):
        _, scales = codec.encode(flat[s:e].contiguous(), s)
        row = 0
        for off, k in codec.pieces(s, e - s):
            nb = num_int8_blocks(k, codec.block_size)
            sizes = torch.tensor(
                [min(codec.block_size, k - b * codec.block_size) for b in range(nb)]
            )
            out[s + off : s + off + k] = torch.repeat_interleave(scales[row : row + nb], sizes)
            row += nb
    return out


def test_mean_within_codec_bound_of_exact_mean(gloo) -> None:
    """INT8: each contribution and the mean lose at most scale * (1/2 + 2**-16) per element
    (codec.py); the mean's block scale is at most the mean of the contributions' scales of that
    block (same slice, same blocks). BF16: two roundings of at most 2**-8 relative each (unit
    roundoff of an 8-bit significand). Plus FP32 summation."""
    n, cases, ranks = gloo
    for name, (segments, contributions, _) in cases.items():
        exact = torch.stack(contributions).double().mean(dim=0)
        mean_abs = torch.stack(contributions).double().abs().mean(dim=0)
        int8_codec = WireCodec("int8", segments, BS)
        mean_scale = (
            torch.stack([_element_scales(int8_codec, c, n) for c in contributions])
            .double()
            .mean(dim=0)
        )
        int8_bound = 2 * (0.5 + 2.0**-16) * (1 + 2.0**-16) * mean_scale + 2.0**-21 * mean_abs
        bf16_bound = 2.0**-7 * (1 + 2.0**-8) * mean_abs + 2.0**-21 * mean_abs
        for wire, bound in (
            ("int8", int8_bound),
            ("bf16", bf16_bound),
            ("fp32", 2.0**-21 * mean_abs),
        ):
            err = (ranks[0][name, wire]["mean"].double() - exact).abs()
            worst = float((err / bound.clamp_min(1e-300)).max()) if err.numel() else 0.0
            print(f"N={n} {name:>5} {wire}: max error / bound = {worst:.3f}")
            assert (err <= bound).all(), (
                f"{name} {wire}: error {float(err.max()):.3e} beyond the bound ({worst:.2f}x)"
            )


def test_scalar_sums_equal_on_both_paths(gloo) -> None:
    n, cases, ranks = gloo
    for name, (segments, contributions, scalars) in cases.items():
        for wire in WIRES:
            simulated = SimulatedCommunicator(n, **_kw(wire)).average(
                contributions, scalars, segments
            )
            sim = simulated.scalar_sums
            assert sim.dtype == torch.float64
            # every worker's own values, in worker order
            rows = torch.stack(scalars).to(torch.float64)
            assert torch.equal(simulated.scalar_rows.view(torch.int64), rows.view(torch.int64))
            for r, res in enumerate(ranks):
                got = res[name, wire]["sums"]
                assert got.dtype == torch.float64 and got.shape == (9,)
                assert torch.equal(got.view(torch.int64), sim.view(torch.int64)), (
                    name,
                    wire,
                    r,
                    got - sim,
                )
                assert torch.equal(
                    res[name, wire]["rows"].view(torch.int64), rows.view(torch.int64)
                ), (name, wire, r)


def test_make_communicator_follows_the_config(gloo) -> None:
    n, _, ranks = gloo
    assert [res["made"] for res in ranks] == [
        ("ProcessGroupCommunicator", n, r, "int8", 64) for r in range(n)
    ]
    config = AutoLoCoConfig(
        method="diloco", wire_dtype="bf16", int8_block_size=32, bucket_size_mb=1.0
    )
    simulated = make_communicator(config, distributed=False, simulated_workers=n)
    assert isinstance(simulated, SimulatedCommunicator)
    assert (simulated.num_workers, simulated.local_workers) == (n, n)
    assert (simulated.wire_dtype, simulated.block_size) == ("bf16", 32)
    assert simulated.bucket_elements == 2**20 // 4


# Hand count for HAND = [5000, 300, 4096, 10] (9,406 elements), INT8 blocks of 4,096 per segment
# piece. N = 2: owner parts [0, 4703) and [4703, 9406).
#   part 0 = segment 0 [0, 4703): 4,703 codes, 2 blocks        -> 4,703 + 4*2 = 4,711 bytes
#   part 1 = 297 + 300 + 4,096 + 10 elements: 4 pieces, 4 blocks -> 4,703 + 4*4 = 4,719 bytes
#   worker 0 sends part 1 of its contribution to owner 1 and its mean part 0 to worker 1:
#   4,719 + 4,711 = 9,430; worker 1: 4,711 + 4,719 = 9,430.
#   BF16: 2 * 4,703 + 2 * 4,703 = 18,812.  FP32 ring: 2 (N-1)/N * 4 * 9,406 = 37,624.
# N = 3: parts [0, 3136), [3136, 6271), [6271, 9406).
#   part 0: segment 0 [0, 3136): 1 block                                   -> 3,136 + 4   = 3,140
#   part 1: seg 0 [3136, 5000) 1,864 + seg 1 300 + seg 2 [5300, 6271) 971: 3 blocks
#                                                                          -> 3,135 + 12 = 3,147
#   part 2: seg 2 [6271, 9396) 3,125 + seg 3 10: 2 blocks                  -> 3,135 + 8   = 3,143
#   worker j sends the two other parts of its contribution + 2 copies of its mean part j:
#   worker 0: 3,147 + 3,143 + 2 * 3,140 = 12,570; worker 1: 3,140 + 3,143 + 2 * 3,147 = 12,577;
#   worker 2: 3,140 + 3,147 + 2 * 3,143 = 12,573.
#   BF16: worker 0: 2 * (3,135 + 3,135) + 2 * 2 * 3,136 = 25,084;
#   workers 1, 2: 2 * (3,136 + 3,135) + 4 * 3,135 = 25,082.
#   FP32 ring: floor(2 * 2/3 * 4 * 9,406) = floor(50,165.3) = 50,165.
HAND_WIRE_BYTES = {
    2: {"fp32": [37624, 37624], "bf16": [18812, 18812], "int8": [9430, 9430]},
    3: {"fp32": [50165] * 3, "bf16": [25084, 25082, 25082], "int8": [12570, 12577, 12573]},
}


def test_wire_bytes_equal_hand_count(gloo) -> None:
    n, cases, ranks = gloo
    segments, contributions, scalars = cases["hand"]
    for wire, expected in HAND_WIRE_BYTES[n].items():
        assert [res["hand", wire]["wire_bytes"] for res in ranks] == expected, wire
        sim = SimulatedCommunicator(n, **_kw(wire)).average(contributions, scalars, segments)
        assert sim.traffic.wire_bytes == expected[0], wire  # the simulation reports worker 0


def test_wire_bytes_equal_what_the_collectives_carry(gloo) -> None:
    """Owner-reduce: exactly the all_to_all_single splits addressed to other ranks. FP32: one
    all-reduce of the whole buffer (in buckets), counted with the ring's 2 (N-1)/N factor."""
    n, cases, ranks = gloo
    for name, (segments, _, _) in cases.items():
        numel = sum(segments)
        for r, res in enumerate(ranks):
            assert res[name, "fp32"]["fp32_all_reduce_elements"] == numel, (name, r)
            assert res[name, "fp32"]["wire_bytes"] == 2 * (n - 1) * 4 * numel // n, (name, r)
            for wire in LOSSY:
                assert res[name, wire]["fp32_all_reduce_elements"] == 0, (name, wire, r)
                assert res[name, wire]["wire_bytes"] == res[name, wire]["sent_bytes"], (
                    name,
                    wire,
                    r,
                )


def test_reused_owner_reduce_buffers_give_each_sync_its_own_mean(gloo) -> None:
    n, cases, ranks = gloo
    segments, contributions, scalars = cases["hand"]
    for wire in ("bf16", "int8"):
        sim = SimulatedCommunicator(n, wire_dtype=wire)
        first = sim.average([c * -3.0 for c in contributions], scalars, segments).mean
        second = sim.average(contributions, scalars, segments).mean
        for res in ranks:
            got = res["hand", wire + " reused"]
            assert got["same_buffer"], wire
            assert torch.equal(_bits(got["first"]), _bits(first)), wire
            assert torch.equal(_bits(got["mean"]), _bits(second)), wire


def test_wire_override_uses_the_requested_codec(gloo) -> None:
    """``average(..., wire_dtype="int8")`` on an fp32 communicator equals an int8 communicator."""
    n, cases, ranks = gloo
    segments, contributions, scalars = cases["hand"]
    ref = SimulatedCommunicator(n, wire_dtype="int8").average(contributions, scalars, segments)
    sim = SimulatedCommunicator(n, wire_dtype="fp32").average(
        contributions, scalars, segments, wire_dtype="int8"
    )
    assert (
        torch.equal(_bits(sim.mean), _bits(ref.mean))
        and sim.traffic.wire_bytes == ref.traffic.wire_bytes
    )
    for res in ranks:
        assert torch.equal(_bits(res["hand", "fp32->int8"]["mean"]), _bits(ref.mean))
        assert res["hand", "fp32->int8"]["wire_bytes"] == res["hand", "int8"]["wire_bytes"]


@pytest.mark.parametrize(
    ("backend", "held", "carried"),
    [
        # NCCL alone: host tensors go through the current GPU (outer_on_cpu=True)
        ("nccl", "cpu", "cuda"),
        ("NCCL", "cpu", "cuda"),
        ("gloo", "cpu", "cpu"),
        # torch's default on a GPU machine: gloo carries host tensors
        ("cpu:gloo,cuda:nccl", "cpu", "cpu"),
        ("nccl", "cuda:1", "cuda:1"),  # already on a GPU: stays where it is
        ("cpu:gloo,cuda:nccl", "cuda:0", "cuda:0"),
    ],
)
def test_collective_device_stages_host_tensors_through_the_gpu_for_nccl(
    backend, held, carried
) -> None:
    assert collective_device(backend, torch.device(held)) == torch.device(carried)


def test_true_divide_is_the_cpu_division_not_a_reciprocal_product() -> None:
    """The mean's division: bit for bit ``x / n`` on the CPU,
    which ``x * (1 / n)`` is not (CUDA's scalar path)."""
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0))
    for n in (3, 7, 127):
        exact = true_divide(x, n)
        assert torch.equal(exact.view(torch.int32), (x / n).view(torch.int32))
        # the two roundings differ somewhere: the test can tell
        assert not torch.equal(exact, x * (1.0 / n))
        inplace = x.clone()
        assert true_divide(inplace, n, out=inplace) is inplace and torch.equal(inplace, exact)


def test_an_average_in_flight_is_stored_as_its_result_and_restored_completed() -> None:
    """A checkpoint cannot hold a collective: the average is
    waited for, stored, and restored already done."""
    from autoloco_hf.sync.communicators.base import AverageResult, PendingAverage, Traffic

    calls = []
    result = AverageResult(
        torch.arange(6.0),
        torch.tensor([1.0, 2.0], dtype=torch.float64),
        Traffic(wire_bytes=24, decode_seconds=0.5),
        torch.tensor([[0.5, 1.0], [0.5, 1.0]], dtype=torch.float64),
    )
    pending = PendingAverage(lambda: calls.append(1) or result)
    state = pending.state_dict()
    assert calls == [1]  # waited for once
    # a copy: the stored state does not alias the buffer the communicator reuses
    state["mean"].add_(1.0)
    assert torch.equal(result.mean, torch.arange(6.0))
    restored = PendingAverage.from_state(state, torch.device("cpu")).wait()
    assert torch.equal(restored.mean, torch.arange(6.0) + 1.0)
    assert torch.equal(restored.scalar_sums, result.scalar_sums)
    assert torch.equal(restored.scalar_rows, result.scalar_rows)
    assert restored.traffic == result.traffic
