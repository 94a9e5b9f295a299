"""One rank of a plain Accelerate loop wrapped by
AutoLoCoAccelerate (launched by torchrun from the tests).

Runs the loop twice in one launch: ``auto`` (a post-step hook counts optimizer
steps, gradient accumulation 2) and ``manual`` (``autoloco.step(loss=...)``).
"""

from __future__ import annotations

import os
import sys
import warnings

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from trainer_worker import (  # installs the counter
    COLLECTIVES,
    PHASE,
    exit_after_a_clean_run,
    fingerprint,
)
from transformers import get_linear_schedule_with_warmup  # noqa: E402

from autoloco_hf import AutoLoCoAccelerate, AutoLoCoConfig  # noqa: E402
from autoloco_hf.toy.llama import tiny_llama
from autoloco_hf.toy.padded import LLAMA, PaddedTokens


def run(
    accelerator, mode: str, steps: int, accum: int, out: str, config: AutoLoCoConfig | None = None
) -> dict:
    model = tiny_llama(**LLAMA, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, 1, steps * accelerator.num_processes)
    data = PaddedTokens(steps * accum * 2 * accelerator.num_processes, seed=3)
    loader = torch.utils.data.DataLoader(data, batch_size=2, shuffle=False)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    fingerprints, synced = [], []
    start = len(COLLECTIVES)
    PHASE["train"] = True
    with (
        warnings.catch_warnings(record=True) as caught,
        AutoLoCoAccelerate(
            accelerator,
            model,
            optimizer,
            scheduler,
            config or AutoLoCoConfig(method="diloco", h_base=3),
            total_steps=steps,
            output_dir=os.path.join(out, mode),
            auto_step=mode in ("auto", "budget"),
        ) as autoloco,
    ):
        warnings.simplefilter("always", RuntimeWarning)
        lrs = []
        for batch in autoloco.batches(loader) if mode == "budget" else loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                lrs.append(optimizer.param_groups[0]["lr"])
                scheduler.step()
                optimizer.zero_grad()
                if mode == "manual":
                    autoloco.step(loss=loss.detach())
            if accelerator.sync_gradients:
                syncs = autoloco.engine.totals.syncs
                synced.append(syncs != (sum(synced)))
                fingerprints.append(fingerprint(accelerator.unwrap_model(model)))
                PHASE["step"] = len(fingerprints)
        engine = autoloco.engine
    PHASE["train"] = False
    return {
        "fingerprints": fingerprints,
        "lrs": lrs,
        # the engine's check that the LRs it was told match the schedule preview
        # (docs/algorithm.md#interval-statistics)
        "lr_mass_warnings": [
            str(w.message) for w in caught if "schedule preview" in str(w.message)
        ],
        "finished_at": engine.step,
        "synced": synced,
        "collectives": COLLECTIVES[start:],
        "records": [r.__dict__.copy() for r in engine.records],
        "totals": engine.totals.as_dict(),
        "hook": vars(autoloco.runtime.gradient_traffic) | {"group": None},
        "model_bytes": sum(p.numel() * 4 for p in model.parameters()),
        "params": [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()],
    }


def main(spec_path: str) -> None:
    import json

    spec = json.load(open(spec_path))
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    result = {"auto": run(accelerator, "auto", 9, 2, spec["output_dir"])}
    accelerator.gradient_accumulation_steps = 1
    result["manual"] = run(accelerator, "manual", 6, 1, spec["output_dir"])
    # unequal speeds on the virtual clock (rank 1 at half
    # speed): each rank loops until the run's budget is done
    budget = AutoLoCoConfig(method="diloco", h_base=3, pacing="budget", worker_speeds=[1.0, 0.5])
    result["budget"] = run(accelerator, "budget", 9, 1, spec["output_dir"], budget)
    result["rank"] = accelerator.process_index
    torch.save(
        result, os.path.join(spec["output_dir"], f"result_rank{accelerator.process_index}.pt")
    )


if __name__ == "__main__":
    main(sys.argv[1])
    exit_after_a_clean_run()
