"""lm-eval loads this file by path; the IFBench glue lives in autoloco_evals.ifbench."""

from autoloco_evals.ifbench import agg_inst_level_acc, process_results  # noqa: F401
