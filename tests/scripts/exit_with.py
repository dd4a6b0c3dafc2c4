"""Exit with the status (or the signal) given: `exit_with.py 7` or `exit_with.py -9` (no torch: cheap)."""
import os
import signal
import sys
import time

code = int(sys.argv[1])
print("exit_with running", flush=True)
if code < 0:
    os.kill(os.getpid(), -code)
    time.sleep(5)
sys.exit(code)
