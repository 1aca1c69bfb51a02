"""Hyperparameter tuning on Ray Tune: ASHA early stopping, Optuna TPE (or random) search,
trials placed by hetflow's planner, resumable runs. Entry point:
:func:`hetflow.workloads.tune.runner.run_tuning`; the command is ``hetflow tune``.

Modules: ``space`` (YAML search space -> Tune), ``config`` (the tuning YAML), ``placement``
(planner request -> trial resources), ``trial`` (one trial's training), ``progress`` (live
table, plot), ``runner`` (the run, its outputs, resume).
"""
