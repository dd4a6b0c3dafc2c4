"""Redact secrets from environments and command lines before anything is written.

Why: trace directories get attached to bug reports. A job's environment routinely holds HF_TOKEN, WANDB_API_KEY,
cloud keys, and launch lines carry ``--api-key``. We redact by *name* (TOKEN, KEY, SECRET, PASSWORD, CREDENTIAL,
AUTH) and by *shape* (values that look like tokens, ``user:pass@`` URLs), so a secret in an unexpected variable is
still caught. Runs inside ranks too, so stdlib only.

Also inside values: ``name: value`` / ``name=value`` pairs whose name says secret (``conf={"api_key": "..."}``,
``{'password': ...}``, ``a=1,token=...``), ``Bearer <token>``, and the short password flag ``-p VALUE`` / ``-pVALUE``
(mysql, sshpass; a port such as ``-p 8080:80`` and a path such as ``mkdir -p /x`` are kept). Every pattern here runs
on user input, so each is linear (tests/test_regex_linear.py).

Known limit: a secret of no recognisable shape in an innocuously named variable is kept; the env subset written to
meta.json is curated (see tracer.envplan) to keep that surface small.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

__all__ = ["REDACTED", "secret_name", "redact_value", "redact_env", "redact_argv"]

REDACTED = "<redacted>"
# a name that says secret: the usual words, a passphrase, and PASS / PW / PWD as a word of the name (DB_PASS, --db-pw,
# MYSQL_PWD; not PWD itself, the working directory, and not PASSENGER or PASSTHROUGH)
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSW(OR)?D|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|"
                          r"(?:^|[_.-])(?:PASS|PW)(?:$|[_.-])|[_.-]PWD$", re.IGNORECASE)
# user:password@ in a URL; the password may hold a '/' (people write them unescaped), bounded so a long line with no
# '@' costs linear time
_URL_USERINFO = re.compile(r"(?<![\w+.-])(?P<scheme>[a-zA-Z][\w+.-]*://)(?P<user>[^:/@\s]{1,256}):(?P<pw>[^@\s]{1,256})@")
_TOKEN_SHAPES = [
    re.compile(r"\b(hf|ghp|gho|ghu|ghs|ghr|github_pat|glpat|xox[abpsr]|sk|pk|rk|sk-proj|AKIA|ASIA|AIza|ya29)[-_][A-Za-z0-9_\-]{12,}"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),  # JWT
]
# Long opaque strings: at least 32 chars of base64/hex alphabet mixing letters and digits, no path separators.
_OPAQUE = re.compile(
    r"(?<![\w/.+=-])(?=[A-Za-z0-9_\-+=]{32,}(?![\w/.-]))(?=[A-Za-z_\-+=]*\d)(?=[0-9_\-+=]*[A-Za-z])[A-Za-z0-9_\-+=]{32,}")
_SECRET_FLAG = re.compile(r"^--?[\w.-]*(token|key|secret|passw(or)?d|passphrase|credential|auth)[\w.-]*$|"
                          r"^--?([\w.-]*[_.-])?(pass|pw|pwd)$", re.IGNORECASE)
_SECRET_WORD = (r"[\w.-]{0,64}?(?:token|key|secret|passw(?:or)?d|passphrase|credential|auth|cookie|session|"
                r"(?<![a-z])pass(?![a-z]))[\w.-]{0,64}")
# An AWS secret access key given as a bare argument (`aws configure set aws_secret_access_key X` reads it from the
# position): exactly 40 characters of base64's alphabet mixing upper case, lower case and digits.
_AWS_SECRET = re.compile(r"(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[a-z])(?=[A-Za-z0-9/+]{0,39}\d)"
                         r"[A-Za-z0-9/+]{40}")
# name: value / name=value inside a value, the name optionally quoted (JSON, a dict repr, k=v lists); the value a
# quoted string or a bare run up to the next separator. The name is bounded and must start at a word boundary.
_PAIR = re.compile(
    r"(?<![\w.-])(?P<q>[\"']?)(?P<name>" + _SECRET_WORD + r")(?P=q)(?P<sep>\s{0,8}[:=]\s{0,8})"
    r"(?P<value>\"(?:[^\"\\\n]|\\.){0,4096}\"|'(?:[^'\\\n]|\\.){0,4096}'|(?:Bearer|Basic|Token)\s+[^\s,;&]{1,4096}|"
    r"[^\s\"',;&}\])]{1,4096})",
    re.IGNORECASE)
_BEARER = re.compile(r"\b(?P<scheme>Bearer|Basic|Token)\s+(?P<value>[A-Za-z0-9._~+/=-]{6,4096})")
_PORTISH = re.compile(r"[\d.:,/-]+|[/.~].*")     # -p 8080:80, -p 127.0.0.1:8080:80, mkdir -p ./dir


def secret_name(name: str) -> bool:
    """True when a variable or option name says it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_value(value: str) -> str:
    """Replace secret-shaped parts of `value` (token shapes, URL passwords, secret-named pairs inside it, bearer
    tokens); keep the rest readable."""
    v = _PAIR.sub(_pair_redacted, value)
    v = _BEARER.sub(lambda m: f"{m['scheme']} {REDACTED}", v)
    v = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", v)
    for pat in _TOKEN_SHAPES:
        v = pat.sub(REDACTED, v)
    return _OPAQUE.sub(REDACTED, v)


def _pair_redacted(m: "re.Match[str]") -> str:
    if m["name"].endswith(("Error", "Exception", "Warning")):  # "KeyError: 'x'" is an exception, not a key
        return m.group(0)
    value = m["value"]
    if value[:1] in ("'", '"'):
        shown = value[0] + REDACTED + value[0]
    elif value.split(None, 1)[0] in ("Bearer", "Basic", "Token"):
        shown = value.split(None, 1)[0] + " " + REDACTED
    else:
        shown = REDACTED
    return f"{m['q']}{m['name']}{m['q']}{m['sep']}{shown}"


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Copy of `env` with secret-named variables blanked and secret-shaped values redacted."""
    return {k: (REDACTED if secret_name(k) else redact_value(v)) for k, v in env.items()}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Copy of a command line with values of secret-named options (``--token X``, ``--api-key=X``) redacted."""
    out: list[str] = []
    hide_next = False
    short_p = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED if not (short_p and _PORTISH.fullmatch(arg)) else redact_value(arg))
            hide_next = short_p = False
            continue
        if arg == "-p":  # mysql -p PASSWORD, sshpass -p PASSWORD (a port or a path after -p is kept)
            hide_next = short_p = True
            out.append(arg)
            continue
        if arg.startswith("-p") and len(arg) > 2 and not arg.startswith("-p=") and arg[2] != "-" \
                and not _PORTISH.fullmatch(arg[2:]) and not arg[2:].isalpha():
            out.append(f"-p{REDACTED}")  # mysql -pPASSWORD (not -p8080, not a word such as -pthread)
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
        elif _AWS_SECRET.fullmatch(arg) and not arg.startswith(("/", ".")) and "//" not in arg:
            out.append(REDACTED)  # a positional AWS secret key (a path this long starts with / or . or has //)
            continue
        out.append(redact_value(arg))
    return out
