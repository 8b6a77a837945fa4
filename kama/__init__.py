"""Kama's domain without I/O: API types, GGUF inspection, cache layout, planner inputs, settings, CLI."""
