"""`python -m ranktrace ...` is the `ranktrace` / `trace` command (where the console scripts are not on PATH)."""
from ranktrace.cli import main

if __name__ == "__main__":
    main(prog_name="ranktrace")
