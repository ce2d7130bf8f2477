"""No models: pgqueue's tables are its own (schema `pgqueue`), made by its SQL migrations.

This module exists because Django sends `post_migrate` only to apps that
have one, and that signal is how a newer pgqueue's migrations get applied.
"""
