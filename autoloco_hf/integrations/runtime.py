"""What the Trainer callback and the Accelerate wrapper share: one worker's engine, hooks and state.

:class:`WorkerRuntime` is built once per process, after the model is wrapped
(DDP or FSDP2) and the optimizer exists. It takes over DDP's per-step gradient
all-reduce (nothing, or an average inside the worker group, docs/algorithm.md
docs/algorithm.md#worker-groups), counts tokens and losses from the model's forward, and feeds the
engine of :func:`~autoloco_hf.sync.schedules.factory.make_engine` once per true optimizer step.
While a checkpoint is written the model holds ``theta_t``
(:meth:`WorkerRuntime.show_global_parameters`), so the framework's model file is the model every
worker agreed on; this rank's own replica goes into its state file
(:mod:`autoloco_hf.state.checkpoint`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from transformers.utils import logging as hf_logging

from autoloco_hf.algorithm.rules.decisions import Assessment
from autoloco_hf.config import AutoLoCoConfig, Pacing
from autoloco_hf.integrations.ddp_hooks import (
    BatchMeter,
    GradientTraffic,
    find_ddp,
    install_gradient_hook,
)
from autoloco_hf.integrations.groups import WorkerTopology, build_topology, fsdp2_mesh
from autoloco_hf.state.checkpoint import check_layout, read_state, write_state
from autoloco_hf.state.records import IntervalRecord
from autoloco_hf.sync.communicators import PeerLostError, make_communicator
from autoloco_hf.sync.pacing import VirtualClock
from autoloco_hf.sync.schedules.factory import Engine, make_engine
from autoloco_hf.sync.snapshot import BoundarySnapshot, Snapshot, check_snapshot_support

logger = hf_logging.get_logger(__name__)

RECORDS_FILENAME = "autoloco_intervals.jsonl"
STATE_DIRNAME = "autoloco"


def state_path(checkpoint_dir: str, rank: int) -> str:
    return os.path.join(checkpoint_dir, STATE_DIRNAME, f"rank{rank}.safetensors")


def record_metrics(
    record: IntervalRecord, engine: Engine, prefix: str = "autoloco/"
) -> dict[str, float]:
    """The ``autoloco/*`` scalars logged at a synchronization."""
    totals = engine.totals
    values = {
        "H_step": record.h_step,
        "H_tok": record.h_tok,
        "H_ref": record.h_ref,
        "next_H_step": record.next_h_step if record.next_h_step is not None else 0,
        "rho": record.rho,
        "mu_t": record.mu,
        "eta_t": record.eta,
        "D_t": record.drift_energy,
        "C_t": record.coherence,
        "d_t": record.normalized_drift,
        "lr_mass": record.lr_mass,
        "assessment": Assessment(record.assessment).code,
        "interval_loss": record.mean_loss,
        "interval_tokens": record.tokens,
        "syncs": totals.syncs,
        "payload_bytes": totals.payload_bytes,
        "wire_bytes": totals.wire_bytes,
        "sync_seconds": totals.sync_seconds,
        "outer_step_applied": float(record.outer_step_applied),
    }
    # each worker's part, unequal (lockstep: H steps each)
    if engine.config.pacing == Pacing.BUDGET:
        for worker, (steps, tokens) in enumerate(
            zip(record.worker_steps or (), record.worker_tokens or ())
        ):
            values[f"worker{worker}_steps"], values[f"worker{worker}_tokens"] = steps, tokens
    return {prefix + k: float(v) for k, v in values.items()}


def check_fsdp2_worker(mesh: Any, topology: WorkerTopology) -> None:
    """Refuse an FSDP2 mesh that is not exactly this rank's worker
    (docs/algorithm.md#worker-groups): HSDP, or a mesh across workers."""
    import torch.distributed as dist

    if mesh.ndim != 1:
        raise ValueError(
            f"the model is sharded over a {mesh.ndim}-D device mesh {mesh.mesh.tolist()} (HSDP "
            "replicates across workers every step): shard each worker over its own ranks only, "
            f"fully_shard(module, mesh=worker_mesh({topology.ranks_per_worker}, device_type))"
        )
    ranks = dist.get_process_group_ranks(mesh.get_group())
    if ranks != topology.inner_ranks():
        raise ValueError(
            f"the model is sharded over ranks {ranks} but "
            f"AutoLoCoConfig.ranks_per_worker={topology.ranks_per_worker} makes this rank's worker "
            f"the ranks {topology.inner_ranks()}: shard with fully_shard(module, "
            f"mesh=worker_mesh({topology.ranks_per_worker}, device_type)) or set "
            f"ranks_per_worker={len(ranks)}"
        )


class TrainableParameters:
    """What the engine sees of a model: its trainable parameters
    only (frozen ones, e.g. a LoRA base, never move).

    An FSDP2 model's parameters are DTensors: the engine gets their local
    shards (``to_local()``, views that the inner optimizer updates in place
    and the outer write-back overwrites), never the gathered tensors.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            self.params = [
                p.to_local() if isinstance(p, DTensor) else p
                for p in model.parameters()
                if p.requires_grad
            ]
        if not self.params:
            raise ValueError("the model has no trainable parameters")

    def parameters(self):
        return iter(self.params)


class WorkerRuntime:
    """One process's AutoLoCo worker (see the module docstring).

    Args:
        config: the run's configuration.
        model: the unwrapped model (its parameters are the worker's).
        wrapped_model: what the training loop calls (DDP in multi-process runs).
        optimizer: the inner optimizer (unwrapped ``torch.optim.Optimizer``).
        schedule: LR-mass preview of the inner schedule.
        total_steps: the budget in optimizer steps.
        warmup_steps: inner-LR warm-up steps.
        records_path: JSONL of per-interval records (written by the main process only).
        is_main_process: whether this process writes the JSONL.
        on_record: extra consumer of every record.
        snapshot_dir: write a :class:`~autoloco_hf.sync.snapshot.BoundarySnapshot` of the shared
            outer state there at every boundary, from the main process, and a second copy from the
            last rank (storage every node reads, docs/reliability.md).
        snapshot_state: more shared state for the snapshot, called at each boundary (the Trainer's).
        live: the process is on live membership (docs/reliability.md): a lost peer is recovered in
            process, and the errors say so instead of advising a restart.
    """

    def __init__(
        self,
        config: AutoLoCoConfig,
        model: torch.nn.Module,
        wrapped_model: Any,
        optimizer: torch.optim.Optimizer,
        schedule: Any,
        total_steps: int,
        warmup_steps: int,
        records_path: str | None = None,
        is_main_process: bool = True,
        on_record: Callable[[IntervalRecord], None] | None = None,
        topology: WorkerTopology | None = None,
        snapshot_dir: str | None = None,
        snapshot_state: Callable[[], dict[str, Any]] | None = None,
        live: bool = False,
    ) -> None:
        self.config = config
        self.live = live
        self.model = model
        self.optimizer = optimizer
        self.total_steps = total_steps
        self.topology = topology or build_topology(
            config.ranks_per_worker, timeout_s=config.sync_timeout_s
        )
        topo = self.topology
        self.gradient_traffic: GradientTraffic | None = None
        self.ddp = find_ddp(wrapped_model)
        self.fsdp_mesh = fsdp2_mesh(model)  # FSDP2 averages gradients inside the worker by itself
        if snapshot_dir is not None and self.fsdp_mesh is not None:
            raise ValueError(
                "boundary snapshots need the whole model on each rank, but it is sharded with "
                "FSDP2 fully_shard (each rank's outer state is its shard): unset snapshot_dir and "
                "resume from Trainer checkpoints"
            )
        if self.fsdp_mesh is not None and topo.world_size > 1:
            check_fsdp2_worker(self.fsdp_mesh, topo)
        elif topo.world_size > 1 and config.is_interval_method:
            if self.ddp is None:
                raise RuntimeError(
                    f"{topo.world_size} processes but the model is not wrapped in "
                    f"DistributedDataParallel ({type(wrapped_model).__name__}) nor sharded with "
                    "FSDP2 fully_shard: AutoLoCo supports DDP and FSDP2 multi-process training"
                )
            self.gradient_traffic = install_gradient_hook(
                self.ddp, topo.inner_group, topo.ranks_per_worker
            )
        # an FSDP2 worker's ranks hold different shards
        # already: rank r of every worker syncs shard r
        comm = make_communicator(
            config,
            distributed=topo.world_size > 1,
            group=topo.outer_group,
            inner_group=topo.inner_group,
            rank_in_worker=topo.rank_in_worker,
            fsdp_worker=self.fsdp_mesh is not None,
        )
        self.meter = BatchMeter(model)
        self.records_path = records_path if is_main_process else None
        self._extra_on_record = on_record
        self.pending: list[IntervalRecord] = []
        self.trainable = TrainableParameters(model)
        self._local_replica: list[torch.Tensor] | None = None  # set while the model shows theta_t
        try:
            self.engine = make_engine(
                config,
                [self.trainable],
                schedule,
                comm,
                total_steps,
                warmup_steps=warmup_steps,
                optimizers=[optimizer],
                # the engine rewrites it from the checkpoint on resume
                records_path=self.records_path,
                on_record=self._on_record,
            )
        except PeerLostError as err:
            raise err.at(
                "AutoLoCo could not start",
                "check that every rank is up and reachable (docs/reliability.md)",
            ) from None
        # worker_speeds: a virtual clock times the steps
        self.clock = VirtualClock.of(config, self.engine.comm)
        self.paced = config.pacing == Pacing.BUDGET
        # budget pacing: seconds of this rank's steps not yet in a step of the run
        self._unaccounted: list[float] = []
        self.snapshot: BoundarySnapshot | None = None
        if snapshot_dir is not None:
            check_snapshot_support(self.engine)  # on every rank, so that all refuse alike
            # the main process writes, and the last rank a second
            # copy (another node when a node is a worker):
            # a node lost during the write leaves the other copy of that boundary
            last = topo.world_size > 1 and topo.rank == topo.world_size - 1
            if is_main_process or last:
                copy = 0 if is_main_process else 1
                self.snapshot = BoundarySnapshot(
                    snapshot_dir, self.engine, extra_state=snapshot_state, copy=copy
                )
                self.engine.listeners.append(self.snapshot)

    # ------------------------------------------------------------- steps
    def _on_record(self, record: IntervalRecord) -> None:
        self.pending.append(record)
        if self._extra_on_record is not None:
            self._extra_on_record(record)

    @property
    def step(self) -> int:
        return self.engine.step

    def after_optimizer_step(
        self, lr: float | None, seconds: float | None = None
    ) -> IntervalRecord | None:
        """Account one true optimizer step of this rank
        (``seconds``: its time); synchronizes at a boundary.

        Lockstep: the step is one step of the run. Budget pacing
        (docs/algorithm.md#pacing-under-the-trainer): the steps of the run whose share of this
        rank's steps is now complete, up to and including a boundary; the ones after it that need
        none of its steps are accounted before its next step (:meth:`catch_up`), so every rank's
        step that ends at a boundary ends there.
        """
        self.meter.end_step()
        if not self.paced:
            return self._account(1, lr, seconds)
        self._unaccounted.append(seconds or 0.0)
        engine = self.engine
        while engine.step < self.total_steps:
            due = engine.steps_due()[0]
            if self._closes() and engine.counters.steps[0] == 0:
                # a share that rounded to no step: one step, at the interval's end
                due = max(due, 1)
            if due > len(self._unaccounted):
                return None
            spent, self._unaccounted = sum(self._unaccounted[:due]), self._unaccounted[due:]
            # a step of the run this rank takes no part in runs
            # at the schedule's learning rate, as in the engine
            record = self._account(due, lr if due else None, spent)
            if record is not None:
                return record
        return None

    def catch_up(self) -> None:
        """Budget pacing, before this rank's next step: account
        the steps of the run that need none of its steps.

        They never include a boundary: a rank whose share of an interval rounds to no step takes
        one, at its end (a Trainer step cannot be empty).
        """
        engine = self.engine
        while engine.step < self.total_steps and not self._closes() and engine.steps_due()[0] == 0:
            self._account(0, None, 0.0)

    def _closes(self) -> bool:
        """Whether the engine's next step of the run ends the
        interval (not one whose length waits for a merge)."""
        engine = self.engine
        interval = engine.current_interval
        if interval is None:
            return engine.in_flight is None
        return engine.step + 1 >= interval.start_step + interval.h_step

    def _account(
        self, steps: int, lr: float | None, seconds: float | None
    ) -> IntervalRecord | None:
        """One step of the run in which this rank took ``steps`` optimizer steps."""
        engine = self.engine
        interval = engine.current_interval
        tokens, loss = self.meter.flush() if self._closes() else (0, 0.0)
        if engine.averages_gradients and self.topology.world_size > 1:
            engine.account_gradient_sync()  # torch DDP all-reduced this step's gradients
        if self.clock is not None:
            seconds = self.clock.seconds(engine.step, [steps])[0]
        try:
            return engine.after_optimizer_step(
                tokens=[tokens],
                losses=[loss],
                lr=lr,
                steps=[steps] if self.paced else None,
                seconds=None if seconds is None else [seconds],
            )
        except PeerLostError as err:
            # nothing of this interval was applied or written: the outer state is
            # still the last synchronized one a delayed merge (or a fragment's)
            # may land while the next interval's length is still open
            steps_of = (
                f", steps {interval.start_step + 1}-{interval.start_step + interval.h_step}"
                if interval
                else ""
            )
            raise err.at(
                f"AutoLoCo synchronization at step {engine.step} (interval "
                f"{len(engine.records)}{steps_of}) failed",
                "nothing of this interval was applied or saved: "
                f"{self.recovery(interval)} (docs/reliability.md)",
            ) from None

    def recovery(self, interval: Any) -> str:
        """What goes on when a peer is lost inside
        ``interval`` (the engine's current one, or None)."""
        if self.live:
            start = f"step {interval.start_step}" if interval is not None else "the last boundary"
            return f"live membership goes on from {start} in process, without a restart"
        if self.config.snapshot_dir is None:
            return "restart from the last checkpoint"
        if interval is not None:
            return (
                "restart from the boundary snapshot of step "
                f"{interval.start_step} (any number of workers)"
            )
        return "restart from the last boundary snapshot (any number of workers)"

    def pop_metrics(self) -> dict[str, float]:
        """``autoloco/*`` scalars of the synchronizations since the last call (the latest wins)."""
        metrics: dict[str, float] = {}
        for record in self.pending:
            metrics.update(record_metrics(record, self.engine))
        self.pending = []
        return metrics

    # ------------------------------------------------------------- state
    @property
    def shows_global_parameters(self) -> bool:
        """Whether the model currently holds theta_t while this rank's replica is kept aside."""
        return self._local_replica is not None

    @torch.no_grad()
    def show_global_parameters(self) -> None:
        """Put the last synchronized parameters theta_t into
        the model before a checkpoint is written.

        Mid-interval every rank's model is its own local replica; a checkpoint's model file must be
        the model the workers agreed on. The replica moves to host memory until
        :meth:`restore_local_parameters`. Nothing to do after the last sync or right after a
        blocking whole-model one (the replica is theta_t), or for the DDP method (no outer state). A
        boundary whose average is still in flight (``delayed``, ``eager``) or that synchronized one
        fragment only (docs/algorithm.md#fragments) leaves the replica elsewhere.
        """
        engine = self.engine
        if self._local_replica is not None or not self.config.is_interval_method:
            return
        interval = engine.current_interval
        just_synced = (
            interval is not None and engine.step == interval.start_step and engine.in_flight is None
        )
        if engine.step >= engine.total_steps or (just_synced and self.config.fragments == 1):
            return
        params = self.trainable.params
        self._local_replica = [p.detach().to("cpu", copy=True) for p in params]
        # every rank of the worker: a sharded state gathers
        self.engine.outer.write_back(params, engine.theta())

    @torch.no_grad()
    def restore_local_parameters(self) -> None:
        """Undo :meth:`show_global_parameters`: this rank
        continues its interval from its own replica."""
        if self._local_replica is None:
            return
        for p, saved in zip(self.trainable.params, self._local_replica):
            p.copy_(saved.to(p.device, p.dtype))
        self._local_replica = None

    def global_parameters(self) -> list[torch.Tensor]:
        """theta_t, the last synchronized parameters, shaped
        and typed like the model's trainable parameters."""
        if self.engine.outer is None:  # DDP: every rank holds the averaged model at every step
            return [p.detach() for p in self.trainable.params]
        # collective when the outer state is sharded: call on every rank of the worker
        flat = self.engine.theta()
        chunks = torch.split(flat, [p.numel() for p in self.trainable.params])
        return [c.view_as(p).to(p.dtype) for c, p in zip(chunks, self.trainable.params)]

    def state_dict(self) -> dict[str, Any]:
        """Everything one rank needs to resume mid-interval
        (its local parameters differ from rank 0's)."""
        topo = self.topology
        local = self._local_replica or [p.detach().cpu().clone() for p in self.trainable.params]
        return {
            "world_size": topo.world_size,
            "rank": topo.rank,
            "ranks_per_worker": topo.ranks_per_worker,
            "engine": self.engine.state_dict(),
            "meter": self.meter.state_dict(),
            "params": local,
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        topo = self.topology
        check_layout(
            "the AutoLoCo state",
            state["world_size"],
            state["ranks_per_worker"],
            topo.world_size,
            topo.ranks_per_worker,
        )
        self.engine.load_state_dict(state["engine"])
        self.meter.load_state_dict(state["meter"])
        params = self.trainable.params
        if len(params) != len(state["params"]):
            raise ValueError(
                "the AutoLoCo checkpoint holds a different model (parameter count differs)"
            )
        self._local_replica = None
        with torch.no_grad():
            for p, saved in zip(params, state["params"]):
                p.copy_(saved.to(p.device, p.dtype))
        self.optimizer.load_state_dict(self._optimizer_state_like_params(state["optimizer"]))
        self.pending = []

    def _optimizer_state_like_params(self, saved: dict[str, Any]) -> dict[str, Any]:
        """The state file holds an FSDP2 parameter's optimizer
        state as its local shard: wrap it like the parameter."""
        from torch.distributed.tensor import DTensor

        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        by_id = dict(zip((i for group in saved["param_groups"] for i in group["params"]), params))
        for pid, entry in saved["state"].items():
            param = by_id.get(pid)
            if not isinstance(param, DTensor):
                continue
            local = param.to_local()
            for key, value in entry.items():
                if (
                    torch.is_tensor(value)
                    and not isinstance(value, DTensor)
                    and value.dim()
                    and value.shape == local.shape
                ):
                    entry[key] = DTensor.from_local(
                        value.to(local.device),
                        param.device_mesh,
                        param.placements,
                        run_check=False,
                        shape=param.shape,
                        stride=param.stride(),
                    )
        return saved

    def save(self, checkpoint_dir: str) -> str:
        """Write this rank's state to ``<checkpoint_dir>/autoloco/rank{r}.safetensors``
        (atomically, with its header)."""
        topo = self.topology
        path = state_path(checkpoint_dir, topo.rank)
        write_state(
            path,
            self.state_dict(),
            config=self.config,
            world_size=topo.world_size,
            ranks_per_worker=topo.ranks_per_worker,
            rank=topo.rank,
            step=self.step,
        )
        return path

    def load(self, checkpoint_dir: str) -> str:
        """Load this rank's state, refusing a corrupted file or
        another layout / config (see ``sync.checkpoint``)."""
        topo = self.topology
        path = state_path(checkpoint_dir, topo.rank)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"resuming from {checkpoint_dir} but it has no AutoLoCo state for rank {topo.rank} "
                f"({path}): was the checkpoint written by a run with AutoLoCo and the "
                "same number of processes?"
            )
        _, state = read_state(
            path,
            config=self.config,
            world_size=topo.world_size,
            ranks_per_worker=topo.ranks_per_worker,
            rank=topo.rank,
        )
        self.load_state_dict(state)
        return path

    def resume_from_snapshot(self, snapshot: Snapshot) -> None:
        """Go on from a boundary snapshot with this launch's number of workers
        (docs/algorithm.md#boundary-snapshots).

        The model gets ``theta_t``; the inner optimizer is the caller's, fresh
        (zero moments), and so is setting its LR schedule to ``snapshot.step``
        and the data position there.
        """
        self.resume_at_boundary(snapshot.engine_state)

    def resume_at_boundary(self, engine_state: dict[str, Any]) -> None:
        """Go on from an engine's ``boundary_state()`` (a
        snapshot's, or a live peer's) with this group's workers."""
        self.engine.resume_at_boundary(engine_state)
        self._local_replica = None
        self.pending = []

    def close(self) -> None:
        """Remove the hooks; wait for the last boundary
        snapshot (raising its write error, if any)."""
        self.meter.remove()
        if self.snapshot is not None:
            self.snapshot.close()
