"""The watcher process: list+watch Kama resources and nudge their entity workflows."""
