"""Privacy of a trace directory (issue #16): the run folder is its owner's alone, and secrets in every shape a
command line or environment carries them are redacted before anything is written — rings, meta.json, dumps,
samples, events.arrow, verdict.json, report.html."""
from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.helpers import PY, REPO, TRACE, trace_env

# Secrets planted, each unique, in the shapes they come in (argv and environment)
S = {
    "flag_next": "s3cretFlagNextValue9931",
    "flag_eq": "s3cretFlagEqValue7712",
    "short_p": "hunter2-Passw0rd-short-p",
    "short_p_glued": "GluedPw0rd991x",
    "json_arg": "jsonApiKeyValue-5521abc",
    "dict_arg": "dictPasswordValue-8813",
    "json_flag": "jsonTokenInFlag-44x9z",
    "kv_inline": "inlineSecretVal-6620q",
    "bearer": "bearerTok3nValue88123",
    "url_pw": "urlPassw0rdValue771",
    "env_named": "envNamedSecretValue-1212",
    "env_shaped": "hf_EnvShapedTokenValueAbCdEf0123456789",
    "env_json": "envJsonClientSecret-3391",
    "argv_shaped": "ghp_ArgvShapedTokenAbCdEfGhIj0123456789",
}
ARGV = [
    "--api-key", S["flag_next"],
    f"--db-password={S['flag_eq']}",
    "-p", S["short_p"],
    f"-p{S['short_p_glued']}",
    f'conf={{"api_key": "{S["json_arg"]}", "lr": 0.1}}',
    f"opts={{'password': '{S['dict_arg']}', 'epochs': 3}}",
    "--config", f'{{"model": "x", "token": "{S["json_flag"]}"}}',
    f"--extra=user=bob,secret={S['kv_inline']},mode=fast",
    "--header", f"Authorization: Bearer {S['bearer']}",
    f"--store=redis://alice:{S['url_pw']}@cache.internal:6379/0",
    S["argv_shaped"],
]
ENV = {
    "MY_SERVICE_PASSWORD": S["env_named"],
    "SOME_SETTING": S["env_shaped"],
    "APP_CONFIG": json.dumps({"client_secret": S["env_json"], "region": "eu"}),
}

JOB = r'''
import datetime, os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0",
                        timeout=datetime.timedelta(seconds=60))
t = torch.ones(2)
dist.all_reduce(t)
time.sleep(5)          # silent: the watchdog takes a burst (stacks, /proc) and writes a verdict meanwhile
dist.all_reduce(t)
print("job done", flush=True)
'''


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    base = tmp_path_factory.mktemp("privacy")
    job = base / "job.py"
    job.write_text(JOB)
    run_dir = base / "run"
    old = os.umask(0o022)  # the usual default: without care, everything would be world-readable
    try:
        res = subprocess.run(TRACE + ["run", "--keep-rings", "-o", str(run_dir), "--hang-after", "2",
                                      "--startup-hang-after", "60",
                                      "--", PY, str(job), *ARGV], capture_output=True, text=True,
                             env=trace_env(RANKTRACE_STACK_EVERY="1", **ENV), cwd=REPO, timeout=180,
                             stdin=subprocess.DEVNULL)
    finally:
        os.umask(old)
    return run_dir, res


def test_every_planted_secret_is_found_nowhere_in_the_trace(secret_run):
    run_dir, res = secret_run
    assert res.returncode == 0, res.stderr[-3000:]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".ring" for p in files) and any("dumps" in p.parts for p in files), files
    blob = b"".join(p.read_bytes() for p in files)
    found = {k: v for k, v in S.items() if v.encode() in blob}
    print(f"secrets planted: {len(S)}, found in {len(files)} files: {len(found)}")
    assert found == {}, found
    meta = json.loads(next(run_dir.glob("*/meta.json")).read_text())
    assert "--api-key" in meta["command"] and "lr" in " ".join(meta["command"])  # the rest stays readable


def test_the_run_folder_is_owner_only(secret_run):
    """At the default umask the run folder, rings, dumps and meta.json were world-readable: another user read the
    job's stacks and command lines (the agent sockets were already 0600)."""
    run_dir, _ = secret_run
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for p in run_dir.rglob("*"):
        mode = stat.S_IMODE(p.lstat().st_mode)
        if p.suffix in (".ring",) or p.name == "meta.json":
            assert mode & 0o077 == 0, (p, oct(mode))


@pytest.mark.parametrize("arg,secret", [
    ("-p", None), ("conf={\"api_key\": \"abc123xyz\"}", "abc123xyz"), ("{'password': 'pw1234'}", "pw1234"),
    ("x=1,token=tok9876,y=2", "tok9876"), ("Authorization: Bearer abcdefgh12345", "abcdefgh12345"),
    ('{"Secret":"A b"}', "A b"), ("--private-key-file=/etc/k.pem", "/etc/k.pem"),
])
def test_redaction_shapes(arg: str, secret: str | None):
    from ranktrace.tracer.formats import redact

    out = " ".join(redact.redact_argv([arg]))
    if secret is not None:
        assert secret not in out and redact.REDACTED in out, out


@pytest.mark.parametrize("argv,kept", [
    (["-p", "8080:80"], "8080:80"), (["mkdir", "-p", "/tmp/x"], "/tmp/x"), (["-p8080"], "-p8080"),
    (["--max-steps", "10"], "10"), (["model=llama", "lr=0.1"], "lr=0.1"),
])
def test_redaction_keeps_what_is_not_a_secret(argv: list[str], kept: str):
    from ranktrace.tracer.formats import redact

    assert kept in " ".join(redact.redact_argv(argv))


def test_an_exception_named_like_a_secret_is_kept():
    from ranktrace.tracer.formats import redact

    assert redact.redact_value("KeyError: 'boom'") == "KeyError: 'boom'"


def test_short_p_flags_are_redacted():
    from ranktrace.tracer.formats import redact

    out = redact.redact_argv(["mysql", "-p", "hunter2", "-psecretpw9", "-u", "bob"])
    assert "hunter2" not in out and "secretpw9" not in " ".join(out) and "bob" in out


@pytest.mark.parametrize("argv,secret", [
    (["psql-app", "--db-pass", "hunter2"], "hunter2"),          # a flag ending in a PASS word
    (["gpg", "--passphrase=open-sesame"], "open-sesame"),
    (["app", "--db-pw", "s3cr3t"], "s3cr3t"),
    (["app", "postgres://bob:pa/ss9@db:5432/x"], "pa/ss9"),      # a URL password with an unescaped '/'
    (["aws", "configure", "set", "aws_secret_access_key", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"],
     "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),               # a positional AWS secret key
])
def test_secrets_round_three(argv: list[str], secret: str):
    """The shapes trust round 3 found kept (issue #31): each is redacted, the rest of the line stays readable."""
    from ranktrace.tracer.formats import redact

    out = redact.redact_argv(argv)
    assert secret not in " ".join(out) and redact.REDACTED in out[-1], out
    assert out[0] == argv[0]


def test_pass_words_are_secret_names_and_the_working_directory_is_not():
    from ranktrace.tracer.formats import redact

    env = redact.redact_env({"DB_PASS": "a1", "MYSQL_PWD": "b2", "GPG_PASSPHRASE": "c3", "PWD": "/home/u",
                             "OLDPWD": "/tmp", "PASSENGER_COUNT": "3", "PASSTHROUGH": "1"})
    assert [k for k, v in env.items() if v == redact.REDACTED] == ["DB_PASS", "MYSQL_PWD", "GPG_PASSPHRASE"]
    assert redact.redact_argv(["--passenger", "3", "models/Llama3-8B/step1000"]) == [
        "--passenger", "3", "models/Llama3-8B/step1000"]
