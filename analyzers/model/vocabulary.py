"""Names the frameworks use, known apart from any file: what a reader recognises in text and a rule recognises in
an observation say it once, here (the readers and the rules both import this; it imports nothing)."""
from __future__ import annotations

__all__ = ["CAPTURE_ERROR"]

#: the CUDA runtime's stream-capture errors: the failure happened inside CUDA graph capture (a regex)
CAPTURE_ERROR = (r"cudaErrorStreamCapture(?:Unsupported|Invalidated|Merge|Unmatched|Unjoined|Isolation|Implicit|"
                 r"WrongThread)|operation not permitted when stream is capturing|"
                 r"operation failed due to a previous error during capture")
