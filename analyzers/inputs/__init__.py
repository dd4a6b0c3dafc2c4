"""Finding and reading the files: what the paths hold (collect.py), our own run folders (own_records.py),
archives unpacked under bounds (archives.py). The model and the rules never import this package."""
