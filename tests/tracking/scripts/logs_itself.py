"""A torchrun-style script that logs to MLflow itself (rank 0 only), as many do: under
``hetflow launch --mlflow`` its ``mlflow.start_run()`` continues the launch's run (MLFLOW_RUN_ID).
``NO_MLFLOW=1``: it logs nothing; ``EXIT_CODE=N``: it exits N."""

import os
import sys

import mlflow
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0 and not os.environ.get("NO_MLFLOW"):  # NO_MLFLOW: a script that does not log
    with mlflow.start_run() as run:
        mlflow.log_param("script.lr", "0.5")
        for step in range(1, 4):
            mlflow.log_metric("script_loss", 1.0 / step, step=step)
        print(f"run {run.info.run_id}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
