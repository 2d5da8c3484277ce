"""The command layer: one module per command; each parses its options, calls one function of the layers below and
lets ppprof.cli turn a ValueError into the one-line error."""
