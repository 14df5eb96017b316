"""Adapters: the only places that touch the host (files under an injectable root, commands)."""
