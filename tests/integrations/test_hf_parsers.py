"""AutoLoCoConfig through Hugging Face's parsers: beside TrainingArguments / SFTConfig, with help, choices, YAML."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import HfArgumentParser, TrainingArguments

from autoloco_hf.config import AutoLoCoConfig, ConfigError, Method, WireDtype
from autoloco_hf.integrations.arguments import PREFIX, AutoLoCoArguments


def test_every_config_field_has_a_prefixed_argument_with_help():
    config_fields = [f.name for f in dataclasses.fields(AutoLoCoConfig)]
    arguments = {f.name: f for f in dataclasses.fields(AutoLoCoArguments)}
    assert list(arguments) == [PREFIX + name for name in config_fields]
    for name, field in arguments.items():
        assert len(field.metadata["help"]) > len(
            f" (AutoLoCoConfig.{name}; not given: the recipe's value, else None)"
        ), name
    assert "Nesterov momentum" in arguments["autoloco_outer_momentum"].metadata["help"]
    assert "Clip range" in arguments["autoloco_mu_max"].metadata["help"]  # a shared docstring entry


def test_composes_with_training_arguments(tmp_path, capsys):
    parser = HfArgumentParser((TrainingArguments, AutoLoCoArguments))
    training, autoloco = parser.parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--warmup_steps",
            "5",
            "--report_to",
            "none",
            "--optim",
            "adamw_torch",
            "--autoloco_method",
            "diloco",
            "--autoloco_h_base",
            "100",
            "--autoloco_warmup_steps",
            "7",
            "--autoloco_wire_dtype",
            "bf16",
            "--autoloco_error_feedback",
            "true",
        ]
    )
    assert training.warmup_steps == 5
    config = autoloco.to_config()
    assert (config.method, config.h_base, config.warmup_steps, config.wire_dtype) == (
        Method.DILOCO,
        100,
        7,
        WireDtype.BF16,
    )
    assert config.error_feedback is True and config.outer_lr == 0.7  # the rest keeps the config's defaults
    assert autoloco.to_config(h_base=500, q_h=50, h_max=750).h_base == 100  # given fields win over a preset
    with pytest.raises(SystemExit) as exc:
        parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--autoloco_method", "dilco"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--autoloco_method" in err and "invalid choice: 'dilco'" in err and "'diloco'" in err


def test_yaml_numbers_that_arrive_as_strings_are_converted(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "output_dir: out\nautoloco_outer_lr: 7e-1\nautoloco_h_base: 1e2\nautoloco_adjust_momentum: 'false'\n"
    )
    _, autoloco = HfArgumentParser((TrainingArguments, AutoLoCoArguments)).parse_yaml_file(str(path))
    config = autoloco.to_config()
    assert (config.outer_lr, config.h_base, config.adjust_momentum) == (0.7, 100, False)
    with pytest.raises(ConfigError, match=r"--autoloco_h_base='1.5' is not a valid int"):
        AutoLoCoArguments(autoloco_h_base="1.5")


def test_trl_parser_with_a_yaml_config(tmp_path):
    trl = pytest.importorskip("trl")
    path = tmp_path / "sft.yaml"
    path.write_text(
        "output_dir: out\nuse_cpu: true\nbf16: false\nsave_total_limit: 3\n"
        "autoloco_outer_lr: 7e-1\nautoloco_method: diloco\n"
    )
    sft, autoloco = trl.TrlParser((trl.SFTConfig, AutoLoCoArguments)).parse_args_and_config(
        ["--config", str(path), "--autoloco_h_base", "100"]
    )
    assert sft.save_total_limit == 3
    config = autoloco.to_config()
    assert (config.method, config.outer_lr, config.h_base) == (Method.DILOCO, 0.7, 100)
