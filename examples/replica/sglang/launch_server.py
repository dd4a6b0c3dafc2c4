"""python -m sglang.launch_server --tp 4 [--fault ...]: the replica's server (a CPU stand-in, NOT SGLang).

As SGLang does: the main process spawns one scheduler process per TP rank (run_scheduler_process), each sets its
process title (sglang::scheduler_TP3) and log prefix ([time TP3]), initialises torch.distributed (gloo here) and its
TP GroupCoordinator with a pynccl-style communicator (a ctypes-style NCCLLibrary over a TCPStore) and a custom
all-reduce, loads "weights", allocates the KV cache, warms up kernels, captures CUDA graphs per batch size (the
custom all-reduce registers its graph buffers when capture ends), then the EAGLE draft worker captures its own; the
main process waits for every scheduler and logs "The server is fired up and ready to roll!". Faults
(sglang/srt/server_args.py) plant the hangs real servers have.
"""
import multiprocessing as mp
import sys

from sglang.srt.entrypoints.http_server import launch_server
from sglang.srt.server_args import prepare_server_args

if __name__ == "__main__":
    try:
        sys.exit(launch_server(prepare_server_args(sys.argv[1:])))
    finally:  # as SGLang's launch_server.py: kill_process_tree(os.getpid(), include_parent=False)
        for child in mp.active_children():
            child.kill()
