"""One process of a Trainer + AutoLoCoCallback run on live membership.

Spawned by ``live_trainer_testbed.py`` and by ``tests/integrations/trainer/test_live_trainer.py``.

It forms or joins a round on the driver's ``TCPStore``, builds its ``TrainingArguments`` and
``Trainer`` on that round's process group, and trains with ``train_live``. ``die_at``: the
process ends (a closed connection for the others) before that step; ``wait_for_joiner_at``:
before that step, wait until a process has taken a slot of the next round (so that a loaded
machine does not end the run before the joiner starts); ``pause_at``: before that step, wait for
``test/resume`` on the store; ``endpoints``: the rounds on that etcd cluster instead of the
``TCPStore``; ``batch_size``: another ``per_device_train_batch_size`` than the run's 4;
``settle_s``: the closers' wait for late slots (1 s). What it saw goes to ``<out>/<name>.json``.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time

import torch


def run(name: str, port: int, out: str, first_world: int, steps: int, h: int, **options) -> None:
    # accelerate: a distributed CPU process (one per worker)
    os.environ.setdefault("LOCAL_RANK", "0")
    torch.set_num_threads(1)
    import torch.distributed as dist
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from autoloco_hf import AutoLoCoCallback, AutoLoCoConfig
    from autoloco_hf.integrations.elastic.membership import JoinRefused, LiveMembership
    from autoloco_hf.integrations.trainer.live import train_live
    from autoloco_hf.toy.llama import tiny_llama
    from autoloco_hf.toy.padded import LLAMA, PaddedTokens

    timeout = datetime.timedelta(seconds=60)
    if options.get("endpoints"):  # the membership rounds on an etcd cluster
        from autoloco_hf.integrations.elastic.store import etcd_store

        store = etcd_store(options["endpoints"], f"run-{port}", timeout)
    else:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    config = AutoLoCoConfig(method="diloco", h_base=options.get("h_base", h), sync_timeout_s=5.0)
    seed = options.get("seed", 0)
    model = tiny_llama(**LLAMA, seed=seed)
    settle_s = options.get("settle_s", 1.0)
    live = LiveMembership(store, name, config, model, settle_s=settle_s, round_timeout_s=60.0)
    seen: dict = {"name": name, "pid": os.getpid(), "begins": [], "steps": [], "warnings": []}

    class Warnings(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                seen["warnings"].append(record.getMessage())

    logging.getLogger("autoloco_hf").addHandler(Warnings())

    def write() -> None:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(seen, f)

    try:
        agreement = live.start(first_world) if first_world else live.join()
    except JoinRefused as err:
        seen["refused"] = str(err)
        write()
        return

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            adam = optimizer.state_dict()["state"].get(0, {})
            seen["begins"].append({
                "round": live.agreement.round,
                "members": live.agreement.members,
                "world": dist.get_world_size(),
                "accelerate_world": trainer.accelerator.num_processes,
                "step": state.global_step,
                "adam_step": float(adam["step"]) if "step" in adam else 0.0,
                "lr": optimizer.param_groups[0]["lr"],
                "pid": os.getpid(),
                "at": time.time(),
            })  # fmt: skip

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == options.get("die_at"):
                store.set(f"test/{name}/fault_at", repr(time.time()))
                os._exit(1)
            # the driver kills an etcd member meanwhile
            if state.global_step == options.get("pause_at"):
                store.set(f"test/{name}/paused", str(state.global_step))
                until = time.monotonic() + 120
                while not store.check(["test/resume"]) and time.monotonic() < until:
                    time.sleep(0.05)
            if state.global_step in options.get("wait_for_joiner_at", ()):
                key = f"autoloco/round{live.round + 1}/count"
                until = time.monotonic() + 120
                while (
                    not (store.check([key]) and store.add(key, 0) > 0) and time.monotonic() < until
                ):
                    time.sleep(0.05)
            seen["steps"].append(state.global_step + 1)  # the step this process trains now
            seen["begins"][-1].setdefault("first_step_at", time.time())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                seen.setdefault("logged", []).append(state.global_step)

        def on_save(self, args, state, control, **kwargs):
            seen.setdefault("saved", []).append(state.global_step)

    args = TrainingArguments(
        output_dir=os.path.join(out, name),
        use_cpu=True,
        max_steps=steps,
        per_device_train_batch_size=options.get("batch_size", 4),
        learning_rate=3e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        # 3: the Trainer's own loss gather between boundaries
        logging_steps=options.get("logging_steps", 3),
        save_strategy="steps" if options.get("save_steps") else "no",
        save_steps=options.get("save_steps", 500),
        report_to=[],
        disable_tqdm=True,
        seed=seed,
    )
    autoloco = AutoLoCoCallback(config, membership=live)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=PaddedTokens(512, seed=1 + seed),
        callbacks=[autoloco, Probe()],
    )
    try:
        train_live(trainer, live, agreement)
    except JoinRefused as err:  # its TrainingArguments differ from the run's
        seen["refused"] = str(err)
        write()
        return
    engine = autoloco.engine
    seen["theta"] = engine.outer.params.detach().tolist()
    seen["params"] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    seen["global_step"] = trainer.state.global_step
    # no worker trains on it
    seen["held_out_loss"] = trainer.evaluate(PaddedTokens(64, seed=1000))["eval_loss"]
    write()
    dist.destroy_process_group()
