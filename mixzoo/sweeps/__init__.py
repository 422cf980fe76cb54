"""Optuna sweeps: search spaces, seeds, storage, workers; built-in sweep specs."""
