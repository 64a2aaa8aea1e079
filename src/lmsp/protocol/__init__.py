"""The wire protocol, pure and I/O-free: task states, event names, the objects lmsp
renders (responses, tasks, output items) and the output assembler that turns typed
engine outputs into events and output items.

Everything above (store, runner, API, client, CLI) takes these from here, so there is
one source of truth for states, terminal events and shapes.
"""
