"""The main process: spawn the schedulers, wait until each says it is ready (or died), then serve."""
from __future__ import annotations

import logging
import multiprocessing as mp
import socket
import time

from sglang.srt.managers.scheduler import configure_logger, run_scheduler_process
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_server(server_args: ServerArgs) -> int:
    configure_logger("")
    logger.info(f"server_args=ServerArgs(tp_size={server_args.tp_size}, pp_size=1, fault={server_args.fault!r})")
    mp.set_start_method("spawn", force=True)
    if server_args.fault == "stale-jit-lock":  # an earlier start was killed while it built the JIT kernels
        import replica_jit

        logger.info(f"(fault) a killed start left the JIT build lock {replica_jit.plant_stale_lock()}")
    nccl_port = server_args.port or _free_port()
    procs, readers, senders = [], [], []
    for tp_rank in range(server_args.tp_size):
        reader, writer = mp.Pipe(duplex=False)
        requests, sender = mp.Pipe(duplex=False)
        port_args = {"nccl_port": nccl_port, "requests": requests}
        p = mp.Process(target=run_scheduler_process,
                       args=(server_args, port_args, tp_rank, tp_rank, 0, 0, 0, 0, None, writer))
        p.start()
        procs.append(p)
        readers.append(reader)
        senders.append(sender)
    ready = set()
    while len(ready) < len(procs):
        for rank, (p, r) in enumerate(zip(procs, readers)):
            if rank in ready:
                continue
            if r.poll(0.2):
                try:
                    r.recv()
                    ready.add(rank)
                except EOFError:
                    pass
            if rank not in ready and not p.is_alive():
                logger.error(f"Rank {rank} scheduler is dead. Please check if there are relevant logs.")
                for q in procs:
                    if q.is_alive():
                        q.kill()
                return 1
    logger.info("The server is fired up and ready to roll!")
    if server_args.exit_after_ready:
        for s in senders:
            s.send("shutdown")
        for p in procs:
            p.join(30)
        return 0
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:  # Ctrl-C: the schedulers got it too and leave their event loops (a SIGINT to this
        end = time.monotonic() + 5  # process alone leaves them to launch_server.py's kill, as in SGLang)
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        return 0
