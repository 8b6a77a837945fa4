"""Test and benchmark helpers that build inputs locally, so no test needs the network."""
