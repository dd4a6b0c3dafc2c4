"""The analysis model: built once from the readers' records, before any rule (build.py), and the plain values
the analysis hands out (values.py). Nothing here reads files or imports a reader."""
