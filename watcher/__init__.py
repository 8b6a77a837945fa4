"""Kama watcher package."""
