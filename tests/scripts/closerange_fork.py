"""A traced process that closes every fd (a daemonizing pattern), opens its own file on the number the in-rank
agent's socket had, then forks: the child must still write to that file (issue #31: the agent's at-fork close
closed the job's file, EBADF in the child). Prints 'child wrote' and exits 0 when the file got the child's line."""
import os
import sys

import socket
import time

import torch.distributed as dist

with socket.socket() as s:  # a free port for a world of one
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)  # a ring, an agent
dist.destroy_process_group()  # gloo's own sockets are closed: what closerange closes below is the agent's alone
pid = os.getpid()
time.sleep(0.5)
inode = None
with open("/proc/net/unix") as f:
    for line in f:
        parts = line.split()
        if len(parts) >= 8 and parts[-1].endswith(f"/{pid}.sock"):
            inode = parts[6]
if inode is None:
    print("no agent socket: nothing to check")
    sys.exit(3)
fd_of_socket = next(int(fd) for fd in os.listdir("/proc/self/fd")
                    if os.readlink(f"/proc/self/fd/{fd}") == f"socket:[{inode}]")
path = sys.argv[1]
os.closerange(3, 65536)
opened = []
while True:  # the lowest free number comes first: open until the socket's old number is the job's file
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if fd == fd_of_socket:
        break
    opened.append(fd)
child = os.fork()
if child == 0:
    try:
        os.write(fd, b"child wrote\n")
        os._exit(0)
    except OSError as e:
        os.write(2, f"child: {e}\n".encode())
        os._exit(1)
_, status = os.waitpid(child, 0)
print("child wrote" if os.waitstatus_to_exitcode(status) == 0 else "child failed")
sys.exit(os.waitstatus_to_exitcode(status))
