"""A test job that holds its CPUs until the test lets it go.

    python hold_job.py RELEASE_FILE MAX_SECONDS

Ends as soon as RELEASE_FILE exists (the hosts share this machine's file system), or after
MAX_SECONDS at the latest. A fixed sleep would end on its own while a busy machine is slow to
reach the moment the test needs it still running.
"""

import os
import sys
import time

release, limit = sys.argv[1], float(sys.argv[2])
job = os.environ.get("HETFLOW_JOB_ID", "?")
print(f"job {job} holding until {release} exists", flush=True)
deadline = time.monotonic() + limit
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.5)
print(f"job {job} released" if os.path.exists(release) else f"job {job} done: {limit:g} s", flush=True)
