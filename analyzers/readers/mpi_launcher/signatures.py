"""What Open MPI's launcher (mpirun / mpiexec / prterun) says when a process of the job ends: killed by a signal,
the first to exit non-zero, MPI_ABORT. Texts of its help files (help-orterun.txt / help-prterun.txt, 3.x-5.x), as
printed in open-mpi/ompi#6379, horovod/horovod#469, #1421."""
from __future__ import annotations

import re

#: the launcher's name as it prints itself
_WHO = r"(?:mpirun|mpiexec|orterun|prterun|prte|mpiexec\.hydra)(?:\.real)?"

#: "mpirun noticed that process rank 7 with PID 0 on node HOSTNAME exited on signal 9 (Killed)."
NOTICED = re.compile(rf"\b{_WHO} noticed that process rank (?P<rank>\d{{1,7}}) with PID (?P<pid>\S{{1,20}}) on "
                     r"node (?P<node>\S{1,200}) exited on signal (?P<sig>\d{1,3})(?: \((?P<name>[^)]{1,40})\))?")
#: "mpirun has exited due to process rank 0 with PID 0 on\nnode X exiting improperly." (the rest wraps)
IMPROPER = re.compile(rf"\b{_WHO} has exited due to process rank (?P<rank>\d{{1,7}}) with PID (?P<pid>\S{{1,20}})")
#: "mpirun detected that one or more processes exited with non-zero status, thus causing" ... then, a few lines on,
#: "  Process name: [[29973,1],0]" and "  Exit code:    1"
DETECTED = re.compile(rf"\b{_WHO} detected that one or more processes exited with non-zero status")
PROCESS_NAME = re.compile(r"^\s*Process name:\s*\[\[\d{1,10},\d{1,6}\],(?P<rank>\d{1,7})\]")
EXIT_CODE = re.compile(r"^\s*Exit code:\s*(?P<code>-?\d{1,6})")
#: "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD\nwith errorcode 1." (errorcode on either line)
ABORT = re.compile(r"\bMPI_ABORT was invoked on rank (?P<rank>\d{1,7}) in communicator (?P<comm>\S{1,80})"
                   r"(?:\s+with errorcode (?P<code>-?\d{1,6}))?")
ERRORCODE = re.compile(r"^\s*with errorcode (?P<code>-?\d{1,6})")

#: the catalogue's line signatures (matched after a bounded lead: Open MPI's --tag-output puts "[1,7]<stderr>:" first)
CATALOGUE: tuple[str, ...] = (
    rf".{{0,300}}?\b{_WHO} noticed that process rank \d",
    rf".{{0,300}}?\b{_WHO} has exited due to process rank \d",
    rf".{{0,300}}?\b{_WHO} detected that one or more processes exited with non-zero status",
    r".{0,300}?\bMPI_ABORT was invoked on rank \d",
)
