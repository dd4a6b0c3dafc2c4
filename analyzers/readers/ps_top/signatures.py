"""The process listings people paste next to a hung job, and how their lines look (listed above the patterns)."""
from __future__ import annotations

import re

__all__ = ["CATALOGUE", "PS_HEADER", "AUX_ROW", "EF_ROW", "TOP_ROW", "FOREST_ROW", "PSTREE_NODE", "SMI_ROW", "SMI_PLAIN_HEADER",
           "SMI_PLAIN_ROW", "TREE_MARKS", "COMMAND_COLUMNS", "PID_COLUMNS", "PPID_COLUMNS", "STATE_COLUMNS",
           "CPU_COLUMNS"]

# * ``ps aux`` / ``ps -ef`` / ``ps -eo <columns>`` / ``ps -ef --forest`` / ``ps axjf``: a header naming the columns
#   (``USER PID %CPU %MEM VSZ RSS TTY STAT START TIME COMMAND``, ``UID PID PPID C STIME TTY TIME CMD``, any ``-o``
#   list), then one row per process; the command is the last column and may hold spaces and ``\_`` tree marks.
#   ``ps aux`` rows pasted without their header are recognised by their shape.
# * ``top`` / ``htop`` copies: ``PID USER PR NI VIRT RES SHR S %CPU %MEM TIME+ COMMAND`` (htop: ``PRI``, ``CPU%``,
#   ``MEM%``, ``Command``).
# * a forest without a header (``ps -o pid,args --forest`` as pasted): ``   6429  \_ python3.11``; ``pstree -p``:
#   ``python(1234)─┬─python(1235)`` (ASCII ``-+-`` / ``|-`` too).
# * nvidia-smi's process table: ``|    0   N/A  N/A    12345      C   python   1234MiB |`` (470+, with GI/CI),
#   ``|    0     12345      C   python   1234MiB |`` (older), and the plain ``GPU  PID  Process name  GPU Memory``
#   listing some tools print.
#
# State (``STAT`` / ``S``): R running, S sleeping, D uninterruptible (often a GPU driver call), T stopped,
# Z zombie (``<defunct>``), I idle kernel thread; the letters after the first (``l``, ``+``, ``s``, ``<``) are flags.
# Anchored, bounded patterns (linear in the line).

CATALOGUE: tuple[str, ...] = (
    r"\s{0,8}(?:USER|UID)\s{1,16}PID\s",
    r"\s{0,8}PID\s{1,16}(?:PPID|USER|TTY|STAT|S|%CPU|PR|PRI|CMD|COMMAND|ARGS|TIME)\s",
    r"\s{0,8}PID\s{1,16}(?:CMD|COMMAND|ARGS|COMM)\s*$",
    r"\s{0,8}\S{1,32}\s{1,16}\d{1,9}\s{1,8}\d{1,3}\.\d\s{1,8}\d{1,3}\.\d\s{1,8}\d{1,12}\s{1,8}\d{1,12}\s{1,8}\S{1,12}"
    r"\s{1,8}[DRSTtWXZI][<NLsl+]{0,5}\s",
    r"\s{0,8}\S{1,32}\s{1,16}\d{1,9}\s{1,16}\d{1,9}\s{1,8}\d{1,3}\s{1,8}\S{1,12}\s{1,8}\S{1,12}\s{1,8}"
    r"(?:\d{1,4}-)?\d{1,3}:\d\d:\d\d\s{1,8}\S",
    r"\s{0,12}\d{1,9}\s{1,40}(?:[|`]\s{1,8}){0,30}\\_ \S",
    r".{0,80}?[\w.:-]{1,64}\(\d{1,9}\)(?:─|-[-+]-)",
    r"\|\s{1,8}\d{1,3}\s{1,8}(?:N/A|\d{1,4})\s{1,8}(?:N/A|\d{1,4})\s{1,8}\d{1,9}\s{1,8}(?:C\+G|G\+C|M\+C|C|G|M)\s",
    r"\|\s{1,8}\d{1,3}\s{1,12}\d{1,9}\s{1,8}(?:C\+G|G\+C|C|G)\s{1,8}\S",
    r"\s{0,8}GPU\s{1,8}PID\s{1,8}(?:Type\s{1,8})?Process name",
)

#: header token (as ps/top/htop print it) → what the column holds
COMMAND_COLUMNS = frozenset({"CMD", "COMMAND", "ARGS", "COMM", "Command", "UCOMM", "UCMD"})
PID_COLUMNS = frozenset({"PID"})
PPID_COLUMNS = frozenset({"PPID"})
STATE_COLUMNS = frozenset({"STAT", "S", "STATE"})
CPU_COLUMNS = frozenset({"%CPU", "CPU%", "C", "PCPU", "CPU"})

PS_HEADER = re.compile(r"\s{0,8}(?:[A-Z%+][A-Z%+_:0-9a-z]{0,16}\s{1,24}){1,24}[A-Z%+][A-Za-z%+_:0-9]{0,16}\s*$")
#: ``ps aux`` row without its header
AUX_ROW = re.compile(r"\s{0,8}(?P<user>\S{1,32})\s{1,16}(?P<pid>\d{1,9})\s{1,8}(?P<cpu>\d{1,4}\.\d)\s{1,8}\d{1,3}\.\d"
                     r"\s{1,8}\d{1,12}\s{1,8}\d{1,12}\s{1,8}\S{1,12}\s{1,8}(?P<stat>[DRSTtWXZI][<NLsl+]{0,5})"
                     r"\s{1,8}\S{1,12}\s{1,8}\S{1,12}\s{1,8}(?P<cmd>\S.{0,4000})")
#: ``ps -ef`` row without its header: UID PID PPID C STIME TTY TIME CMD
EF_ROW = re.compile(r"\s{0,8}(?P<user>\S{1,32})\s{1,16}(?P<pid>\d{1,9})\s{1,16}(?P<ppid>\d{1,9})\s{1,8}(?P<cpu>\d{1,3})"
                    r"\s{1,8}\S{1,12}\s{1,8}\S{1,12}\s{1,8}(?:\d{1,4}-)?\d{1,3}:\d\d:\d\d\s{1,8}(?P<cmd>\S.{0,4000})")
#: ``top`` row without its header: PID USER PR NI VIRT RES SHR S %CPU %MEM TIME+ COMMAND
TOP_ROW = re.compile(r"\s{0,8}(?P<pid>\d{1,9})\s{1,8}(?P<user>\S{1,32})\s{1,8}(?:-?\d{1,3}|rt)\s{1,8}-?\d{1,3}"
                     r"\s{1,8}\S{1,12}\s{1,8}\S{1,12}\s{1,8}\S{1,12}\s{1,8}(?P<stat>[DRSTtWXZI])\s{1,8}"
                     r"(?P<cpu>\d{1,5}(?:\.\d)?)\s{1,8}\d{1,3}(?:\.\d)?\s{1,8}\S{1,16}\s{1,8}(?P<cmd>\S.{0,4000})")
#: ``   6429  \\_ python3.11`` / ``   6420 slurm_script`` inside a forest paste
FOREST_ROW = re.compile(r"\s{0,12}(?P<pid>\d{1,9})\s{1,40}(?P<tree>(?:[|`]\s{1,8}|\\_ ){0,40})(?P<cmd>\S.{0,4000})")
#: one ``name(pid)`` node of ``pstree -p`` (searched with finditer)
PSTREE_NODE = re.compile(r"(?P<name>[\w.:@/-]{1,64})\((?P<pid>\d{1,9})\)")
SMI_ROW = re.compile(r"\|\s{1,8}(?P<gpu>\d{1,3})\s{1,12}(?:(?:N/A|\d{1,4})\s{1,8}(?:N/A|\d{1,4})\s{1,8})?"
                     r"(?P<pid>\d{1,9})\s{1,8}(?P<type>C\+G|G\+C|M\+C|C|G|M)\s{1,8}(?P<name>\S.{0,300}?)\s{1,60}"
                     r"(?P<mem>\d{1,9}MiB|N/A)\s{0,8}\|")
SMI_PLAIN_HEADER = re.compile(r"\s{0,8}GPU\s{1,8}PID\s{1,8}(?:Type\s{1,8})?Process name")
SMI_PLAIN_ROW = re.compile(r"\s{0,8}(?P<gpu>\d{1,3})\s{1,8}(?P<pid>\d{1,9})\s{1,8}(?:(?P<type>C\+G|C|G)\s{1,8})?"
                           r"(?P<name>\S{1,300})\s{1,60}(?P<mem>\d{1,9})\s?MiB\s*$")
#: ``\\_``, ``|`` forest marks in front of a command
TREE_MARKS = re.compile(r"(?:[|`]\s{1,8}|\\_ ){1,40}")
