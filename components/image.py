"""The one container image every component runs in (built from images/; keep the tag in step)."""

IMAGE = "ghcr.io/ac2/ac2-cpu:0.1.0"
