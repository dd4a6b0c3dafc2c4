"""Names the frameworks use, known apart from any file: what a reader recognises in text and a rule recognises in
an observation say it once, here (the readers and the rules both import this; it imports nothing)."""
from __future__ import annotations

__all__ = ["CAPTURE_ERROR", "CAPTURE_FAILED"]

#: the CUDA runtime's stream-capture errors: the failure happened inside CUDA graph capture (a regex)
CAPTURE_ERROR = (r"cudaErrorStreamCapture(?:Unsupported|Invalidated|Merge|Unmatched|Unjoined|Isolation|Implicit|"
                 r"WrongThread)|operation not permitted when stream is capturing|"
                 r"operation failed due to a previous error during capture")
#: a framework's own message that its CUDA graph capture raised, whatever the cause inside it (a regex): SGLang's
#: cuda_graph_runner.py wraps every error of the capture in "Capture cuda graph failed: {e}" (0.3 ... 0.5); the
#: cause may be a CUDA error, a peer's gloo timeout or an OOM, so it is not one of CAPTURE_ERROR's forbidden calls
CAPTURE_FAILED = r"Capture (?:cuda|CUDA) graph failed(?:: |$)"
