"""Kama gateway package."""
