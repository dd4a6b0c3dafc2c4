"""The shared text opener: every text input is opened once, its launcher prefixes peeled, and handed to each
family whose signatures it holds."""
from ranktrace.analyzers.readers.text.opener import (MAX_LINE_CHARS, Line, TextDoc, canonical_prefix, open_text,
                                                   text_of_bytes)
from ranktrace.analyzers.readers.text.prefixes import LinePrefix, split_prefixes, strip_ansi

__all__ = ["Line", "TextDoc", "LinePrefix", "open_text", "text_of_bytes", "split_prefixes", "strip_ansi",
           "MAX_LINE_CHARS", "canonical_prefix"]
