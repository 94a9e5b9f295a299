"""AutoLoCoConfig through Hugging Face's parsers: beside
TrainingArguments / SFTConfig, with help, choices, YAML."""

from __future__ import annotations

import dataclasses
import re

import pytest
from transformers import HfArgumentParser, TrainingArguments

from autoloco_hf.config import AutoLoCoConfig, ConfigError, Method, WireDtype
from autoloco_hf.integrations.trainer.arguments import PREFIX, SHORT_FORM, AutoLoCoArguments


def test_every_config_field_has_a_prefixed_argument_with_help():
    config_fields = [f.name for f in dataclasses.fields(AutoLoCoConfig)]
    arguments = {f.name: f for f in dataclasses.fields(AutoLoCoArguments)}
    assert list(arguments) == [PREFIX + name for name in config_fields] + [SHORT_FORM]
    for name in config_fields:
        assert (
            arguments[PREFIX + name]
            .metadata["help"]
            .startswith(AutoLoCoConfig.__dataclass_fields__[name].metadata["help"])
        )
    assert "Nesterov momentum" in arguments["autoloco_outer_momentum"].metadata["help"]
    assert (
        "(AutoLoCoConfig.h_base, >= 1; not given: the recipe's value, else 500)"
        in arguments["autoloco_h_base"].metadata["help"]
    )


def test_the_short_form_works_in_a_users_own_parser(tmp_path):
    """`--autoloco FIELD=VALUE` (repeatable) beside
    TrainingArguments, with no "ambiguous option" error."""
    parser = HfArgumentParser((TrainingArguments, AutoLoCoArguments))
    _, autoloco = parser.parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--autoloco",
            "h_base=10",
            "--autoloco",
            "method=diloco",
            "outer_lr=7e-1",
        ]
    )
    assert autoloco.overrides() == {"method": "diloco", "h_base": 10, "outer_lr": 0.7}
    assert autoloco.to_config().method == Method.DILOCO and autoloco.autoloco is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--autoloco", "hbase=10"],
            "--autoloco hbase=10: AutoLoCoConfig has no field 'hbase'; did you mean h_base?",
        ),
        (
            ["--autoloco", "h_base"],
            "--autoloco 'h_base': write FIELD=VALUE, e.g. --autoloco h_base=250",
        ),
        (
            ["--autoloco", "h_base=ten"],
            "--autoloco_h_base='ten' is not a valid int: write e.g. --autoloco_h_base 500",
        ),
        (
            ["--autoloco", "map_tokens=maybe"],
            "--autoloco_map_tokens='maybe' is not a valid bool: write e.g. "
            "--autoloco_map_tokens true",
        ),
        (
            ["--autoloco_h_base", "5", "--autoloco", "h_base=10"],
            "--autoloco h_base=10 repeats --autoloco_h_base: give the field once",
        ),
    ],
)
def test_a_bad_short_form_item_is_one_line(tmp_path, argv, message):
    parser = HfArgumentParser((TrainingArguments, AutoLoCoArguments))
    with pytest.raises(ConfigError) as err:
        parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), *argv])
    assert str(err.value) == message


def test_a_yaml_autoloco_mapping_is_the_short_form(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("output_dir: out\nautoloco:\n  h_base: 100\n  outer_lr: 7e-1\n")
    _, autoloco = HfArgumentParser((TrainingArguments, AutoLoCoArguments)).parse_yaml_file(
        str(path)
    )
    assert autoloco.overrides() == {"h_base": 100, "outer_lr": 0.7}


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
    # the rest keeps the config's defaults
    assert config.error_feedback is True and config.outer_lr == 0.7
    assert autoloco.to_config(h_base=500).h_base == 100  # given fields win over a preset
    with pytest.raises(SystemExit) as exc:
        parser.parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--autoloco_method", "dilco"]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--autoloco_method" in err and "invalid choice: 'dilco'" in err and "'diloco'" in err


def test_yaml_numbers_that_arrive_as_strings_are_converted(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "output_dir: out\n"
        "autoloco_outer_lr: 7e-1\n"
        "autoloco_h_base: '100'\n"
        "autoloco_adjust_momentum: 'false'\n"
    )
    _, autoloco = HfArgumentParser((TrainingArguments, AutoLoCoArguments)).parse_yaml_file(
        str(path)
    )
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


@pytest.mark.parametrize(
    "argv",
    [
        [
            "--autoloco_controller",
            "descent",
            "--autoloco_rule_options",
            "gain=0.9,start_probe=1.85",
        ],
        [
            "--autoloco",
            "controller=descent",
            "--autoloco",
            'rule_options={"gain": 0.9, "start_probe": 1.85}',
        ],
    ],
)
def test_rule_options_from_the_command_line(argv):
    """A rule's options arrive as NAME=VALUE,... text or JSON
    and become the rule's options dataclass."""
    (args,) = HfArgumentParser((AutoLoCoArguments,)).parse_args_into_dataclasses(argv)
    options = args.to_config().rule_options
    assert (type(options).__name__, options.gain, options.start_probe) == (
        "DescentOptions",
        0.9,
        1.85,
    )
    with pytest.raises(
        ConfigError, match=r"rule_options\['gian'\] is not an option of rule 'descent'"
    ):
        HfArgumentParser((AutoLoCoArguments,)).parse_args_into_dataclasses(
            ["--autoloco_controller", "descent", "--autoloco_rule_options", "gian=0.9"]
        )[0].to_config()


@pytest.mark.parametrize(
    "argv, named",
    [
        # the default
        (
            ["--autoloco_method", "diloco", "--autoloco_controller", "descent"],
            "controller='descent'",
        ),
        (["--autoloco", "method=qsr", "--autoloco", "outer_momentum=0.9"], "outer_momentum=0.9"),
    ],
)
def test_a_given_field_that_does_nothing_is_refused_at_its_default_too(argv, named):
    """What a user typed must act: a default value is refused
    when it was given (construction cannot tell)."""
    (args,) = HfArgumentParser((AutoLoCoArguments,)).parse_args_into_dataclasses(argv)
    with pytest.raises(
        ConfigError, match=f"{re.escape(named)} is invalid: it only applies with method="
    ):
        args.to_config()
    # not given: accepted
    assert AutoLoCoConfig(method="diloco", controller="descent").method == Method.DILOCO
