"""Repository-only tools for the course's authors (not shipped with the package)."""
