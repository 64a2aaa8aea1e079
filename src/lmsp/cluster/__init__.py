"""Nodes on a shared database (leases, the rescuer) and the head start of `lmsp serve`."""
