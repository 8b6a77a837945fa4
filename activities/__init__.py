"""Kama activities package."""
