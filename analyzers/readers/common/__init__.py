"""What several readers share: rank inference from names and prefixes (:mod:`.ranks`), the torch text families'
speaker and leader handling (:mod:`.torch_text`) and the one thread/stack record every stack reader builds
(:mod:`.stacks`). The shared text opener is :mod:`analyzers.readers.text`."""
