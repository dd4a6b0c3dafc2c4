"""Progress lines: tqdm bars and step / epoch / iteration counters, as training and serving logs print them (the
spellings are listed above the patterns)."""
from __future__ import annotations

import re

__all__ = ["CATALOGUE", "TQDM", "COUNTER", "END", "what_of_label", "count_value"]

# * tqdm (``datasets``, ``transformers``, vLLM, SGLang): ``<label>: <pct>%|<bar>| <n>/<total> [<elapsed><<left>, ...]``
#   (``Running tokenizer on dataset:   9%|▉  | 280000/2969526 [29:55<4:48:08, 149.80 examples/s]``,
#   ``Loading checkpoint shards:  50%|█████     | 1/2 [00:05<00:05,  5.2s/it]``, ``Capturing batches (bs=64
#   avail_mem=12.1 GB):  40%|████      | 21/52 [...]``), also without the bar (``Train Epoch #80:  29% 366/1252 [...``)
#   and with ``k``/``M`` counts; a terminal keeps only the last ``\r`` update of a line (the opener does the same);
# * counters: ``step 120/1000``, ``Step: 49``, ``[step 20999]``, ``step 177,`` (RETURNN),
#   ``iteration      100/  500000 |`` (Megatron), ``Epoch 3/10``, ``global_step=120`` — never ``step: 2(factor)``
#   (nccl-tests' header).
#
# Anchored or literal-led and bounded (linear in the line).

CATALOGUE: tuple[str, ...] = (
    r".{0,300}?\d{1,3}%\s{0,2}\|.{0,400}?\|\s{0,4}\d{1,12}(?:\.\d{1,3})?[kKMG]?/\d",
    r".{0,300}?\d{1,3}%\s{0,2}Completed\s{0,2}\|\s{0,4}\d{1,12}/\d",
    r".{0,200}?(?:[Tt]raining (?:is )?(?:completed|finished|complete|done)\b|[Ff]inished training\b|"
    r"[Pp]rocess group (?:destroyed|has NOT been destroyed before))",
    r".{0,300}?:\s{1,8}\d{1,3}%\s{1,4}\d{1,12}/\d{1,12}\s{1,4}\[\d",
    r".{0,200}?(?:^|[\s,\[|])(?:global_)?(?:[Ss]tep|[Ii]teration|[Ee]poch)\s{0,4}[:=#]?\s{0,8}\d{1,9}(?![\d(])",
)

TQDM = re.compile(r"(?:(?P<label>[^|%]{1,200}?)\s{0,2}:)?\s{0,8}(?P<pct>\d{1,3})%\s{0,2}"
                  r"(?:Completed\s{0,2}\|\s{0,4}|\|[^|]{0,400}\|)?\s{0,4}"
                  r"(?P<done>\d{1,12}(?:\.\d{1,3})?[kKMG]?)/(?P<total>\d{1,12}(?:\.\d{1,3})?[kKMG]?)")
COUNTER = re.compile(r"(?:^|[\s,\[|])(?P<g>global_)?(?P<what>[Ss]tep|STEP|[Ii]ter(?:ation)?|[Ee]poch)\s{0,4}[:=#]?"
                     r"\s{0,8}(?P<n>\d{1,9})(?![\d(])(?:\s{0,2}/\s{0,8}(?P<total>\d{1,9}))?")
#: a job saying it ended normally: the training loop's own last words, or torch's warning printed when a process
#: exits without destroy_process_group (it exits: the interpreter is shutting down normally)
END = re.compile(r"(?P<train>[Tt]raining (?:is )?(?:completed|finished|complete|done)\b|[Ff]inished training\b)|"
                 r"(?P<pg>[Pp]rocess group (?:destroyed|has NOT been destroyed before))")
_LABEL_WORDS = ((re.compile(r"tokeni[sz]", re.I), "tokenizer"),
                (re.compile(r"checkpoint shards|Loading (?:safetensors|weights|model|pt checkpoint)", re.I), "load"),
                (re.compile(r"Capturing", re.I), "cuda_graph_capture"),
                (re.compile(r"Processed prompts", re.I), "prompts"),
                (re.compile(r"^(?:Map|Filter|Grouping texts)", re.I), "dataset_map"))
_NOT_WORD = re.compile(r"[^a-z]+")


def what_of_label(label: str | None) -> str:
    """A short name for what a bar counts (``Running tokenizer on dataset`` → ``tokenizer``).

    >>> what_of_label("Running tokenizer on dataset"), what_of_label("Train Epoch     #80"), what_of_label(None)
    ('tokenizer', 'train_epoch', 'bar')
    """
    if not label or not label.strip():
        return "bar"
    label = re.sub(r"\([^)]{0,200}\)", "", label).strip()
    for rx, name in _LABEL_WORDS:
        if rx.search(label):
            return name
    return _NOT_WORD.sub("_", label.lower()).strip("_")[:40] or "bar"


def count_value(text: str) -> int:
    """``280000`` → 280000, ``1.5k`` → 1500, ``2M`` → 2000000."""
    mult = {"k": 1_000, "K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("kKMG") or 0) * mult)
