"""How general the readers are: the field cases right from their files alone, re-posted the ways people's tools
post logs, and how many stay right (bench/field_score.py's judge).

Each style rewrites every text file of a case (binary files are copied as they are):

* ``crlf``, ``ansi`` (colour codes), ``fence`` (a Markdown fence), ``tabs`` (4 spaces -> a tab);
* ``quote`` (``> `` on every line: an e-mail reply, a quoted ticket), ``indent`` (a Markdown code block);
* ``stamp`` (Python logging's ``2024-05-01 12:00:00,123 INFO ``), ``k8s`` (``kubectl logs --prefix``),
  ``journald`` (``May 01 12:00:00 node python[42]: ``), ``ts`` (moreutils' ``May 01 12:00:00 ``),
  ``srun`` (one ``0: `` task in front of everything), ``compose`` (``trainer-1  | ``);
* ``terminal`` (copied out of tmux: lines cut at 150 columns and padded with spaces to them);
* ``cut`` (the first and last two lines gone), ``tail`` (the last 20 lines only).

A style that prefixes every physical line also prefixes the second half of a line a terminal wrapped, which a real
terminal never does: the few hard-wrapped cases that fail under every prefixing style fail for that reason.

Usage: ``python bench/posting_styles.py [STYLE,STYLE...]`` (all by default). Prints, per style, right/base and the
cases that changed with what was said.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import field_score  # noqa: E402

from ranktrace.analyzers import api  # noqa: E402


def _each(prefix: Callable[[int], str]) -> Callable[[str], str]:
    return lambda t: "\n".join(prefix(i) + ln if ln.strip() else ln for i, ln in enumerate(t.split("\n")))


def _terminal(t: str, width: int = 150) -> str:
    """Copied out of tmux / screen: every line cut at the terminal's width and padded with spaces to it."""
    out = []
    for ln in t.split("\n"):
        parts = [ln[i:i + width] for i in range(0, len(ln), width)] or [""]
        out += [p.ljust(width) for p in parts]
    return "\n".join(out)


def _cut(t: str) -> str:
    lines = t.split("\n")
    return "\n".join(lines[2:-2]) if len(lines) > 12 else t


STYLES: dict[str, Callable[[str], str]] = {
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "ansi": lambda t: "\n".join(f"\x1b[31m{ln}\x1b[0m" if ln.strip() else ln for ln in t.split("\n")),
    "fence": lambda t: "```\n" + t + "\n```\n",
    "tabs": lambda t: t.replace("    ", "\t"),
    "quote": lambda t: "\n".join("> " + ln for ln in t.split("\n")),
    "indent": _each(lambda i: "    "),
    "stamp": _each(lambda i: f"2024-05-01 12:00:{i % 60:02d},123 INFO "),
    "k8s": _each(lambda i: "[pod/train-0/main] "),
    "journald": _each(lambda i: f"May 01 12:00:{i % 60:02d} gpu-node-3 python[4242]: "),
    "ts": _each(lambda i: f"Dec 01 12:00:{i % 60:02d} "),
    "srun": lambda t: "\n".join("0: " + ln for ln in t.split("\n")),
    "compose": lambda t: "\n".join("trainer-1  | " + ln for ln in t.split("\n")),
    "terminal": _terminal,
    "cut": _cut,
    "tail": lambda t: "\n".join(t.rstrip("\n").split("\n")[-20:]) + "\n",
}


def judged(case: dict, style: str | None, tmp: Path) -> tuple[bool, str, dict]:
    out = tmp / case["id"]
    shutil.rmtree(out, ignore_errors=True)
    files = []
    for f in case["files"]:
        src, dst = case["dir"] / f, out / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = src.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            shutil.copy(src, dst)
        else:
            dst.write_text(STYLES[style](text) if style else text, encoding="utf-8")
        files.append(dst)
    try:
        v = api.analyze(files, liveness=None).verdict.to_dict()
    except Exception as e:  # a crash is a wrong answer, never a crashed bench
        v = {"status": "error", "kind": f"{type(e).__name__}: {e}"}
    ok, why = field_score.judge(case["truth"], v)
    return bool(ok), why, v


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    styles = args[0].split(",") if args else list(STYLES)
    unknown = [s for s in styles if s not in STYLES]
    if unknown:
        print(f"unknown style(s) {unknown}; known: {', '.join(STYLES)}", file=sys.stderr)
        return 2
    cases = [c for c in field_score.load_cases() if c.get("files_alone")]
    tmp = Path(tempfile.mkdtemp(prefix="posting_styles_"))
    try:
        good = [c for c in cases if judged(c, None, tmp)[0]]
        print(f"right from the files alone, as posted: {len(good)} of {len(cases)}")
        for style in styles:
            bad = []
            for c in good:
                ok, why, v = judged(c, style, tmp)
                if not ok:
                    bad.append(f"    {c['id']}: {why[:90]} (said {v.get('status')} {v.get('kind')})")
            print(f"{style}: {len(good) - len(bad)}/{len(good)}", *bad, sep="\n", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
