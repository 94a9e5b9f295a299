"""``preview_run`` and the ``autoloco plan`` command (docs/algorithm.md#paper-trajectory, 6)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import statistics

import pytest

from autoloco_hf import AutoLoCoConfig
from autoloco_hf.algorithm.preview import preview_run, run_length
from autoloco_hf.algorithm.schedule import warmup_cosine, warmup_linear
from autoloco_hf.cli import main
from autoloco_hf.wire.accounting import payload_bytes

C4_TRAJECTORY = "500x7, 550x5, 600x5, 650x5, 700x5, 750x45, 250x1"
SFT_TRAJECTORY = "100x6, 110x5, 120x5, 130x5, 140x5, 150x22, 90x1"


@functools.cache
def _cli(argv: tuple) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", *argv]) == 0
    return out.getvalue()


def cli(capsys, *argv: str) -> str:
    """Output of ``autoloco plan ARGV`` (cached: each C4 plan takes a few tenths of a second)."""
    return _cli(tuple(argv))


def cli_json(capsys, *argv: str) -> dict:
    return json.loads(cli(capsys, *argv, "--json"))


# ----------------------------------------------------------------- preview_run
def test_run_length() -> None:
    assert run_length([500, 500, 550]) == "500x2, 550x1"
    assert run_length([1, 2, 1]) == "1x1, 2x1, 1x1"
    assert run_length([]) == ""


@pytest.mark.parametrize("make", [warmup_cosine, warmup_linear])
def test_c4_trajectory(make) -> None:
    """docs/algorithm.md#paper-trajectory: always-supporting stream
    on the C4 recipe -> the paper's 73-interval trajectory."""
    p = preview_run(AutoLoCoConfig.for_recipe("c4"), make(3e-4, 1000, 50_000), warmup_steps=1000)
    assert run_length(p.intervals) == C4_TRAJECTORY
    assert p.syncs == 73 and p.steps == 50_000


@pytest.mark.parametrize("make", [warmup_cosine, warmup_linear])
@pytest.mark.parametrize("warmup", [0, 10, 65, 100, 195])
def test_sft_gives_49_syncs(make, warmup: int) -> None:
    """docs/algorithm.md#paper-trajectory: 6,490 steps, H_base
    100, any short warm-up, cosine or linear decay -> 49 syncs."""
    p = preview_run(AutoLoCoConfig.for_recipe("sft"), make(2e-5, warmup, 6490), warmup_steps=warmup)
    assert p.syncs == 49 and p.steps == 6490


def test_diloco_ddp_plans() -> None:
    sched = warmup_cosine(3e-4, 1000, 50_000)
    assert (
        preview_run(AutoLoCoConfig.for_recipe("c4", method="diloco"), sched, 1000).intervals
        == [500] * 100
    )
    sft = preview_run(
        AutoLoCoConfig.for_recipe("sft", method="diloco"), warmup_cosine(1.0, 65, 6490), 65
    )
    # DiLoCo's 65 SFT syncs (docs/algorithm.md#paper-trajectory)
    assert sft.syncs == 65 and sft.intervals[-1] == 90
    ddp = preview_run(AutoLoCoConfig(method="ddp"), warmup_cosine(1.0, 0, 300), 0)
    assert ddp.syncs == 300 and ddp.steps == 300


def test_payload_bytes() -> None:
    assert payload_bytes(10, 1000, "fp32") == 40_000
    assert payload_bytes(10, 1000, "bf16") == 20_000
    # INT8 plus an FP32 scale per block
    assert payload_bytes(10, 8192, "int8") == 10 * (8192 + 4 * 2)
    assert payload_bytes(1, 4097, "int8") == 4097 + 8


# --------------------------------------------------------------------- CLI
def test_cli_c4_text(capsys) -> None:
    out = cli(capsys, "--recipe", "c4").splitlines()
    assert out[0] == f"autoloco: {C4_TRAJECTORY}"
    assert out[1].startswith("syncs: 73 (diloco: 100, -27.0%)")


def test_cli_default_recipe_is_c4(capsys) -> None:
    assert cli_json(capsys) == cli_json(capsys, "--recipe", "c4")


def test_cli_json(capsys) -> None:
    data = cli_json(capsys, "--recipe", "c4")
    assert isinstance(data["intervals"], list)
    assert run_length(data["intervals"]) == C4_TRAJECTORY
    assert data["syncs"] == 73 == len(data["intervals"])
    assert data["diloco_syncs"] == 100
    assert data["sync_reduction"] == pytest.approx(0.27)
    assert (data["h_base"], data["q_h"], data["h_max"], data["steps"], data["warmup_steps"]) == (
        500,
        50,
        750,
        50_000,
        1000,
    )


def test_cli_sft(capsys) -> None:
    data = cli_json(capsys, "--recipe", "sft")
    assert data["syncs"] == 49 and data["diloco_syncs"] == 65
    assert data["run_length"] == SFT_TRAJECTORY
    assert 1 - 49 / 65 == pytest.approx(data["sync_reduction"])  # the paper's 24.6%
    assert round(100 * data["sync_reduction"], 1) == 24.6
    assert cli_json(capsys, "--recipe", "sft", "--schedule", "linear")["syncs"] == 49


def test_cli_qsr(capsys) -> None:
    """docs/algorithm.md#baselines: QSR on the C4 schedule: 41 intervals, median 603."""
    data = cli_json(capsys, "--recipe", "c4", "--method", "qsr")
    assert data["syncs"] == 41 and sum(data["intervals"]) == 50_000
    assert statistics.median(data["intervals"]) == 603


def test_cli_linear(capsys) -> None:
    """docs/algorithm.md#baselines: Linear Interval: 10, ..., 990 and the 500-step remainder."""
    data = cli_json(capsys, "--recipe", "c4", "--method", "linear")
    assert data["syncs"] == 100
    assert data["intervals"] == [10 * k for k in range(1, 100)] + [500]


def test_cli_diloco(capsys) -> None:
    data = cli_json(capsys, "--method", "diloco")
    assert data["intervals"] == [500] * 100 and data["sync_reduction"] == 0.0


@pytest.mark.parametrize(
    "argv, check",
    [
        (["--steps", "20000"], lambda d: d["steps"] == 20_000 and sum(d["intervals"]) == 20_000),
        (
            ["--warmup", "3000"],
            lambda d: d["intervals"][:9] == [500] * 9 and d["warmup_steps"] == 3000,
        ),
        (
            ["--h-base", "200"],
            lambda d: (
                (d["h_base"], d["q_h"], d["h_max"]) == (200, 20, 300) and d["intervals"][0] == 200
            ),
        ),
        (["--q-h", "25"], lambda d: d["q_h"] == 25 and d["intervals"][7] == 575),
        (["--h-max", "600"], lambda d: d["h_max"] == 600 and max(d["intervals"]) == 600),
        (["--h-max", "1000"], lambda d: max(d["intervals"]) > 750),
        (["--method", "diloco"], lambda d: d["syncs"] == 100),
        (
            [
                "--h-base",
                "250",
                "--q-h",
                "50",
                "--h-max",
                "500",
                "--steps",
                "10000",
                "--warmup",
                "100",
            ],
            lambda d: (
                (d["q_h"], d["h_max"], d["warmup_steps"]) == (50, 500, 100)
                and d["run_length"] == "250x36, 300x3, 100x1"
            ),
        ),
    ],
)
def test_cli_overrides_change_the_plan(capsys, argv: list, check) -> None:
    data = cli_json(capsys, *argv)
    assert check(data), data["run_length"]
    assert data["run_length"] != C4_TRAJECTORY
    assert sum(data["intervals"]) == data["steps"]


def test_cli_h_base_override_matches_preview_run(capsys) -> None:
    data = cli_json(capsys, "--h-base", "200", "--steps", "10000", "--warmup", "100")
    expected = preview_run(
        AutoLoCoConfig(h_base=200, controller="paper"), warmup_cosine(1.0, 100, 10_000), 100
    )
    assert data["intervals"] == expected.intervals


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--method", "sgd"], "method"),
        (["--h-base", "0"], "--h-base"),
        (["--q-h", "0"], "--q-h"),
        (["--q-h", "30"], "q_h"),  # H_base = 500 is not a multiple of 30
        (["--h-max", "400"], "h_max"),
        (["--steps", "0"], "--steps"),
        (["--warmup", "-1"], "--warmup"),
        (["--warmup", "60000"], "--warmup"),
    ],
)
def test_cli_bad_options_exit_with_message(capsys, argv: list, message: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", *argv])
    assert info.value.code == 2  # a usage error, like argparse's own
    err = capsys.readouterr().err
    assert err.startswith("autoloco plan: error:") and err.count("\n") == 1
    assert message in err


@pytest.mark.parametrize("params", ["0", "-1"])
def test_cli_non_positive_params_exits_with_message(capsys, params: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "--params", params, "--steps", "1000", "--warmup", "10"])
    assert info.value.code == 2 and "--params" in capsys.readouterr().err


def test_h_max_off_the_q_h_grid_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "--h-max", "740"])
    assert info.value.code == 2
    assert "--h-max 740 is not a multiple of q_H=50: use 700 or 750" in capsys.readouterr().err


def test_h_max_help_states_each_rules_own_default(capsys) -> None:
    """The help reads the factor from the rules: descent
    starts at 2 H_base since its default changed from 4."""
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "descent 2, paper 1.5" in help_text
    plan = cli_json(capsys, "--controller", "descent")
    assert plan["h_max"] == 2 * plan["h_base"]


def test_payload_uses_the_recipe_model_size(capsys) -> None:
    """The SFT recipe trains Llama-3.1-8B: its payload is
    8.03B parameters' worth, not the C4 model's 215M."""
    sft = cli_json(capsys, "--recipe", "sft")
    c4 = cli_json(capsys, "--recipe", "c4")
    assert sft["payload_bytes_per_worker"] == payload_bytes(sft["syncs"], 8_030_261_248, "bf16")
    assert c4["payload_bytes_per_worker"] == payload_bytes(c4["syncs"], 214_983_680, "bf16")
    assert "8.03B parameters" in cli(capsys, "--recipe", "sft")
    explicit = cli_json(capsys, "--recipe", "sft", "--params", "1e9")
    assert explicit["payload_bytes_per_worker"] == payload_bytes(sft["syncs"], 10**9, "bf16")


@pytest.mark.parametrize(
    "argv", [["--recipe", "wiki"], ["--steps", "many"], ["--schedule", "step"]]
)
def test_cli_argparse_errors(capsys, argv: list) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", *argv])
    assert info.value.code == 2
    assert "invalid" in capsys.readouterr().err


def test_plan_outer_state_per_rank_falls_with_ranks_per_worker(capsys) -> None:
    """FP32 theta_t + momentum = 8 bytes per parameter, split
    over the worker's FSDP2 ranks (issue 16)."""
    whole = cli_json(capsys, "--recipe", "sft", "--params", "8e9")
    sharded = cli_json(capsys, "--recipe", "sft", "--params", "8e9", "--ranks-per-worker", "8")
    assert whole["outer_state_bytes_per_rank"] == 8 * 8_000_000_000
    assert sharded["outer_state_bytes_per_rank"] == 8 * 1_000_000_000
    averaging = cli_json(
        capsys, "--recipe", "sft", "--params", "8e9", "--method", "qsr", "--ranks-per-worker", "8"
    )
    # model averaging keeps no momentum
    assert averaging["outer_state_bytes_per_rank"] == 4 * 1_000_000_000


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`autoloco plan --json | head`: the pipe closes before
    the plan is written; the command stops quietly."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    script = (
        "import sys; from autoloco_hf.cli import main; sys.exit(main(['plan', "
        "'--recipe', 'c4', '--json']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
    )
    os.close(write)
    assert done.returncode == 128 + 13 and done.stderr == "", done.stderr


def test_plan_previews_budget_pacing_at_given_speeds(capsys) -> None:
    """docs/algorithm.md#pacing: one worker at half speed of four
    takes half the others' steps; the run ~1.74x shorter."""
    pace = cli_json(capsys, "--recipe", "c4", "--method", "diloco", "--speeds", "1,1,1,0.5")[
        "pacing"
    ]
    # floor(500 * 4 * share): 2000 * 2/7 and 2000 * 1/7
    assert pace["worker_steps"] == [571, 571, 571, 285]
    assert pace["lockstep_time"] == 100 * 500 / 0.5
    # the first interval in lockstep, then the fast workers'
    assert pace["budget_time"] == 500 / 0.5 + 99 * 571
    text = cli(capsys, "--recipe", "c4", "--method", "diloco", "--speeds", "1,1,1,0.5")
    assert "inner steps per interval of 500 steps: 571, 571, 571, 285 (lockstep: 500 each)" in text
    assert "1.74x shorter" in text
    assert "pacing" not in cli_json(capsys, "--recipe", "c4", "--method", "diloco")


@pytest.mark.parametrize("speeds", ["1,0", "1,-2", "fast"])
def test_plan_refuses_bad_speeds_naming_the_flag(capsys, speeds: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", "--speeds", speeds])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(
        f"autoloco plan: error: --speeds={speeds!r} is invalid"
    )
