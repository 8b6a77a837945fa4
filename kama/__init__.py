"""Kama kama package."""
