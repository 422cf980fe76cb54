"""The sweep engine: Optuna's storage is the only coordination between workers.

Each unit (task setting × mechanism) has a *search study* whose trial budget is laid out as
``trials`` WAITING trials ("slots", user attr ``slot``), enqueued once. A worker claims a slot by
moving it WAITING → RUNNING (the storage lets exactly one claimant win), samples its
configuration with a TPE sampler seeded from (sampler seed, slot), trains on one seed, reports the
validation metric at the trainer's global step for pruning, and tells the outcome (COMPLETE,
PRUNED, or FAIL with a ``reason``). When every slot is finished, the best configuration is run
once per final seed through a companion *final study* laid out the same way (one slot per
seed); each final run is one leaderboard file, written only if no row of (study, seed) exists.

A claimed trial carries ``owner`` (host, boot, pid, start time) and a ``heartbeat`` it refreshes
(every ``MIXZOO_SWEEP_HEARTBEAT`` s). A RUNNING trial whose owner process is gone (same host) or
whose heartbeat is older than the grace period (``MIXZOO_SWEEP_GRACE`` s; another host, or a
process that cannot be inspected) is stale: the first worker to mark it FAIL (``stale``) enqueues
a retry with the same parameters in the same slot, so the budget is met exactly. The host is
``socket.gethostname()``, or ``MIXZOO_HOSTNAME`` where that is not unique (containers).

On a CUDA device a spec that leaves them unset runs in the fastest step modes measured (README,
"Step modes at MAD's baseline shape"): every run graphed (``step_mode`` "graphed" unless its
``[train]`` names one; it falls back to eager, from scratch, where capture is not possible) and
``stack = "auto"`` (the default) stacks as many trials as ``train.packing.stack_per_step`` gives
for the run's size; on a CPU runs are eager, one at a time. Step modes give each run the numbers of
training it alone, up to floating-point reordering, and are not part of a study's identity.

With ``stack = K`` a worker claims up to K slots of one study at once, each
claimed and owned as above, and trains them as one stacked model (:func:`run_search_batch`,
:func:`run_final_batch`); each trial is still sampled, heartbeated, pruned and told on its own, so
reaping, retries and the one-row-per-seed rule are unchanged. Only a study whose runs differ in lr,
weight_decay and the seed alone can stack (:func:`stack_blocker`); any other runs one at a time.

A worker interrupted (Ctrl-C, or SIGTERM: :class:`Terminated`) gives its trial back the same
way before it stops, so a rerun from any host runs it at once. A final run whose leaderboard
row cannot be written (a full disk) is recorded FAIL with the reason and re-enqueued, and the
worker stops with a :class:`~.storage.StorageError`, as it does when the storage itself fails.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .spec import Unit
from .storage import StorageError, raise_if_interrupted, uninterrupted

HEARTBEAT_S = float(os.environ.get("MIXZOO_SWEEP_HEARTBEAT", "10"))
GRACE_S = float(os.environ.get("MIXZOO_SWEEP_GRACE", "120"))
POLL_S = float(os.environ.get("MIXZOO_SWEEP_POLL", "2"))
HOST_ENV = "MIXZOO_HOSTNAME"


class Terminated(KeyboardInterrupt):
    """SIGTERM (what schedulers send), raised where the worker is, like Ctrl-C's KeyboardInterrupt:
    Lightning and the trainer pass it through as they do Ctrl-C. Exit code 143 (128 + 15)."""
    exit_code = 143


# ---------------------------------------------------------------------------- identity
def hostname() -> str:
    """This host's name in owner tokens: env ``MIXZOO_HOSTNAME``, else ``socket.gethostname()``."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "-"


def _start_ticks(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot), None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def owner_token(pid: int | None = None) -> str:
    pid = pid or os.getpid()
    return f"{hostname()}|{_boot_id()}|{pid}|{_start_ticks(pid) or '-'}"


def owner_alive(token: str) -> bool | None:
    """True/False for an owner on this host; None when it lives elsewhere (use the heartbeat)."""
    try:
        host, boot, pid, ticks = token.split("|")
    except ValueError:
        return None
    if host != hostname() or boot != _boot_id() or ticks == "-":
        return None
    return _start_ticks(int(pid)) == ticks


# ---------------------------------------------------------------------------- optuna objects
def make_sampler(unit: Unit, slot: int):
    """TPE with every setting explicit; its seed is derived from (sampler seed, slot), so the
    parallel workers draw different points and a sequential rerun draws the same ones."""
    import optuna
    s = unit.sampler
    seed = (int(s["seed"]) * 1_000_003 + 7919 * (slot + 1)) % (2 ** 32)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=int(s["n_startup_trials"]),
                                      n_ei_candidates=int(s["n_ei_candidates"]),
                                      multivariate=bool(s["multivariate"]), constant_liar=bool(s["constant_liar"]))


def make_pruner(unit: Unit):
    import optuna
    p = dict(unit.pruner)
    kind = p.pop("kind")
    if kind == "median":
        return optuna.pruners.MedianPruner(**p)
    if kind == "hyperband":
        if p.get("max_resource") is None:
            p["max_resource"] = int(unit.fixed.get("steps", 2000))
        return optuna.pruners.HyperbandPruner(**p)
    if kind == "threshold":
        return optuna.pruners.ThresholdPruner(**p)
    return optuna.pruners.NopPruner()


def _states():
    from optuna.trial import TrialState
    return TrialState


def create_study(storage, name: str, direction: str, attrs: dict[str, Any]) -> bool:
    """Create ``name`` unless it exists; True when this call created it."""
    import optuna
    try:
        study = optuna.create_study(storage=storage, study_name=name, direction=direction,
                                    load_if_exists=False)
    except optuna.exceptions.DuplicatedStudyError:
        return False
    for k, v in attrs.items():
        study.set_user_attr(k, v)
    return True


def study_id(storage, name: str) -> int | None:
    import optuna
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None
    except optuna.exceptions.OptunaError:
        return None


def ensure_slots(storage, sid: int, slots: list[dict[str, Any]]) -> int:
    """Enqueue the slots (user attrs with ``slot``) that no trial of study ``sid`` holds yet."""
    from optuna.trial import create_trial
    have = set(canonical(storage.get_all_trials(sid, deepcopy=False))[0])
    n = 0
    for s in slots:
        if s["slot"] in have:
            continue
        params = s.pop("_params", {}) if "_params" in s else {}
        t = create_trial(state=_states().WAITING, system_attrs={"fixed_params": params}, user_attrs=s)
        storage.create_new_trial(sid, template_trial=t)
        n += 1
    return n


def canonical(trials) -> tuple[dict[int, Any], list[Any]]:
    """slot -> the trial that holds it (lowest number, not stale); and the duplicates."""
    by_slot: dict[int, Any] = {}
    dups = []
    for t in sorted(trials, key=lambda t: t.number):
        ua = t.user_attrs
        if "slot" not in ua or ((ua.get("stale") or ua.get("duplicate")) and t.state == _states().FAIL):
            continue
        if ua["slot"] in by_slot:
            dups.append(t)
        else:
            by_slot[ua["slot"]] = t
    return by_slot, dups


def is_stale(t, now: float, grace: float) -> bool:
    if t.state != _states().RUNNING:
        return False
    owner = t.user_attrs.get("owner")
    if owner:
        alive = owner_alive(owner)
        if alive is not None:
            return not alive
    last = t.user_attrs.get("heartbeat")
    if last is None:
        start = t.datetime_start.timestamp() if t.datetime_start else now
        last = start
    return now - float(last) > grace


def retire(storage, sid: int, t, reason: str) -> bool:
    """Mark the RUNNING trial ``t`` FAIL with ``reason`` and ``stale`` (it no longer holds its slot)
    and enqueue a retry with the same parameters in the same slot; False when it had finished
    meanwhile (another worker retired it, or its owner finished it)."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import create_trial
    TS = _states()
    try:
        storage.set_trial_user_attr(t._trial_id, "stale", True)
        storage.set_trial_user_attr(t._trial_id, "reason", reason)
        storage.set_trial_state_values(t._trial_id, state=TS.FAIL)
    except (UpdateFinishedTrialError, RuntimeError):
        return False
    ua = {k: v for k, v in t.user_attrs.items() if k in ("slot", "seed", "kind")}
    ua["retry_of"] = t.number
    params = dict(t.system_attrs.get("fixed_params") or {})
    params.update(t.params)
    storage.create_new_trial(sid, template_trial=create_trial(
        state=TS.WAITING, system_attrs={"fixed_params": params}, user_attrs=ua))
    return True


def reap(storage, sid: int, trials, grace: float, log: Callable[[str], None]) -> int:
    """Mark stale RUNNING trials FAIL and enqueue their retries; returns how many this call reaped."""
    now = time.time()
    n = 0
    for t in trials:
        if not is_stale(t, now, grace):
            continue
        if retire(storage, sid, t, f"worker {t.user_attrs.get('owner', '?')} stopped (killed or lost); retried"):
            log(f"reaped stale trial {t.number} (slot {t.user_attrs.get('slot')}) and re-enqueued it")
            n += 1
    return n


@contextlib.contextmanager
def given_back_on_interrupt(ctx, sid: int, ts: list):
    """Inside: claim into the list ``ts`` and run what was claimed (one trial, or a stacked batch).
    On Ctrl-C or SIGTERM each trial ``ts`` holds by then, one won just before included, is given
    back (retired and re-enqueued, as a reaper would) before the interrupt goes on, so a rerun from
    any host runs it at once instead of waiting for the grace period. Best effort: a trial left
    RUNNING is reaped."""
    try:
        yield
    except KeyboardInterrupt as e:
        how = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
        for t in ts:
            with contextlib.suppress(Exception):
                if retire(ctx.storage, sid, t, f"interrupted ({how}); retried"):
                    ctx.log(f"interrupted ({how}): trial {t.number} (slot {t.user_attrs.get('slot')}) given back "
                            f"for the rerun")
        raise


def claim(storage, trials) -> Any | None:
    """Move one canonical WAITING trial to RUNNING, lowest slot first; None if none was won."""
    got = claim_many(storage, trials, 1)
    return got[0] if got else None


def claim_many(storage, trials, n: int, into: list[Any] | None = None) -> list[Any]:
    """Move up to ``n`` canonical WAITING trials to RUNNING, lowest slots first, each claimed (and
    owned) on its own as :func:`claim` does: the trials won, possibly fewer than ``n`` or none.
    ``into``: a list each trial joins the moment it is won, so that an interrupt landing between two
    journal appends of the claim still finds it (:func:`given_back_on_interrupt`)."""
    from optuna.exceptions import UpdateFinishedTrialError
    TS = _states()
    slots, dups = canonical(trials)
    for t in dups:  # a slot enqueued twice by racing setups: retire the copy, never run it
        if t.state == TS.WAITING:
            with contextlib.suppress(UpdateFinishedTrialError, RuntimeError):
                if storage.set_trial_state_values(t._trial_id, state=TS.RUNNING):
                    storage.set_trial_user_attr(t._trial_id, "duplicate", True)
                    storage.set_trial_user_attr(t._trial_id, "reason", "duplicate slot; not run")
                    storage.set_trial_state_values(t._trial_id, state=TS.FAIL)
    won: list[Any] = [] if into is None else into
    for slot in sorted(slots):
        if len(won) >= n:
            break
        t = slots[slot]
        if t.state != TS.WAITING:
            continue
        try:
            with uninterrupted():   # the trial won is listed before an interrupt can come
                ok = storage.set_trial_state_values(t._trial_id, state=TS.RUNNING)
                if ok:
                    won.append(t)
            if ok:
                storage.set_trial_user_attr(t._trial_id, "owner", owner_token())
                storage.set_trial_user_attr(t._trial_id, "heartbeat", time.time())
        except (UpdateFinishedTrialError, RuntimeError):
            continue
    return won


@contextlib.contextmanager
def heartbeat(storage, trial_id: int | list[int], interval: float = HEARTBEAT_S):
    """Refresh the heartbeat of the trial ``trial_id`` (or of each of a list: a stacked batch)."""
    stop = threading.Event()
    live = [trial_id] if isinstance(trial_id, int) else list(trial_id)

    def beat():
        while live and not stop.wait(interval):
            for tid in list(live):
                try:
                    storage.set_trial_user_attr(tid, "heartbeat", time.time())
                except StorageError:
                    continue  # storage down or disk full: beat again later (the main thread stops the worker)
                except Exception:
                    live.remove(tid)  # finished (or reaped) meanwhile
    th = threading.Thread(target=beat, daemon=True, name="mixzoo-heartbeat")
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join(timeout=5)


def not_failed_by_interrupt() -> None:
    """Before a run is told FAIL (or its failed row written): if Ctrl-C or SIGTERM was asked for
    meanwhile, raise it, so that the trial, still RUNNING, is given back (:func:`given_back_on_interrupt`)
    and rerun, instead of holding its slot as a failure. A signal's exception that lands in a library
    can come out as another error (a C extension's SystemError, a RuntimeError that wraps it), which
    the run then reports as its own failure."""
    raise_if_interrupted()


def _record_failure(ctx, frozen, tag: str, e: Exception) -> None:
    """Mark a claimed trial FAIL with a one-line reason; the traceback goes to the worker log."""
    ctx.trainer_log(traceback.format_exc())
    why = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    ok = _finish(ctx.storage, frozen._trial_id, _states().FAIL, reason=why)
    # not ok: the trial was finished meanwhile by a worker that presumed this one lost (e.g. this process was
    # stopped past the journal lock's grace period, so its release raised "did not possess lock")
    ctx.log(f"{tag}: FAIL ({why})" + ("" if ok else " (already finished elsewhere; ignored)"))


def _finish(storage, trial_id: int, state, value: float | None = None, reason: str | None = None) -> bool:
    """Finish the trial; False when it was finished meanwhile. A FAIL while an interrupt was asked
    for raises that interrupt instead (:func:`not_failed_by_interrupt`)."""
    from optuna.exceptions import UpdateFinishedTrialError
    if state == _states().FAIL:
        not_failed_by_interrupt()
    try:
        if reason:
            storage.set_trial_user_attr(trial_id, "reason", reason)
        storage.set_trial_state_values(trial_id, state=state, values=None if value is None else [value])
        return True
    except (UpdateFinishedTrialError, RuntimeError):
        return False


# ---------------------------------------------------------------------------- the context
@dataclass
class Context:
    storage: Any
    storage_url: str
    results: str
    device: str | None
    command: str | None
    log: Callable[[str], None]            # terse lines (screen)
    trainer_log: Callable[[str], None]    # verbose lines (the worker's log file)
    grace: float = GRACE_S
    missing: dict[str, float] = field(default_factory=dict)   # study -> first seen with a slot missing
    noted: set = field(default_factory=set)                    # (study, phase) told why it is not stacked
    cuda: bool | None = None                                   # whether ctx.device is a CUDA device (lazily)


def setup(ctx: Context, units: list[Unit]) -> None:
    """Create every search study and its slots (idempotent; safe to run from several hosts)."""
    for u in units:
        create_study(ctx.storage, u.study, u.direction, {"unit": unit_json(u), "kind": "search"})
        sid = study_id(ctx.storage, u.study)
        slots = [{"slot": i, "kind": "search"} for i in range(u.trials)]
        for i, params in enumerate(u.enqueue[:u.trials]):
            slots[i]["_params"] = dict(params)
        ensure_slots(ctx.storage, sid, slots)


def unit_json(u: Unit) -> str:
    return json.dumps({"spec": u.spec, "preset": u.preset, "task": u.task, "task_preset": u.task_preset,
                       "knobs": u.knobs, "model": u.model, "label": u.label, "setting": u.setting,
                       "fixed": u.fixed, "space": u.space, "trials": u.trials, "seeds": u.seeds,
                       "metric": u.metric, "direction": u.direction}, sort_keys=True, default=str)


def best_trial(u: Unit, slots: dict[int, Any]):
    TS = _states()
    done = [t for t in slots.values() if t.state == TS.COMPLETE and t.value is not None and math.isfinite(t.value)]
    if not done:
        return None
    sign = -1 if u.direction == "maximize" else 1
    return min(done, key=lambda t: (sign * t.value, t.number))


def unit_status(ctx: Context, u: Unit) -> dict[str, Any]:
    """Where a unit stands: trial counts by state, the best trial, the final seeds finished."""
    st: dict[str, Any] = {"unit": u, "counts": {}, "stale": 0, "best": None, "final_done": 0, "done": False}
    sid = study_id(ctx.storage, u.study)
    if sid is None:
        return st
    trials = ctx.storage.get_all_trials(sid, deepcopy=False)
    slots, _ = canonical(trials)
    st["stale"] = sum(1 for t in trials if t.user_attrs.get("stale"))
    for t in slots.values():
        st["counts"][t.state.name] = st["counts"].get(t.state.name, 0) + 1
    search_done = len(slots) >= u.trials and all(t.state.is_finished() for t in slots.values())
    st["best"] = best_trial(u, slots) if search_done else None
    if search_done and st["best"] is None:
        st["done"] = True
        return st
    fid = study_id(ctx.storage, u.final_study)
    if fid is not None:
        fslots, _ = canonical(ctx.storage.get_all_trials(fid, deepcopy=False))
        st["final_done"] = sum(1 for t in fslots.values() if t.state.is_finished())
        st["done"] = search_done and len(fslots) >= len(u.seeds) and st["final_done"] >= len(u.seeds)
    return st


def search_state(ctx: Context, u: Unit):
    sid = study_id(ctx.storage, u.study)
    trials = ctx.storage.get_all_trials(sid, deepcopy=False)
    return sid, trials


def step(ctx: Context, units: list[Unit]) -> str:
    """Do one piece of work if any can be claimed: 'worked', 'wait' (others are busy) or 'done'."""
    waiting = False
    for u in units:
        sid, trials = search_state(ctx, u)
        if sid is None:
            setup(ctx, [u])
            sid, trials = search_state(ctx, u)
        if reap(ctx.storage, sid, trials, ctx.grace, ctx.log):
            trials = ctx.storage.get_all_trials(sid, deepcopy=False)
        slots, _ = canonical(trials)
        if len(slots) < u.trials:
            # a slot is missing while another worker lays or re-enqueues it; if that worker
            # died in between, lay it after the grace period
            if overdue(ctx, u.study):
                setup(ctx, [u])
                return "worked"
            waiting = True
            continue
        ctx.missing.pop(u.study, None)
        if not all(t.state.is_finished() for t in slots.values()):
            got: list[Any] = []
            with given_back_on_interrupt(ctx, sid, got):
                claim_many(ctx.storage, trials, stack_size(ctx, u, "search"), into=got)
                if len(got) == 1:
                    run_search_trial(ctx, u, got[0])
                elif got:
                    run_search_batch(ctx, u, got)
            if got:
                return "worked"
            waiting = True
            continue
        best = best_trial(u, slots)
        if best is None:
            continue  # every trial failed or was pruned: nothing to run over seeds
        fid = ensure_final(ctx, u, best)
        ftrials = ctx.storage.get_all_trials(fid, deepcopy=False)
        if reap(ctx.storage, fid, ftrials, ctx.grace, ctx.log):
            ftrials = ctx.storage.get_all_trials(fid, deepcopy=False)
        fslots, _ = canonical(ftrials)
        if len(fslots) < len(u.seeds):
            waiting = True  # its creator is laying the slots (ensure_final repairs a dead creator's)
            continue
        if all(t.state.is_finished() for t in fslots.values()):
            continue
        got = []
        with given_back_on_interrupt(ctx, fid, got):
            claim_many(ctx.storage, ftrials, stack_size(ctx, u, "final", best.params), into=got)
            if len(got) == 1:
                run_final(ctx, u, fid, got[0])
            elif got:
                run_final_batch(ctx, u, fid, got)
        if got:
            return "worked"
        waiting = True
    return "wait" if waiting else "done"


def work(ctx: Context, units: list[Unit], stop: Callable[[], bool] = lambda: False) -> None:
    """A worker: claim and run trials and final seeds until nothing is left."""
    errors = 0
    while not stop():
        raise_if_interrupted()     # one a library swallowed: stop before claiming more
        try:
            r = step(ctx, units)
            errors = 0
        except StorageError:
            raise   # the storage already retried for its window (or the disk is full): stop this worker
        except Exception as e:  # a storage hiccup: retry a few times before giving up
            errors += 1
            ctx.trainer_log(traceback.format_exc())
            if errors >= 3:
                raise
            ctx.log(f"storage error ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); retrying")
            time.sleep(POLL_S)
            continue
        if r == "done":
            return
        if r == "wait":
            time.sleep(POLL_S)


# ---------------------------------------------------------------------------- search trials
def suggest(trial, space: dict[str, tuple]) -> dict[str, Any]:
    out = {}
    for name, entry in space.items():
        kind = entry[0]
        if kind == "log":
            out[name] = trial.suggest_float(name, entry[1], entry[2], log=True)
        elif kind == "float":
            out[name] = trial.suggest_float(name, entry[1], entry[2])
        elif kind == "int":
            out[name] = trial.suggest_int(name, entry[1], entry[2])
        else:
            out[name] = trial.suggest_categorical(name, entry[1])
    return out


def pruning_hook(trial, metric: str):
    """``on_eval`` for the trainer: report the validation metric at the global step, prune if told."""
    import optuna

    def on_eval(step: int, val: dict[str, float]) -> None:
        raise_if_interrupted()
        v = val.get(metric)
        if v is None or not math.isfinite(v):
            return  # the trainer itself fails the run on a non-finite value
        trial.report(float(v), step=int(step))
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step}: validation {metric} {v:.4g}")
    return on_eval


def interrupt_hook(step: int, val: dict[str, float]) -> None:
    """``on_eval`` for a final run: stop at a validation should an interrupt have been swallowed."""
    raise_if_interrupted()


def run_search_trial(ctx: Context, u: Unit, frozen) -> None:
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState as TS

    from .. import api
    slot = frozen.user_attrs["slot"]
    study = optuna.load_study(study_name=u.study, storage=ctx.storage, sampler=make_sampler(u, slot),
                              pruner=make_pruner(u))
    # On an RDB, load_study wraps the storage in Optuna's cache, which can set a parameter only of
    # a trial it has read: read the study now, or a fixed parameter (an enqueued or a retried
    # trial's), set before any sampling reads it, fails with a KeyError
    study.get_trials(deepcopy=False)
    trial = optuna.Trial(study, frozen._trial_id)
    tag = f"{u.task}[{u.label}] {u.model} trial {frozen.number} (slot {slot})"
    with heartbeat(ctx.storage, frozen._trial_id):
        try:
            params = suggest(trial, u.space)
            ctx.trainer_log(f"start {tag}: {json.dumps(params, default=str)}")
            spec = as_run_here(ctx, u, u.run_spec().with_hparams(params, label=f"trial {frozen.number}:"))
            rows = api.run_spec(spec, seeds=(u.search_seed,), results=None, device=ctx.device,
                                study=u.study, trial=frozen.number, command=ctx.command, log=ctx.trainer_log,
                                on_eval=pruning_hook(trial, u.metric), search_space=u.space)
            row = rows[0]
        except optuna.TrialPruned as e:
            _finish(ctx.storage, frozen._trial_id, TS.PRUNED, reason=str(e) or "pruned")
            ctx.log(f"{tag}: PRUNED ({e})")
            return
        except StorageError:
            raise   # not the trial's fault; it stays RUNNING and is reaped on the rerun
        except UpdateFinishedTrialError:
            # a report found the trial finished: this worker was presumed lost (stopped, cut off)
            # and another reaped the trial and runs its retry
            ctx.log(f"{tag}: reclaimed by another worker meanwhile (this one was presumed lost); "
                    f"stopped, its result is dropped")
            return
        except Exception as e:
            _record_failure(ctx, frozen, tag, e)
            return
    _tell_search(ctx, u, frozen, tag, row)


def _tell_search(ctx: Context, u: Unit, frozen, tag: str, row: dict[str, Any]) -> None:
    """Tell a search trial's outcome from its (unwritten) row: COMPLETE with the validation metric,
    else FAIL with the row's reason."""
    from optuna.trial import TrialState as TS
    if row["state"] == "COMPLETE" and row["val_metric_value"] is not None:
        v = float(row["val_metric_value"])
        for k in ("steps", "best_step", "steps_per_s", "params"):
            with contextlib.suppress(Exception):
                ctx.storage.set_trial_user_attr(frozen._trial_id, k, row[k])
        ok = _finish(ctx.storage, frozen._trial_id, TS.COMPLETE, value=v)
        ctx.log(f"{tag}: val {u.metric} {v:.4f}" + ("" if ok else " (already finished elsewhere; ignored)"))
    else:
        why = row.get("state_reason") or "failed"
        _finish(ctx.storage, frozen._trial_id, TS.FAIL, reason=why)
        ctx.log(f"{tag}: FAIL ({why})")


# ---------------------------------------------------------------------------- stacked batches
STACKABLE = ("lr", "muon_lr", "weight_decay")    # what may differ between the runs of one stacked batch (and the seed)


def stack_blocker(u: Unit, params: dict[str, Any] | None = None) -> str | None:
    """Why ``u``'s trials cannot be trained as one stacked batch (``train_stacked``'s contract: the
    runs differ only in seed, lr (muon_lr) and weight_decay; adamw or muon; compile off), or None when
    they can.
    ``params`` None: the search trials (the space may vary only lr and weight_decay; an entry of one
    choice does not vary); else the
    final runs of that configuration (the same one, over seeds)."""
    if params is None:
        # a categorical of one choice does not vary: every trial takes it (as the final runs take theirs)
        other = [k for k, d in u.space.items() if k not in STACKABLE and not (d[0] == "cat" and len(set(map(repr, d[1]))) == 1)]
        if other:
            return (f"its search space varies {', '.join(other)} (a stacked batch may differ only in "
                    f"{', '.join(STACKABLE)} and the seed)")
        spec = u.run_spec()
    else:
        try:
            spec = u.run_spec().with_hparams(params, label="best configuration:")
        except Exception as e:
            return f"its best configuration does not build ({type(e).__name__})"
    cfg = spec.train_config()
    if cfg.optimizer not in ("adamw", "muon"):
        return f"optimizer={cfg.optimizer!r} (stacked training runs adamw and muon only)"
    if cfg.compile != "off":
        return f"compile={cfg.compile!r} (stacked training runs with compile=off)"
    return None


def on_cuda(ctx: Context) -> bool:
    if ctx.cuda is None:
        from ..train.loop import resolve_device
        ctx.cuda = resolve_device(ctx.device).type == "cuda"
    return ctx.cuda


def auto_stack(ctx: Context, u: Unit) -> int:
    """``stack = "auto"``: ``stack_per_step`` of the unit's run on a CUDA device, else 1."""
    if not on_cuda(ctx):
        return 1
    from ..train.packing import stack_per_step
    spec = u.run_spec()
    return stack_per_step(spec.train_config().batch_size, spec.make_task().seq_len, spec.model_config().d_model)


def as_run_here(ctx: Context, u: Unit, spec):
    """``spec`` graphed on a CUDA device where the sweep's [train] names no step_mode."""
    if "step_mode" in u.fixed or not on_cuda(ctx):
        return spec
    import dataclasses
    return dataclasses.replace(spec, train={**spec.train, "step_mode": "graphed"})


def stack_size(ctx: Context, u: Unit, phase: str, params: dict[str, Any] | None = None) -> int:
    """How many trials of ``u``'s ``phase`` ("search" or "final") this worker takes at a time: the
    unit's ``stack`` (``auto_stack`` for "auto") where its trials can be stacked, else 1 (said once
    per study and phase)."""
    k = int(u.stack) if getattr(u, "stack", None) is not None else auto_stack(ctx, u)
    if k <= 1:
        return 1
    why = stack_blocker(u, params if phase == "final" else None)
    if why is None:
        return k
    if (u.study, phase) not in ctx.noted:
        ctx.noted.add((u.study, phase))
        ctx.log(f"{u.task}[{u.label}] {u.model}: stack = {k} not used for its {phase} "
                f"{'trials' if phase == 'search' else 'seeds'}: {why}; running them one at a time")
    return 1


def _tell_existing(ctx: Context, trial_id: int, r: dict, tag: str) -> None:
    """Tell a final seed whose row is already in the leaderboard (written before a crash) by that row."""
    from optuna.trial import TrialState as TS
    ok = r["state"] == "COMPLETE"
    _finish(ctx.storage, trial_id, TS.COMPLETE if ok else TS.FAIL, value=r["metric_value"] if ok else None,
            reason=None if ok else "row already in the leaderboard")
    ctx.log(f"{tag}: row already in the leaderboard")


def _stacked_mode(ctx: Context, u: Unit) -> str:
    mode = as_run_here(ctx, u, u.run_spec()).train.get("step_mode")
    return "stacked+graphed" if mode in ("graphed", "stacked+graphed") else "stacked"


def _hook_outcome(ctx: Context, frozen, tag: str, err: BaseException) -> None:
    """Tell a batch trial whose own run was stopped by its ``on_eval`` hook (pruned, reclaimed)."""
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState as TS
    if isinstance(err, optuna.TrialPruned):
        _finish(ctx.storage, frozen._trial_id, TS.PRUNED, reason=str(err) or "pruned")
        ctx.log(f"{tag}: PRUNED ({err})")
    elif isinstance(err, UpdateFinishedTrialError):
        ctx.log(f"{tag}: reclaimed by another worker meanwhile (this one was presumed lost); "
                f"stopped, its result is dropped")
    elif isinstance(err, StorageError):
        raise err
    else:
        why = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        _finish(ctx.storage, frozen._trial_id, TS.FAIL, reason=why)
        ctx.log(f"{tag}: FAIL ({why})")


def run_search_batch(ctx: Context, u: Unit, frozens: list) -> None:
    """Search trials ``frozens`` (claimed together; lr and weight_decay are all the space varies)
    trained as one stacked model (``api.run_stacked``). Each is still its own Optuna trial: its own
    sampler (seeded by its slot) suggests its parameters, the heartbeat covers every trial of the
    batch, each reports to its own pruner (a pruned run stops and is frozen while the others train
    on) and each is told on its own, exactly as :func:`run_search_trial` tells one trial."""
    import optuna

    from .. import api
    items = []          # (frozen, trial, tag, spec)
    with heartbeat(ctx.storage, [f._trial_id for f in frozens]):
        for f in frozens:
            slot = f.user_attrs["slot"]
            tag = f"{u.task}[{u.label}] {u.model} trial {f.number} (slot {slot})"
            try:
                study = optuna.load_study(study_name=u.study, storage=ctx.storage, sampler=make_sampler(u, slot),
                                          pruner=make_pruner(u))
                study.get_trials(deepcopy=False)      # as run_search_trial: the RDB cache must have read it
                trial = optuna.Trial(study, f._trial_id)
                params = suggest(trial, u.space)
                spec = u.run_spec().with_hparams(params, label=f"trial {f.number}:")
                ctx.storage.set_trial_user_attr(f._trial_id, "stack", len(frozens))
            except StorageError:
                raise
            except Exception as e:
                _record_failure(ctx, f, tag, e)
                continue
            ctx.trainer_log(f"start {tag} (stacked batch of {len(frozens)}): {json.dumps(params, default=str)}")
            items.append((f, trial, tag, spec))
        if not items:
            return
        try:
            rows, errs = api.run_stacked([it[3] for it in items], seeds=[u.search_seed] * len(items),
                                         device=ctx.device, study=u.study, trials=[it[0].number for it in items],
                                         command=ctx.command, log=ctx.trainer_log, mode=_stacked_mode(ctx, u),
                                         on_eval=[pruning_hook(it[1], u.metric) for it in items],
                                         search_space=u.space)
        except StorageError:
            raise
        except Exception as e:
            for f, _, tag, _ in items:
                _record_failure(ctx, f, tag, e)
            return
    for (f, _, tag, _), row, err in zip(items, rows, errs):
        with contextlib.suppress(Exception):
            ctx.storage.set_trial_user_attr(f._trial_id, "step_mode", json.loads(row["spec_json"])["train"]["step_mode"])
        if err is not None:
            _hook_outcome(ctx, f, tag, err)
        else:
            _tell_search(ctx, u, f, tag, row)


# ---------------------------------------------------------------------------- final runs
def overdue(ctx: Context, key: str) -> bool:
    """True once ``key`` has been seen incomplete by this worker for longer than the grace period."""
    now = time.time()
    return now - ctx.missing.setdefault(key, now) > ctx.grace


def ensure_final(ctx: Context, u: Unit, best) -> int:
    hp = {**u.fixed, **best.params}
    attrs = {"kind": "final", "search_study": u.study, "best_trial": best.number, "best_value": best.value,
             "hparams": json.dumps(hp, sort_keys=True, default=str), "owner": owner_token(), "created": time.time()}
    created = create_study(ctx.storage, u.final_study, u.direction, attrs)
    fid = study_id(ctx.storage, u.final_study)
    if created:
        ensure_slots(ctx.storage, fid, [{"slot": i, "seed": s, "kind": "final"} for i, s in enumerate(u.seeds)])
        return fid
    # created elsewhere: lay missing slots only if its creator is gone (its setup was cut short);
    # so are the attributes it did not set (the same for every worker: the search is finished)
    slots, _ = canonical(ctx.storage.get_all_trials(fid, deepcopy=False))
    if len(slots) < len(u.seeds):
        import optuna
        sa = optuna.load_study(study_name=u.final_study, storage=ctx.storage).user_attrs
        alive = owner_alive(sa["owner"]) if "owner" in sa else None
        if alive is False or overdue(ctx, u.final_study):
            for k, v in attrs.items():
                if k not in sa:
                    ctx.storage.set_study_user_attr(fid, k, v)
            ensure_slots(ctx.storage, fid, [{"slot": i, "seed": s, "kind": "final"} for i, s in enumerate(u.seeds)])
    return fid


def existing_rows(results: str, task: str, study: str) -> dict[int, dict]:
    """seed -> row of the leaderboard for ``study`` (only the columns needed)."""
    import pyarrow.parquet as pq

    from ..leaderboard import files
    out = {}
    for p in files(results):
        if f"task={task}" not in p.parts:
            continue
        try:
            t = pq.read_table(p, columns=["study", "seed", "metric_value", "state"])
        except Exception:
            continue
        for r in t.to_pylist():
            if r["study"] == study:
                out[int(r["seed"])] = r
    return out


def run_final(ctx: Context, u: Unit, fid: int, frozen) -> None:
    import optuna
    from optuna.trial import TrialState as TS

    from .. import api
    seed = int(frozen.user_attrs["seed"])
    sa = optuna.load_study(study_name=u.final_study, storage=ctx.storage).user_attrs
    hp, best = json.loads(sa["hparams"]), int(sa["best_trial"])
    tag = f"{u.task}[{u.label}] {u.model} best trial {best}, seed {seed}"
    with heartbeat(ctx.storage, frozen._trial_id):
        have = existing_rows(ctx.results, u.task, u.study)
        if seed in have:  # written before a crash: never twice
            _tell_existing(ctx, frozen._trial_id, have[seed], tag)
            return
        try:
            ctx.trainer_log(f"start final {tag}: {json.dumps(hp, default=str)}")
            spec = as_run_here(ctx, u, u.run_spec().with_hparams(hp, label=f"best trial {best}:"))
            rows = api.run_spec(spec, seeds=(seed,), results=None, device=ctx.device, study=u.study, trial=best,
                                command=ctx.command, log=ctx.trainer_log, search_space=u.space,
                                on_eval=interrupt_hook)
        except StorageError:
            raise
        except Exception as e:
            _record_failure(ctx, frozen, tag, e)
            return
        row = rows[0]
        if row["state"] != "COMPLETE":
            not_failed_by_interrupt()   # before its row is written
        now = ctx.storage.get_trial(frozen._trial_id)
        if now.state != TS.RUNNING or seed in existing_rows(ctx.results, u.task, u.study):
            ctx.log(f"{tag}: finished elsewhere meanwhile; row not written")
            return
        try:
            api.write_results(ctx.results, rows)   # temporary files renamed: nothing is left when it fails
        except OSError as e:
            # a full (or failing) results disk: the run is recorded FAIL with the reason and its
            # slot re-enqueued, and this worker stops: the next run would fail the same way
            _row_write_failed(ctx, tag, e, fid, [frozen])
    _tell_final(ctx, u, tag, frozen._trial_id, row)


def _row_write_failed(ctx: Context, tag: str, e: OSError, fid: int, frozens: list) -> None:
    """A final row that could not be written: each of ``frozens`` retired (re-enqueued in its slot),
    then StorageError (this worker stops; the next write would fail the same way)."""
    detail = os.strerror(e.errno) if e.errno else (str(e).strip().splitlines() or [type(e).__name__])[-1]
    why = f"cannot write the leaderboard row under {Path(ctx.results) / 'leaderboard'}: {detail}"
    ctx.trainer_log(traceback.format_exc())
    for g in frozens:
        retire(ctx.storage, fid, g, f"{why}; retried")
    raise StorageError(f"{tag}: {why}; free space (or fix the disk) and rerun the same command to resume") from e


def _tell_final(ctx: Context, u: Unit, tag: str, trial_id: int, row: dict) -> None:
    """Tell a final-seed trial its row's outcome: COMPLETE with the test metric, else FAIL with the reason."""
    from optuna.trial import TrialState as TS
    if row["state"] == "COMPLETE":
        _finish(ctx.storage, trial_id, TS.COMPLETE, value=float(row["metric_value"]))
        ctx.log(f"{tag}: test {u.metric} {row['metric_value']:.4f}")
    else:
        _finish(ctx.storage, trial_id, TS.FAIL, reason=row.get("state_reason") or "failed")
        ctx.log(f"{tag}: FAIL ({row.get('state_reason')})")


def run_final_batch(ctx: Context, u: Unit, fid: int, frozens: list) -> None:
    """Final seeds ``frozens`` (claimed together) of the best configuration trained as one stacked
    model; then, seed by seed, the row written (only if no row of (study, seed) exists, and only
    while this worker still holds the trial) and the trial told, as :func:`run_final` does."""
    import optuna
    from optuna.trial import TrialState as TS

    from .. import api
    sa = optuna.load_study(study_name=u.final_study, storage=ctx.storage).user_attrs
    hp, best = json.loads(sa["hparams"]), int(sa["best_trial"])
    with heartbeat(ctx.storage, [f._trial_id for f in frozens]):
        have = existing_rows(ctx.results, u.task, u.study)
        todo = []
        for f in frozens:
            seed = int(f.user_attrs["seed"])
            tag = f"{u.task}[{u.label}] {u.model} best trial {best}, seed {seed}"
            if seed in have:  # written before a crash: never twice
                _tell_existing(ctx, f._trial_id, have[seed], tag)
            else:
                todo.append((f, seed, tag))
        if not todo:
            return
        try:
            seeds = [s for _, s, _ in todo]
            ctx.trainer_log(f"start final {u.task}[{u.label}] {u.model} best trial {best}, seeds {seeds} "
                            f"(stacked batch of {len(todo)}): {json.dumps(hp, default=str)}")
            spec = as_run_here(ctx, u, u.run_spec().with_hparams(hp, label=f"best trial {best}:"))
            if len(todo) == 1:
                rows = api.run_spec(spec, seeds=seeds, results=None, device=ctx.device, study=u.study, trial=best,
                                    command=ctx.command, log=ctx.trainer_log, search_space=u.space,
                                    on_eval=interrupt_hook)
            else:
                rows, _ = api.run_stacked([spec] * len(todo), seeds=seeds, device=ctx.device, study=u.study,
                                          trials=[best] * len(todo), command=ctx.command, log=ctx.trainer_log,
                                          mode=_stacked_mode(ctx, u), search_space=u.space,
                                          on_eval=[interrupt_hook] * len(todo))
        except StorageError:
            raise
        except Exception as e:
            for f, _, tag in todo:
                _record_failure(ctx, f, tag, e)
            return
        if any(r["state"] != "COMPLETE" for r in rows):
            not_failed_by_interrupt()   # before any row is written
        for i, ((f, seed, tag), row) in enumerate(zip(todo, rows)):
            now = ctx.storage.get_trial(f._trial_id)
            if now.state != TS.RUNNING or seed in existing_rows(ctx.results, u.task, u.study):
                ctx.log(f"{tag}: finished elsewhere meanwhile; row not written")
                continue
            try:
                api.write_results(ctx.results, [row])   # one file per seed, as run_final writes
            except OSError as e:             # this seed and the ones not written yet: retried
                _row_write_failed(ctx, tag, e, fid, [g for g, _, _ in todo[i:]])
            _tell_final(ctx, u, tag, f._trial_id, row)
