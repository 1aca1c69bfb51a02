"""A test job that runs until the test says so: it exits 0 once FILE exists.

    python until_file_job.py FILE

So a test decides when a job ends (after something it waits for happened), instead of guessing
a duration that races the machine's speed.
"""

import os
import sys
import time

path = sys.argv[1]
while not os.path.exists(path):
    time.sleep(0.05)
print(f"job {os.environ.get('HETFLOW_JOB_ID', '?')}: {path} exists; done", flush=True)
