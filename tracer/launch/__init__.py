"""How a traced run starts (``trace run``, ``trace attach``) and how it is finalized."""
