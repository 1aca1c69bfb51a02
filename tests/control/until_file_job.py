"""A test job that runs until the test says so: it exits 0 once FILE exists.

    python until_file_job.py FILE [MARKER_FILE]

So a test decides when a job ends (after something it waits for happened), instead of guessing
a duration that races the machine's speed. Appends ``<job id> <attempt>`` to MARKER_FILE when
it starts, so a test can count how often each job really ran.
"""

import os
import sys
import time

path = sys.argv[1]
job, attempt = os.environ.get("HETFLOW_JOB_ID", "?"), os.environ.get("HETFLOW_ATTEMPT", "?")
if len(sys.argv) > 2:
    with open(sys.argv[2], "a") as f:
        f.write(f"{job} {attempt}\n")
while not os.path.exists(path):
    time.sleep(0.05)
print(f"job {job}: {path} exists; done", flush=True)
