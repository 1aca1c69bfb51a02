"""A test job whose work is time: it ends ``SECONDS`` after the controller launched it.

    python sleep_job.py SECONDS [MARKER_FILE]

Counting from ``HETFLOW_LAUNCHED_AT`` (the decision's wall time) rather than from its own start
makes its run time what the simulator assumes (work seconds at 1.0/s from the decision), so
process start-up does not reorder finishes. Appends ``<job id> <attempt>`` to MARKER_FILE when
it starts, so a test can count how often each job really ran.
"""

import os
import sys
import time

seconds = float(sys.argv[1])
launched = float(os.environ.get("HETFLOW_LAUNCHED_AT", time.time()))
job, attempt = os.environ.get("HETFLOW_JOB_ID", "?"), os.environ.get("HETFLOW_ATTEMPT", "?")
if len(sys.argv) > 2:
    with open(sys.argv[2], "a") as f:
        f.write(f"{job} {attempt}\n")
print(f"job {job} attempt {attempt} on {os.environ.get('HETFLOW_DEVICES')} "
      f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
time.sleep(max(0.0, launched + seconds - time.time()))
print(f"job {job} done", flush=True)
