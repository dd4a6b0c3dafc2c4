"""Redact secrets from environments and command lines before anything is written.

Why: trace directories get attached to bug reports. A job's environment routinely holds HF_TOKEN, WANDB_API_KEY,
cloud keys, and launch lines carry ``--api-key``. We redact by *name* (TOKEN, KEY, SECRET, PASSWORD, CREDENTIAL,
AUTH) and by *shape* (values that look like tokens, ``user:pass@`` URLs), so a secret in an unexpected variable is
still caught. Runs inside ranks too, so stdlib only.

Known limit: a secret of no recognisable shape in an innocuously named variable is kept; the env subset written to
meta.json is curated (see tracer.envplan) to keep that surface small.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

__all__ = ["REDACTED", "secret_name", "redact_value", "redact_env", "redact_argv"]

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW(OR)?D|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?<![\w+.-])(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<user>[^:/@\s]+):(?P<pw>[^@/\s]+)@")
_TOKEN_SHAPES = [
    re.compile(r"\b(hf|ghp|gho|ghu|ghs|ghr|github_pat|glpat|xox[abpsr]|sk|pk|rk|sk-proj|AKIA|ASIA|AIza|ya29)[-_][A-Za-z0-9_\-]{12,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
]
# Long opaque strings: at least 32 chars of base64/hex alphabet mixing letters and digits, no path separators.
_OPAQUE = re.compile(
    r"(?<![\w/.+=-])(?=[A-Za-z0-9_\-+=]{32,}(?![\w/.-]))(?=[A-Za-z_\-+=]*\d)(?=[0-9_\-+=]*[A-Za-z])[A-Za-z0-9_\-+=]{32,}")
_SECRET_FLAG = re.compile(r"^--?[\w.-]*(token|key|secret|passw(or)?d|credential|auth)[\w.-]*$", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """True when a variable or option name says it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_value(value: str) -> str:
    """Replace secret-shaped parts of `value` (token shapes, URL passwords); keep the rest readable."""
    v = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", value)
    for pat in _TOKEN_SHAPES:
        v = pat.sub(REDACTED, v)
    return _OPAQUE.sub(REDACTED, v)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Copy of `env` with secret-named variables blanked and secret-shaped values redacted."""
    return {k: (REDACTED if secret_name(k) else redact_value(v)) for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Copy of a command line with values of secret-named options (``--token X``, ``--api-key=X``) redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if arg.startswith("-") and "=" in arg:
            flag, _, _val = arg.partition("=")
            if _SECRET_FLAG.match(flag):
                out.append(f"{flag}={REDACTED}")
                continue
        elif _SECRET_FLAG.match(arg):
            hide_next = True
            out.append(arg)
            continue
        elif "=" in arg and secret_name(arg.split("=", 1)[0]) and not arg.startswith("-"):
            out.append(f"{arg.split('=', 1)[0]}={REDACTED}")  # KEY=VALUE style arguments (env, torchrun)
            continue
        out.append(redact_value(arg))
    return out
