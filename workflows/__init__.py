"""Kama workflows package."""
