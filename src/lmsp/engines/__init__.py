"""Engines: a small interface that loads a model and yields tokens."""
