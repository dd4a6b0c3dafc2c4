"""Says which of fds 0-2 this process was started with, before it opens anything (an open would take the lowest
free number). Writes 'fd kind' lines into the file named by argv[1]."""
import os
import stat
import sys

seen = []
for fd in (0, 1, 2):
    try:
        mode = os.fstat(fd).st_mode
        seen.append(f"{fd} {'fifo' if stat.S_ISFIFO(mode) else 'chr' if stat.S_ISCHR(mode) else 'reg' if stat.S_ISREG(mode) else 'other'}")
    except OSError:
        seen.append(f"{fd} closed")
with open(sys.argv[1], "w") as out:
    out.write("\n".join(seen) + "\n")
