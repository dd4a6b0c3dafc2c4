"""The terminal of a job that `trace run` started in a process group of its own.

Why: the launcher puts the job in its own process group (to signal and reap the whole tree). Typed at a shell
prompt, that group is a *background* group of the terminal, so a rank that reads it (``breakpoint()``, ``input()``,
pdb) is stopped by SIGTTIN and would wait forever — which the same job started from the shell never does. So the
launcher does for the job what a shell does for a foreground job:

* the job is stopped by SIGTTIN/SIGTTOU while `trace run` holds the terminal: hand it the terminal, continue it;
* Ctrl-Z then stops the job, not `trace run`: take the terminal back (with our terminal modes) and stop ourselves,
  so the shell sees its job suspended; on ``fg``, hand the terminal (with the job's modes) back and continue the
  job; on ``bg``, continue the job in the background;
* at the end, the terminal (and our modes) come back to `trace run`, for its report and the shell after it.

Never when `trace run` itself is in the background (it does not own the terminal then), and never for a stop by
anyone else (SIGSTOP): the job stays as it would be without ranktrace.
"""
from __future__ import annotations

import os
import signal
import termios
from typing import Any, Callable

__all__ = ["JobTerminal", "controlling_tty", "give_terminal"]


def controlling_tty() -> int | None:
    """fd 0 when it is our session's terminal (whether or not we are its foreground group right now: `trace run &`
    may be brought to the foreground later). None under nohup (stdin /dev/null) or setsid (no controlling tty)."""
    try:
        if not os.isatty(0):
            return None
        os.tcgetpgrp(0)  # ENOTTY when it is not our controlling terminal
        return 0
    except OSError:
        return None


def give_terminal(fd: int, pgid: int) -> None:
    """Make `pgid` the terminal's foreground group. SIGTTOU is ignored meanwhile: a background caller (our own
    group, once the job has the terminal) would otherwise be stopped by tcsetpgrp itself."""
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    finally:
        signal.signal(signal.SIGTTOU, old)


class JobTerminal:
    """Hands the terminal `fd` to the job's process group when it needs it (see the module docstring)."""

    def __init__(self, fd: int | None, pgid: int, send: Callable[[int], None], log: Callable[[str], None],
                 on_first_handover: Callable[[], None]) -> None:
        self.fd, self.pgid = fd, pgid
        self.send, self.log, self.on_first = send, log, on_first_handover
        self.handed = False
        self._ours: list[Any] | None = None   # our terminal modes, taken at the first hand-over
        self._prev_ttou: Any = None

    def _held_by(self, pgid: int) -> bool:
        try:
            return self.fd is not None and os.tcgetpgrp(self.fd) == pgid
        except OSError:
            return False

    def _foreground(self) -> bool:
        return self._held_by(os.getpgrp())

    def on_stop(self, sig: int) -> None:
        """The job's process was stopped by `sig` (tracer.launcher's wait loop saw it)."""
        if self.fd is None:
            return
        if sig in (signal.SIGTTIN, signal.SIGTTOU):
            if self._foreground():
                self._hand_over()
        elif sig == signal.SIGTSTP and self.handed:
            self._suspend()

    def on_tick(self) -> None:
        """The terminal came back to us while the job should have it: the shell resumed us with ``fg``."""
        if self.handed and self._foreground():
            self._hand_over()

    def restore(self) -> None:
        """The job is over: the terminal and our modes are ours again — if the job still has it (after Ctrl-Z and
        `bg` the shell has it, and must keep it)."""
        if not self.handed:
            return
        if self._held_by(self.pgid):
            self._take_back()
        signal.signal(signal.SIGTTOU, self._prev_ttou if self._prev_ttou is not None else signal.SIG_DFL)

    # --- internals ------------------------------------------------------------------------------------------
    def _hand_over(self) -> None:
        assert self.fd is not None
        if not self.handed:
            try:
                self._ours = termios.tcgetattr(self.fd)
            except termios.error:
                self._ours = None
        try:
            give_terminal(self.fd, self.pgid)
        except OSError as e:
            self.log(f"the job stopped to read the terminal, which could not be handed to it: {e}")
            return
        first = not self.handed
        if first:
            self.handed = True
            # our own lines now come from the background: never stopped for them, even under `stty tostop`
            self._prev_ttou = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            self.on_first()
        # Continue the job *before* saying so: a Ctrl-Z typed after the line must find it running. Sent while it
        # was still stopped, SIGTSTP would be pending, and this SIGCONT would discard it (signal(7)): the job
        # would go on reading and the person's Ctrl-Z would be lost.
        self.send(signal.SIGCONT)
        if first:
            self.log("the job reads the terminal: it has it now (Ctrl-C goes to the job directly; hang detection "
                     "paused)")

    def _take_back(self) -> None:
        assert self.fd is not None
        try:
            give_terminal(self.fd, os.getpgrp())
        except OSError:
            pass
        if self._ours is not None:
            try:
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self._ours)
            except termios.error:
                pass

    def _suspend(self) -> None:
        """Ctrl-Z stopped the job: the shell must see *its* job (our process group: us, and a `| tee` beside us)
        stopped and get the terminal back. SIGTSTP to our group, not SIGSTOP to ourselves: when no job-control
        shell is above us (tmux/ssh/docker exec straight into `trace run`) our group is orphaned and the kernel
        drops it — as it drops Ctrl-Z for the same job started without ranktrace — and the job just goes on."""
        assert self.fd is not None
        if not self._held_by(self.pgid):
            return  # not from the terminal the job holds (a `kill -TSTP` while we are in the background)
        try:
            job_modes: list[Any] | None = termios.tcgetattr(self.fd)
        except termios.error:
            job_modes = None
        self._take_back()
        os.killpg(os.getpgrp(), signal.SIGTSTP)
        # continued (or never stopped): by `fg` (the shell gave us the terminal) or by `bg`
        if self._foreground():
            if job_modes is not None:
                try:
                    termios.tcsetattr(self.fd, termios.TCSADRAIN, job_modes)
                except termios.error:
                    pass
            try:
                give_terminal(self.fd, self.pgid)
            except OSError:
                pass
        self.send(signal.SIGCONT)
