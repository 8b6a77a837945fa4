"""The runtime supervisor: PID 1 of a serving pod (`kama runtime`)."""
