"""A tiny job program: prints ``line 1`` .. ``line N`` every ``DELAY`` seconds, then exits with ``CODE``.

    python count_job.py N DELAY CODE
"""

import sys
import time

count, delay, code = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
for i in range(1, count + 1):
    print(f"line {i}", flush=True)
    time.sleep(delay)
sys.exit(code)
