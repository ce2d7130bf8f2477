"""Integrations with frameworks, each an optional extra (`pgqueue-py[django]`)."""
