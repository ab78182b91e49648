"""The training loop shared by every recipe: optimisation, early stopping, resumable checkpoints.

A recipe supplies a :class:`Task` (model, batches, loss, evaluation); :class:`Trainer` does the
rest and writes the run directory::

    run_dir/config.yaml        resolved config
    run_dir/metrics.jsonl      one JSON record per epoch, then the test record
    run_dir/train.log          human-readable log
    run_dir/last/              resumable state (model, optimizer, RNG, loop position)
    run_dir/best/              best model by the dev metric + what is needed to load it
    run_dir/plots/*.png        loss and metric curves

Resuming (``Trainer.fit(resume=True)``) restarts from ``last/`` at the exact batch where it
was saved: batch order is a pure function of (seed, epoch) and all RNG states are restored,
so on CPU the resumed run reproduces the uninterrupted one's metrics exactly. A finished run
resumed under a config that lets it go on (a larger ``train.epochs``, a larger ``train.max_steps``
while epochs remain, a larger or no ``train.patience``) trains on from its next epoch
(:func:`stop_reason`); its old test record is dropped and the new best checkpoint is tested
again. An epoch that the step budget cut short counts as done: to train on after it, raise
``train.epochs`` too.

Data-parallel training (several processes started by torchrun, :mod:`seqzoo.training.distributed`):
the model is wrapped in DDP while it trains; each rank trains on its part of every batch (a task's
``shard_train(rank, world_size)``, where it has one, splits its training data itself), with its
loss weighted by its share of the all-reduced ``count``, so the averaged gradient is the global
batch's mean; rank 0 alone writes the run directory, and ``last/`` holds every rank's random
generators and task state, so a resume (on as many ranks) replays the uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor, nn
from tqdm import tqdm

from seqzoo.config import RunConfig, TrainConfig, config_to_dict
from seqzoo.data.batching import shard_batches
from seqzoo.data.errors import DataError
from seqzoo.data.io import atomic_write_text, read_json
from seqzoo.training import distributed
from seqzoo.training.checkpoint import (
    join_tensors,
    load_tensors,
    load_weights,
    resolve_checkpoint,
    save_checkpoint_dir,
    split_tensors,
)
from seqzoo.training.devices import check_precision, model_device
from seqzoo.training.optim import build_optimizer, scheduled_lr, update
from seqzoo.training.plots import plot_curves
from seqzoo.training.rundir import check_run_dir
from seqzoo.training.task import StepLoss, Task

__all__ = ["TIMING_KEYS", "Trainer", "TrainingError", "stop_reason", "total_steps"]

log = logging.getLogger("seqzoo")

#: Keys of metric records about timing (how long, how fast, and the step an interrupted epoch's
#: timing starts from); they differ between otherwise identical runs.
TIMING_KEYS = ("seconds", "tokens_per_s", "checkpoint_seconds", "resumed_at_step")


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. a non-finite loss); the last good checkpoint is kept."""


class Trainer:
    """Runs ``task`` under ``config`` and writes everything to ``run_dir``."""

    def __init__(self, config: RunConfig, task: Task, run_dir: str | Path) -> None:
        self.config, self.task, self.run_dir = config, task, Path(run_dir)
        self.model = task.model  # the model itself: task.model is its DDP replica while fit() trains
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.main = self.rank == 0  # the one process that writes the run directory
        check_run_dir(self.run_dir)  # before anything is written (see seqzoo.training.rundir)
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.world > 1:
            if hasattr(task, "shard_train"):  # a task that splits its own training data across ranks
                task.shard_train(self.rank, self.world)
            if self.rank > 0:  # dropout and zoneout: each rank draws its own masks
                torch.manual_seed(torch.initial_seed() + 1_000_003 * self.rank)
        self.optimizer = build_optimizer(list(task.model.parameters()), config.optim)
        self.device = model_device(task.model)
        self.autocast_dtype = check_precision(config.train.precision, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.autocast_dtype == torch.float16 else None
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.state: dict[str, Any] = {
            "epoch": 0,
            "step_in_epoch": 0,
            "global_step": 0,
            "loss_sum": 0.0,
            "aux_sum": 0.0,
            "loss_count": 0,
            "window_start": [0.0, 0.0, 0],  # loss_sum, aux_sum, loss_count at the last step record
            "best": None,
            "best_epoch": None,
            "bad_epochs": 0,
            "lr": config.optim.lr,
            "metrics_bytes": 0,
        }
        self._handler = self._attach_log() if self.main else None

    # ----------------------------------------------------------------- bookkeeping
    def _attach_log(self) -> logging.Handler:
        handler = logging.FileHandler(self.run_dir / "train.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        return handler

    def _record(self, record: dict[str, Any]) -> None:
        if not self.main:
            return
        check_run_dir(self.run_dir)
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
        self.state["metrics_bytes"] = self.metrics_path.stat().st_size

    def _save_last(self) -> None:
        check_run_dir(self.run_dir)
        extra = getattr(self.task, "extra_state", dict)()
        extra_skeleton, extra_tensors = split_tensors(extra)
        rng = {"torch": torch.get_rng_state()}
        device = self.device
        if device.type == "cuda":  # dropout and zoneout on the GPU draw from its own generator
            rng["cuda"] = torch.cuda.get_rng_state(device)
        if self.world > 1:  # every rank's generators and task state (e.g. its LM streams' carried state)
            ranks = distributed.gather((rng, split_tensors(extra, f"rank{self.rank}")))
            rng = {f"{key}.rank{r}": value for r, (own, _) in enumerate(ranks) for key, value in own.items()}
            extra_skeleton = {"ranks": [skeleton for _, (skeleton, _) in ranks]}
            extra_tensors = {key: value for _, (_, tensors) in ranks for key, value in tensors.items()}
        if not self.main:
            return
        if self.metrics_path.exists():  # the size the checkpoint records must be on disk before it
            with open(self.metrics_path, "rb") as handle:
                os.fsync(handle.fileno())
        optim_skeleton, optim_tensors = split_tensors(self.optimizer.state_dict())
        save_checkpoint_dir(
            self.run_dir / "last",
            {"model": _model_tensors(self.model), "optimizer": optim_tensors, "rng": rng, "extra": extra_tensors},
            {
                "train_state.json": {
                    "loop": self.state,
                    "optimizer": optim_skeleton,
                    "extra": extra_skeleton,
                    "python_rng": _jsonable(random.getstate()),
                    "grad_scaler": None if self.scaler is None else self.scaler.state_dict(),
                    "world_size": self.world,
                },
                "config.json": config_to_dict(self.config),
            },
        )

    def _load_last(self) -> bool:
        path = resolve_checkpoint(self.run_dir / "last")
        if path is None:
            return False
        doc = _read_train_state(path)
        doc["loop"].pop("done", None)  # a stop flag older runs stored; stopping now follows the config
        doc["loop"].setdefault("aux_sum", 0.0)  # older runs did not report the regulariser apart
        doc["loop"].setdefault("window_start", [0.0, 0.0, 0])  # nor record the loss every log_every steps
        if set(doc["loop"]) != set(self.state):
            missing, unknown = sorted(set(self.state) - set(doc["loop"])), sorted(set(doc["loop"]) - set(self.state))
            raise TrainingError(
                f"{path / 'train_state.json'}: loop state from another seqzoo version "
                f"(missing {missing}, unknown {unknown}); it cannot be resumed by this one"
            )
        saved_world = doc.get("world_size", 1)  # older runs trained on one process
        if saved_world != self.world:
            raise TrainingError(
                f"{path} was saved by a run on {saved_world} process(es), so its batches and random draws are those "
                f"of {saved_world}: resume it on as many (torchrun --nproc-per-node {saved_world}), not on {self.world}"
            )
        load_weights(self.model, path / "model.safetensors")
        self.optimizer.load_state_dict(_int_keys(_joined(doc["optimizer"], path / "optimizer.safetensors")))
        if hasattr(self.task, "load_extra_state"):
            extra = _joined(doc["extra"], path / "extra.safetensors")
            self.task.load_extra_state(extra["ranks"][self.rank] if self.world > 1 else extra)
        rng = load_tensors(path / "rng.safetensors")
        if self.world > 1:  # this rank's own generators
            suffix = f".rank{self.rank}"
            rng = {key.removesuffix(suffix): value for key, value in rng.items() if key.endswith(suffix)}
        if "torch" not in rng:
            raise DataError("no 'torch' generator state in it", path / "rng.safetensors")
        torch.set_rng_state(rng["torch"])
        device = self.device
        if device.type == "cuda" and "cuda" in rng:
            torch.cuda.set_rng_state(rng["cuda"], device)
        elif (device.type == "cuda") != ("cuda" in rng):
            log.warning(
                "resuming on %s a run saved on another kind of device: from here on its random draws "
                "(dropout, zoneout) differ from those of an uninterrupted run",
                device,
            )
        random.setstate(_tuples(doc["python_rng"]))
        if self.scaler is not None and doc.get("grad_scaler"):  # fp16: the loss scale it had reached
            self.scaler.load_state_dict(doc["grad_scaler"])
        self.state = doc["loop"]
        # Drop metric records written after this checkpoint (the run died before saving again).
        if self.main and self.metrics_path.exists():
            keep = self.state["metrics_bytes"]
            if self.metrics_path.stat().st_size < keep:  # truncate() would pad it with NUL bytes
                keep = self.metrics_path.read_bytes().rfind(b"\n") + 1  # up to its last whole record
                log.warning(
                    "%s is shorter than its checkpoint recorded (%d bytes): records were lost; kept the first %d bytes",
                    self.metrics_path,
                    self.state["metrics_bytes"],
                    keep,
                )
            with open(self.metrics_path, "r+b") as handle:
                handle.truncate(keep)
        return True

    def _save_best(self) -> None:
        if not self.main:
            return
        check_run_dir(self.run_dir)
        documents = {"config.json": config_to_dict(self.config), **self.task.documents()}
        save_checkpoint_dir(self.run_dir / "best", {"model": _model_tensors(self.model)}, documents)

    # ----------------------------------------------------------------- the loop
    def fit(self, resume: bool = False) -> dict[str, float]:
        """Train (or resume), keep the best dev checkpoint, evaluate it on test; return test metrics."""
        cfg = self.config
        if self.main:
            atomic_write_text(self.run_dir / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        device = self.device
        name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
        precision = "" if self.autocast_dtype is None else f", mixed precision {cfg.train.precision} (autocast)"
        ranks = f", {self.world} data-parallel processes" if self.world > 1 else ""
        log.info("training on %s%s%s%s", device, name, precision, ranks)
        if resume and self._load_last():
            state = self.state
            log.info("resumed %s at epoch %d, step %d", self.run_dir, state["epoch"] + 1, state["step_in_epoch"])
        elif self.main and self.metrics_path.exists():
            self.metrics_path.unlink()
        # Forward passes go through the DDP replica (which all-reduces the gradients), with the same weights.
        self.task.model = distributed.replicate(self.model, cfg.train.find_unused_parameters)
        try:
            # An epoch in progress (a checkpoint saved mid-epoch, even at the step that spent the
            # budget) is finished, with its dev evaluation, before the loop's condition is read.
            while self.state["step_in_epoch"] > 0 or _epochs_left(self.state, cfg):
                self._train_epoch()
            return self._finish()
        except BaseException as err:  # why a run stopped belongs in its log, not only on the console
            reason = "interrupted" if isinstance(err, KeyboardInterrupt) else f"{type(err).__name__}: {err}"
            if self._handler is not None:
                record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "stopped: %s", (reason,), None)
                self._handler.handle(record)
            raise
        finally:
            self.task.model = self.model
            if self._handler is not None:
                log.removeHandler(self._handler)
                self._handler.close()

    def _train_epoch(self) -> None:
        cfg, task, state = self.config, self.task, self.state
        epoch, resumed_at = state["epoch"], state["step_in_epoch"]
        batches = task.train_batches(epoch)
        if self.world > 1 and not hasattr(task, "shard_train"):  # this rank's part of each (global) batch
            batches = shard_batches(batches, self.rank, self.world)
        show = cfg.train.progress if cfg.train.progress is not None else sys.stderr.isatty()
        show = show and self.main
        bar = tqdm(
            total=len(batches),
            initial=state["step_in_epoch"],
            disable=not show,
            desc=f"epoch {epoch + 1}/{cfg.train.epochs}",
            unit="batch",
            dynamic_ncols=True,
        )
        task.model.train()
        start, tokens_seen, saving = time.perf_counter(), 0, 0.0  # saving: checkpoint writes, not training
        steps = total_steps(cfg.train, len(batches))
        for index in range(state["step_in_epoch"], len(batches)):
            if _budget_spent(state, cfg):
                break
            loss, tokens, count, auxiliary = self._step_loss(batches[index])
            # Sums over the ranks (this rank's own figures on one process): loss x count, regulariser x count,
            # count, tokens.
            totals = distributed.all_sum([loss.item() * count, auxiliary * count, float(count), float(tokens)])
            if self.world > 1:  # DDP averages the ranks' gradients: weighted so, they average to the global mean
                loss = loss * (count * self.world / totals[2])
            if not math.isfinite(totals[0]):
                bar.close()
                last, best = resolve_checkpoint(self.run_dir / "last"), resolve_checkpoint(self.run_dir / "best")
                if last is None:
                    kept = "No checkpoint was written before it"
                else:
                    kept = f"The last good checkpoint is kept in {last}" + (f" (best model in {best})" if best else "")
                raise TrainingError(
                    f"non-finite loss ({totals[0] / totals[2]}) at epoch {epoch + 1}, batch {index + 1}; stopping. "
                    f"{kept}. Try a lower learning rate or gradient clipping."
                )
            lr = scheduled_lr(cfg.optim, state["lr"], state["global_step"], steps)
            for group in self.optimizer.param_groups:  # the one place the optimiser's rate is set
                group["lr"] = lr
            update(task.model, self.optimizer, loss, cfg.optim.clip_norm, self.scaler)
            state["loss_sum"] += totals[0]
            state["aux_sum"] += totals[1]
            state["loss_count"] += int(totals[2])
            state["step_in_epoch"] = index + 1
            state["global_step"] += 1
            tokens_seen += int(totals[3])
            bar.update(1)
            if bar.n % 10 == 0 or index + 1 == len(batches):
                rate = tokens_seen / max(time.perf_counter() - start - saving, 1e-9)
                bar.set_postfix(loss=f"{self._epoch_loss():.4f}", tok_s=f"{rate:,.0f}")
            if cfg.train.log_every and (index + 1) % cfg.train.log_every == 0:
                self._record_step(epoch, lr)
                if not show:
                    self._log_progress(
                        epoch, index + 1, len(batches), time.perf_counter() - start - saving, tokens_seen
                    )
            if cfg.train.checkpoint_every and state["global_step"] % cfg.train.checkpoint_every == 0:
                began = time.perf_counter()
                self._save_last()
                saving += time.perf_counter() - began
        bar.close()
        seconds = time.perf_counter() - start - saving
        self._end_epoch(epoch, seconds, tokens_seen, resumed_at, saving)

    def _step_loss(self, batch: Any) -> StepLoss:
        """The task's loss on ``batch`` in the run's precision. DDP's complaint about parameters that got
        no gradient at the step before (found in this step's forward) names the key that allows them."""
        try:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                return StepLoss(*self.task.train_loss(batch))  # (a plain 3-tuple too)
        except RuntimeError as err:
            if "find_unused_parameters" not in str(err):
                raise
            raise TrainingError(
                "the model gave some parameters no gradient at the previous step, which data-parallel training "
                "must be told: set train.find_unused_parameters=true (docs/distributed.md)"
            ) from None

    def _epoch_loss(self) -> float:
        """The mean training loss of the epoch so far."""
        return self.state["loss_sum"] / max(self.state["loss_count"], 1)

    def _record_step(self, epoch: int, lr: float) -> None:
        """A ``step`` record: the mean training loss since the previous one (the curve in loss.png)."""
        state = self.state
        totals = [state["loss_sum"], state["aux_sum"], state["loss_count"]]
        loss, auxiliary, count = (total - start for total, start in zip(totals, state["window_start"], strict=True))
        state["window_start"] = totals
        record = {"event": "step", "epoch": epoch + 1, "step": state["global_step"], "lr": lr}
        record["train_loss"] = loss / max(count, 1)
        if auxiliary:
            record["train_auxiliary"] = auxiliary / max(count, 1)
        self._record(record)

    def _log_progress(self, epoch: int, step: int, steps: int, seconds: float, tokens: int) -> None:
        """One line per ``train.log_every`` steps where no progress bar is shown (logs, batch jobs)."""
        log.info(
            "epoch %d, step %d/%d: train loss %.4f, %.0f tokens/s, %.1f min",
            epoch + 1,
            step,
            steps,
            self._epoch_loss(),
            tokens / max(seconds, 1e-9),
            seconds / 60,
        )

    def _end_epoch(self, epoch: int, seconds: float, tokens: int, resumed_at: int, saving: float) -> None:
        cfg, task, state = self.config, self.task, self.state
        dev = distributed.broadcast(task.evaluate("dev"))  # every rank decides as rank 0 does
        value = dev[task.metric]
        best = state["best"]
        improved = best is None or _better(value, best, task.higher_is_better)
        auxiliary = state["aux_sum"] / max(state["loss_count"], 1)
        record = {
            "event": "epoch",
            "epoch": epoch + 1,
            "step": state["global_step"],
            "lr": self.optimizer.param_groups[0]["lr"],  # the epoch's last step's
            "train_loss": self._epoch_loss(),  # the objective: with the regulariser, when there is one
            **({"train_auxiliary": auxiliary} if auxiliary else {}),  # ... which is this part of it
            **{f"dev_{k}": v for k, v in dev.items()},
            "seconds": round(seconds, 3),  # training steps only: checkpoint writes are apart
            "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
            "checkpoint_seconds": round(saving, 3),
            **({"resumed_at_step": resumed_at} if resumed_at else {}),  # seconds and tokens/s: the steps after it
        }
        log.info(
            "epoch %d: train loss %.4f%s, dev %s %.4f%s, %.1fs, %.0f tokens/s",
            epoch + 1,
            record["train_loss"],
            f" (regulariser {auxiliary:+.4f})" if auxiliary else "",
            task.metric,
            value,
            " (best)" if improved else "",
            seconds,
            record["tokens_per_s"],
        )
        if improved:
            state.update(best=value, best_epoch=epoch + 1, bad_epochs=0)
            self._save_best()
        else:
            state["bad_epochs"] += 1
        self._record(record)
        self._step_schedule(epoch, improved)
        state.update(
            epoch=epoch + 1, step_in_epoch=0, loss_sum=0.0, aux_sum=0.0, loss_count=0, window_start=[0.0, 0.0, 0]
        )
        if _patience_spent(state, cfg):
            log.info("early stopping: no dev improvement for %d epochs", cfg.train.patience)
        if _budget_spent(state, cfg):
            log.info("step budget of %d steps spent", cfg.train.max_steps)
        self._save_last()
        if self.main:
            check_run_dir(self.run_dir)
            plot_curves(self.metrics_path, self.run_dir / "plots", task.metric)

    def _step_schedule(self, epoch: int, improved: bool) -> None:
        cfg = self.config.optim
        lr = self.state["lr"]
        if (
            cfg.schedule == "exponential"
            or (cfg.schedule == "plateau" and not improved)
            or (cfg.schedule == "step_after" and epoch + 1 >= cfg.decay_start)
        ):
            lr = max(lr * cfg.decay, cfg.min_lr)
        self.state["lr"] = lr  # the next step's scheduled_lr() hands it to the optimiser

    def _finish(self) -> dict[str, float]:
        check_run_dir(self.run_dir)  # the test must read this run's best/, not another's
        task = self.task
        best = resolve_checkpoint(self.run_dir / "best")
        if best is None:
            raise TrainingError(f"no best checkpoint in {self.run_dir}; did training run any epoch?")
        load_weights(self.model, best / "model.safetensors")
        test = distributed.broadcast(task.evaluate("test"))
        record = {f"test_{k}": v for k, v in test.items()}
        self._record({"event": "test", "best_epoch": self.state["best_epoch"], **record})
        if self.main:
            plot_curves(self.metrics_path, self.run_dir / "plots", task.metric)  # `seqzoo train` lists them
        distributed.barrier()  # the other ranks read the test record once it is written
        log.info("test %s", ", ".join(f"{k} {v}" if isinstance(v, int) else f"{k} {v:.4f}" for k, v in test.items()))
        return test


def stop_reason(run_dir: str | Path, config: RunConfig) -> str | None:
    """Why resuming ``run_dir`` under ``config`` would not train (None: it would train on from its
    ``last/`` loop state): early stopping, the step budget or ``config.train.epochs``."""
    path = resolve_checkpoint(Path(run_dir) / "last")
    return "no last/ checkpoint" if path is None else _stop_reason(_read_train_state(path)["loop"], config)


def total_steps(cfg: TrainConfig, steps_per_epoch: int) -> int:
    """The run's length in optimiser steps: its epochs, or the step budget when that is shorter."""
    total = cfg.epochs * steps_per_epoch
    return min(total, cfg.max_steps) if cfg.max_steps is not None else total


def _patience_spent(loop: dict[str, Any], config: RunConfig) -> bool:
    """Early stopping: ``config.train.patience`` epochs in a row without a dev improvement."""
    patience = config.train.patience
    return patience is not None and loop["bad_epochs"] >= patience


def _budget_spent(loop: dict[str, Any], config: RunConfig) -> bool:
    """The step budget ``config.train.max_steps`` is used up."""
    budget = config.train.max_steps
    return budget is not None and loop["global_step"] >= budget


def _stop_reason(loop: dict[str, Any], config: RunConfig) -> str | None:
    """What stops the training loop at ``loop`` under ``config`` (so a run resumed under a relaxed
    config trains on), or None. An epoch the step budget cut short counts as done."""
    train = config.train
    if _patience_spent(loop, config):
        return f"stopped early: {loop['bad_epochs']} epochs without a dev gain (train.patience {train.patience})"
    if _budget_spent(loop, config):
        return f"the step budget is spent ({loop['global_step']} of train.max_steps {train.max_steps})"
    if loop["epoch"] >= train.epochs:
        return f"all epochs are done ({loop['epoch']} of train.epochs {train.epochs})"
    return None


def _epochs_left(loop: dict[str, Any], config: RunConfig) -> bool:
    return _stop_reason(loop, config) is None


def _better(value: float, best: float, higher_is_better: bool) -> bool:
    """Whether the dev metric ``value`` beats ``best``; NaN (a diverged model) ranks below every
    number, so a NaN epoch can be beaten (it beat nothing and nothing beat it: every comparison
    with NaN is False)."""
    if math.isnan(value):
        return False
    return math.isnan(best) or (value > best if higher_is_better else value < best)


def _read_train_state(checkpoint: Path) -> dict[str, Any]:
    """``train_state.json`` of a ``last/`` checkpoint; one without the parts a resume reads (damaged,
    or written by hand) is a :class:`DataError` naming the file, not a KeyError later on."""
    path = checkpoint / "train_state.json"
    doc = read_json(path)
    parts = ("loop", "optimizer", "extra", "python_rng")
    missing = [part for part in parts if part not in doc] if isinstance(doc, dict) else list(parts)
    if missing:
        raise DataError(f"not a seqzoo training state (missing {missing})", path)
    if not isinstance(doc["loop"], dict):
        raise DataError("not a seqzoo training state ('loop' is not an object)", path)
    return doc


def _joined(skeleton: Any, path: Path) -> Any:
    """The state ``skeleton`` (from ``train_state.json``) with its tensors from the file at ``path``."""
    try:
        return join_tensors(skeleton, load_tensors(path))
    except KeyError as err:
        raise DataError(f"no tensor {err} that train_state.json refers to", path) from None


def _model_tensors(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}


def _jsonable(value: Any) -> Any:
    return [_jsonable(v) for v in value] if isinstance(value, (tuple, list)) else value


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _int_keys(optim_state: dict[str, Any]) -> dict[str, Any]:
    """JSON turned the optimizer's integer parameter ids into strings; turn them back."""
    state = {int(k): v for k, v in optim_state["state"].items()}
    return {**optim_state, "state": state}
