"""Example applications that the compose deployment runs (compose/docker-compose.yml)."""
