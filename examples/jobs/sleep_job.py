"""Stand-in for a real job: prints what it was given, works for N seconds, stops on SIGTERM.

A preemptible job would save its state to a checkpoint in its SIGTERM handler (or when the
file named by HETFLOW_STOP_FILE appears) and pick it up again when HETFLOW_RESTARTED is 1.
"""

import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
print(f"job {os.environ.get('HETFLOW_JOB_ID')} attempt {os.environ.get('HETFLOW_ATTEMPT')} "
      f"on {os.environ.get('HETFLOW_DEVICES')}", flush=True)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0)
print("done", flush=True)
