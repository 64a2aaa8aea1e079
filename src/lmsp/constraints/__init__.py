"""Constrained decoding: JSON Schemas and tool calls as per-sequence token masks
(llguidance). :mod:`.grammar` compiles (pure, checked when a request arrives),
:mod:`.matcher` runs a compiled grammar against a loaded model's vocabulary."""
