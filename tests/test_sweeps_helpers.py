"""Shared bits of the sweep tests: a tiny MQAR spec, a mechanism that can be made to diverge,
and readers of the storage and the leaderboard."""
from __future__ import annotations

import textwrap
from pathlib import Path

TRAIN = ('steps = 20\nbatch_size = 8\neval_every = 10\nn_train = 128\nn_val = 32\nn_test = 32\n'
         'd_model = 16\nn_layers = 1\nnum_heads = 1\n')

NANMIX = textwrap.dedent('''
    import torch
    from torch import nn

    from mixzoo.registry import register_mixer


    @register_mixer("nanmix", search_space={"lr": ("log", 1e-3, 1e-2), "poison": ("cat", [0, 1])})
    class NanMix(nn.Module):
        """A causal running mean; with poison=1 its output (and so the loss) is NaN."""

        def __init__(self, d_model, *, num_heads=1, layer_idx=0, poison=0):
            super().__init__()
            self.proj = nn.Linear(d_model, d_model)
            self.poison = poison

        def forward(self, x):
            n = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype).view(1, -1, 1)
            y = torch.cumsum(self.proj(x), dim=1) / n
            return y * float("nan") if self.poison else y
''')


def write_spec(path: Path, *, name: str, models, trials: int, seeds: int, extra: str = "",
               settings: str = "[{ L = 32, kv = 2 }]") -> Path:
    path.write_text(
        f'name = "{name}"\nmodels = {list(models)!r}\ntrials = {trials}\nseeds = {seeds}\n'.replace("'", '"')
        + extra + "\n[sampler]\nn_startup_trials = 10\n[train]\n" + TRAIN
        + f'[tasks.mqar]\nknobs = {{ V = 32 }}\nsettings = {settings}\n')
    return path


def write_plugin(path: Path) -> Path:
    path.write_text(NANMIX)
    return path


def journal(results: Path):
    from optuna.storages.journal import JournalFileBackend, JournalStorage
    return JournalStorage(JournalFileBackend(str(results / "sweeps" / "optuna-journal.log")))


def studies(storage) -> dict[str, list]:
    return {s.study_name: storage.get_all_trials(s._study_id) for s in storage.get_all_studies()}


def rows(results: Path) -> list[dict]:
    from mixzoo.leaderboard import read_table
    return read_table(results).to_pylist()


def test_a_raising_trial_is_recorded_failed_with_a_one_line_reason():
    from types import SimpleNamespace

    import optuna

    from mixzoo.sweeps.engine import _record_failure
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    logs, screen = [], []
    ctx = SimpleNamespace(storage=storage, trainer_log=logs.append, log=screen.append)
    try:
        raise RuntimeError("kernel exploded\nsecond line")
    except RuntimeError as e:
        _record_failure(ctx, storage.get_trial(trial._trial_id), "t0", e)
    t = storage.get_trial(trial._trial_id)
    assert t.state.name == "FAIL" and t.user_attrs["reason"] == "RuntimeError: kernel exploded"
    assert screen == ["t0: FAIL (RuntimeError: kernel exploded)"] and "Traceback" in logs[0]


def test_a_failure_of_a_trial_finished_elsewhere_is_ignored_and_says_so():
    """A worker presumed lost (stopped past the journal lock's grace period) comes back with an error for a
    trial another worker reaped and finished meanwhile: the trial keeps its state and the line says why."""
    from types import SimpleNamespace

    import optuna

    from mixzoo.sweeps.engine import _record_failure
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    frozen = storage.get_trial(trial._trial_id)
    study.tell(trial, 0.5)                                   # finished elsewhere meanwhile
    screen = []
    ctx = SimpleNamespace(storage=storage, trainer_log=lambda m: None, log=screen.append)
    try:
        raise RuntimeError("Error: did not possess lock")
    except RuntimeError as e:
        _record_failure(ctx, frozen, "t0", e)
    assert storage.get_trial(trial._trial_id).state.name == "COMPLETE"
    assert screen == ["t0: FAIL (RuntimeError: Error: did not possess lock) (already finished elsewhere; ignored)"]
