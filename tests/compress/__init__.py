"""Compression: the zoo against its definitions, error feedback and the outer loops against
one-process references, the authors' code, adding a compressor, bad settings, recipes' resume."""
