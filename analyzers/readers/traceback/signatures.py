"""Line patterns of Python tracebacks and of the C++ backtraces torch attaches to its exceptions, and the catalogue
signature that marks them (the shapes are drawn above the patterns)."""
from __future__ import annotations

import re

__all__ = ["SIGNATURE", "HEADER", "FRAME", "CHAIN", "SPAWN", "THREAD", "EXC", "IGNORED", "CPP_HEADER", "CPP_FRAME",
           "CPP_FRAME_TORN", "SEGV",
           "RICH_HEADER", "RICH_BOX", "RICH_LOC", "RICH_IN", "RICH_CURRENT"]

# Python (3.6 – 3.13)::
#
#     Traceback (most recent call last):                       (may follow text: "Scheduler hit an exception: ")
#       File "/x/train.py", line 12, in main                   (loguru: "  > File ...")
#         dist.all_reduce(t)                                   (3.11+: a "    ^^^^^" line may follow)
#     RuntimeError: message                                    (the last line; no colon for KeyboardInterrupt)
#     During handling of the above exception, another exception occurred:       (chained)
#     The above exception was the direct cause of the following exception:
#     -- Process 3 terminated with the following error:        (torch.multiprocessing.spawn, then a traceback)
#     Exception in thread Thread-1:                            (threading, before the header)
#
# C++ (c10::Error's backtrace)::
#
#     Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:525 (most recent ...
#     frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x57 (0x7f32 in /x/torch/lib/libc10.so)
#     frame #4: <unknown function> + 0xe6793 (0x7f32 in /lib/x86_64-linux-gnu/libstdc++.so.6)
#
# rich's box-drawn traceback (``rich.traceback``, installed by accelerate / typer / many CLIs); a frame's location may
# wrap onto the next box line (``│ in wait_for_everyone │``), the current line is marked ``❱``::
#
#     ╭───────────────────── Traceback (most recent call last) ──────────────────────╮
#     │ /x/accelerate/utils/other.py:81 in wait_for_everyone                         │
#     │    80 │   ):                                                                 │
#     │ ❱  81 │   │   torch.distributed.barrier()                                    │
#     ╰──────────────────────────────────────────────────────────────────────────────╯
#     RuntimeError: message
#
# Faulthandler's ``File "x", line 12 in f`` (no comma) is another family's. Every pattern is linear: anchored or
# literal-led, bounded repetitions, no nested quantifiers.

_STAMP = r"(?:[A-Z][a-z]{2} {1,2}\d{1,2} \d\d:\d\d:\d\d |\d{4}-\d\d-\d\dT[\d:.]{8,20}Z |\s{0,4}E {2,})?"
# Frame lines mark a traceback (a header without frames holds nothing to read): both kinds are anchored, so the
# walk over a long log stays cheap.
SIGNATURE = "|".join((
    r"\s{0,40}│ ❱ {0,4}\d{1,7} │",
    r"\s{0,40}╭─{1,200} ?Traceback \(most recent call last\) ?─",
    rf"{_STAMP}\s{{0,40}}(?:> )?File \"[^\"\n]{{1,1000}}\", line \d{{1,7}}, in ",
    rf"{_STAMP}\s{{0,8}}frame #\d{{1,5}}: \S",
))

HEADER = re.compile(r"Traceback \(most recent call last\):\s*$")
FRAME = re.compile(r"^(?P<ind>\s{0,80})(?:> )?File \"(?P<file>[^\"\n]{1,2000})\", line (?P<line>\d{1,7}), in "
                   r"(?P<func>\S.{0,400}?)\s*$")
RICH_HEADER = re.compile(r"^\s{0,40}╭─{1,200} ?Traceback \(most recent call last\) ?─{1,200}╮?\s*$")
#: the inside of one box line: ``│ <inner> │`` (the right border may be cut by a narrow paste)
RICH_BOX = re.compile(r"^\s{0,40}│ ?(?P<inner>.{0,2000}?) ?(?:│\s*)?$")
RICH_LOC = re.compile(r"^(?P<file>[^\s│]{1,1000}?\.py[cw]?):(?P<line>\d{1,7})(?: {1,4}in (?P<func>[^\s│]{1,400}))?$")
RICH_IN = re.compile(r"^in (?P<func>[^\s│]{1,400})$")
RICH_CURRENT = re.compile(r"^❱ {0,4}\d{1,7} │ ?(?P<code>.{0,2000}?)$")
CHAIN = re.compile(r"^\s{0,8}(?:During handling of the above exception, another exception occurred|The above "
                   r"exception was the direct cause of the following exception):\s*$")
# torch's fatal-signal report (2.x): the native frames that follow are printed like Python frames, innermost first:
#   !!!!!!! Segfault encountered !!!!!!!
#     File "/libvgpu/src/allocator/allocator.c", line 44, in oom_check
#     File "<unknown>", line 0, in _PyEval_EvalFrameDefault
SEGV = re.compile(r"!{3,20} ?Segfault encountered ?!{3,20}")
SPAWN = re.compile(r"-- Process (?P<i>\d{1,6}) terminated with the following error:")
THREAD = re.compile(r"Exception in thread (?P<name>.{1,200}?):\s*$")
# the exception line: a (dotted) name, then ": message" or nothing
EXC = re.compile(r"^(?P<type>[A-Za-z_][\w.]{0,300}?)(?::(?P<msg>.{0,100000}))?\s*$")
# lines inside a traceback that are neither frames nor code: "[Previous line repeated 996 more times]", 3.13's
# "...<3 lines>..." (carets and loguru's annotation lines are recognised by their characters, see scan.ignored)
IGNORED = re.compile(r"^\s{0,200}(?:\[Previous line repeated \d{1,9} more times?\]|\.\.\.<\d{1,9} lines?>\.\.\.)\s*$")
CPP_HEADER = re.compile(r"Exception raised from (?P<func>\S{1,300}) at (?P<loc>\S{1,400}) \(most recent call "
                        r"first\):")
CPP_FRAME = re.compile(r"^\s{0,8}frame #(?P<n>\d{1,5}): (?P<sym>.{1,3000}?)(?: \+ 0x[0-9a-fA-F]{1,16})? "
                       r"\((?:0x[0-9a-fA-F]{1,16} in )?(?P<lib>[^()]{1,500})\)\s*$")
# a frame line cut before its library: "frame #10: c10d::ProcessGroupNCCL::getNCCLComm(...) + 0xfbd (0x7fdf in /x/lib"
CPP_FRAME_TORN = re.compile(r"^\s{0,8}frame #(?P<n>\d{1,5}): (?P<sym>[^\n]{1,3000}?)"
                            r"(?: \+ 0x[0-9a-fA-F]{1,16}| \(0x|\s*$)")
