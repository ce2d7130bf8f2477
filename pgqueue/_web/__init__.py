"""The web dashboard (`pgqueue web`, docs/dashboard.md); needs pgqueue-py[web]."""
