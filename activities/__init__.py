"""Temporal activities: one class per external system (Kubernetes, Hugging Face, volumes, Temporal)."""
